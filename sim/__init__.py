"""gpipe-sim's simulator, in layers; each imports only the layers listed before it (tests/test_imports.py checks).

    sim.core         the discrete-event simulator: devices, compute and copy streams, links, memory, a cost per
                     task; it knows schedules and timelines (gpipe.schedule, gpipe.timeline), nothing of the executor
    sim.calibration  measures the executor (gpipe) on this machine and turns what it measures into the core's costs:
                     the experiment behind ``gpipe-sim demo`` and ``compare``, and its outcome
    sim.planning     FLOP counting, the hardware catalog, built-in models and capacity-planning sweeps
    sim.cli          the ``gpipe-sim`` command line on top of all three

:mod:`sim.files` (output folders that never overwrite a user's files unasked) serves every layer that writes.
"""
