"""What a pipeline measures: each layer or block before a run, each task during one.

::

    profiling/
      profile.py    profile_blocks(): per-block forward and backward times and bytes (balancing, calibration)
      session.py    one profiling session: a sample through the blocks in order, each on its own input
      timing.py     the timed passes: medians over repeats after warm-up
      recorder.py   Recorder: a step's spans, host clock on CPU and CUDA events on streams, into a Timeline
"""
