"""The autograd machinery a pipeline needs beyond ``loss.backward()``.

::

    autograd/
      split_backward.py  the backward split into B (input gradients) and W (weight gradients)
      rng.py             random state: a recompute draws what its forward drew; the same numbers on any executor
      saved.py           saved tensors counted as autograd packs them
      preserved.py       a module run in training mode and left as found (profiling, calibration)
      phase.py           is_checkpointing() and is_recomputing(): the thread-local phase flags
      gradients.py       gradients only where the caller asked for them
"""
