"""Parallelism: the layout of a configuration, where its groups sit, and what each dimension adds to a step and memory.

:class:`~sim.planning.parallel.configurations.Configuration` is the one layout (tensor, context, pipeline and data
parallel, ZeRO, recompute, schedule); :mod:`~sim.planning.parallel.cluster` puts its GPUs on nodes and
:mod:`~sim.core.rings` prices a group's ring on their links. :mod:`~sim.planning.parallel.zero`,
:mod:`~sim.planning.parallel.replicas`, :mod:`~sim.planning.parallel.context_parallel` and
:mod:`~sim.planning.parallel.recompute` price their dimension, :mod:`~sim.planning.parallel.partition` balances the
pipeline's stages and :mod:`~sim.planning.parallel.memory` gives each device's peak.
"""
