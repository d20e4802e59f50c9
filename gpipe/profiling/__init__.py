"""What a pipeline measures before a run: each layer or block, for balancing and calibration.

::

    profiling/
      profile.py    profile_blocks(): per-block forward and backward times and bytes (balancing, calibration)
      session.py    one profiling session: a sample through the blocks in order, each on its own input
      timing.py     the timed passes: medians over repeats after warm-up

What a step records as it runs is the interpreter's (:mod:`gpipe.interpreter.recorder`).
"""
