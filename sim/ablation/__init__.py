"""The torchgpipe paper's U-Net ablation (Kim et al., 2020), the study ``docs/ablation.md`` tells.

:mod:`~sim.ablation.study` simulates its steps; :mod:`~sim.ablation.counted` fills their costs from the counted U-Net
on the catalog's P40.
"""
