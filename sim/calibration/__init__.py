"""Calibration: measure the executor on this machine and turn the measurements into the core's costs.

The executor's primitives and partitions are timed (:mod:`~sim.calibration.primitives`,
:mod:`~sim.calibration.calibrate`), with how stages slow each other on shared cores
(:mod:`~sim.calibration.pairs`) and what the worker threads cost around each stage
(:mod:`~sim.calibration.thread_costs`); a recorded step's bytes per task become each stage's saved bytes
(:mod:`~sim.calibration.held_bytes`); :mod:`~sim.calibration.experiment` runs predicted against measured end
to end as :mod:`~sim.calibration.experiment_setup` says, and :mod:`~sim.calibration.outcome` is what it produced.
"""
