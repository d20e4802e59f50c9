"""Planning: costs from FLOP counts on a hardware catalog, built-in models, and sweeps that rank configurations.

:mod:`~sim.planning.flops` counts a model on the ``meta`` device, :mod:`~sim.planning.hardware` holds real
devices and links with their sources, :mod:`~sim.planning.costs_from_flops` divides one by the other into a
cost model, and :mod:`~sim.planning.plan` sweeps the pipeline configurations a
:class:`~sim.planning.request.PlanRequest` asks for through the core simulator.
"""
