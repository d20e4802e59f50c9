"""Counting: a model's FLOPs and bytes per operator, counted on the ``meta`` device, and the built-in models.

:mod:`~sim.planning.counting.flops` runs each layer under :mod:`~sim.planning.counting.operators`' recorder into the
tables of :mod:`~sim.planning.counting.counts`; :mod:`~sim.planning.counting.tensor_parallel` adds the collectives a
tensor-parallel shard runs, :mod:`~sim.planning.counting.expert_parallel` the all-to-alls of a mixture of experts,
:mod:`~sim.planning.counting.fp8` the casts of FP8 training, and :mod:`~sim.planning.counting.training` the bytes of
model state per parameter. :mod:`~sim.planning.counting.models` holds the models the planner names (GPT, Llama,
Nemotron, DeepSeek, Mixtral, Qwen3, ResNet, U-Net, AmoebaNet).
"""
