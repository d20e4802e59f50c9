"""Planning: sweeps that rank configurations, on rooms that count, price and lay out a model.

Each room imports only those listed before it (Note [planning rooms] in ``tests/test_imports.py``)::

    counting   a model's FLOPs and bytes, counted on the ``meta`` device, and the built-in models
    hardware   devices, links and systems with their sources, and their rooflines
    parallel   the layout of a configuration, its groups on nodes and links, and what each dimension adds
    costs      a count priced on a device (the core's cost model), and this machine's roofline measured

The planner itself is this package's own modules: :mod:`~sim.planning.plan` sweeps the configurations a
:class:`~sim.planning.request.PlanRequest` asks for (:mod:`~sim.planning.sweep`) through the core simulator into
rows (:mod:`~sim.planning.rows`).
"""
