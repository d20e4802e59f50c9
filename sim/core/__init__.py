"""The simulator's core: a schedule on a cost model, simulated as devices with compute and copy streams.

It knows devices, streams, links, memory and what each task costs (:mod:`sim.core.cost`), and returns the
same :class:`gpipe.schedule.timeline.Timeline` the executor records. It knows nothing of how the executor runs: what a
runner adds reaches it through :class:`sim.core.cost.RunnerCosts`, which calibration (:mod:`sim.calibration`)
implements for this project's executor. :func:`sim.core.engine.simulate` is the entry point, its switches
:class:`sim.core.config.SimConfig`.
"""
