"""The simulator's core: a schedule on a cost model, simulated as devices with compute and copy streams.

It knows devices, streams, links, memory and what each task costs (:mod:`sim.core.cost`), and returns the
same :class:`gpipe.timeline.Timeline` the executor records. It knows nothing of how the executor runs:
calibration (:mod:`sim.calibration`) turns measurements into costs this layer consumes.
"""
