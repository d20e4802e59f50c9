"""Run a module in training mode and leave it as found: gradients, buffers, counters and training flags.

The profiler (:mod:`gpipe.profiling.profile`) and the simulator's calibration (``sim.calibration.thread_costs``,
``sim.calibration.pairs``,
``sim.calibration.primitives``) run the same partitions again and again; each run is wrapped in :func:`preserved`
(Note [no side effects] in :mod:`gpipe.profiling.session`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["preserved"]


@contextmanager
def preserved(block: nn.Module) -> Iterator[None]:
    """Run ``block`` in training mode and leave it as found (Note [no side effects]).

    On entry the gradients, buffers, plain numeric attributes and training flags of ``block`` and its
    submodules are saved, its parameters' gradients cleared and ``block.train()`` called; on exit, even
    after an error, all of them are restored in place. The random state is not this context's: callers
    that draw fork it themselves. Used by the profiler and by the simulator's calibration
    (``sim.calibration.thread_costs``, ``sim.calibration.pairs``, ``sim.calibration.primitives``), which run the same
    partitions again and again.
    """
    grads = [(p, p.grad) for p in block.parameters()]
    modules = list(block.modules())
    scalars = [(m, {k: v for k, v in vars(m).items() if isinstance(v, (bool, int, float))}) for m in modules]
    buffers = [(m, {k: (b, None if b is None else b.detach().clone()) for k, b in m._buffers.items()})
               for m in modules]
    for p, _ in grads:
        p.grad = None
    block.train()
    try:
        yield
    finally:
        with torch.no_grad():
            for m, saved in buffers:
                for name, (original, value) in saved.items():
                    if original is not None and value is not None:
                        original.copy_(value)
                    m._buffers[name] = original
        for m, attrs in scalars:
            for k, v in attrs.items():
                setattr(m, k, v)
        for p, g in grads:
            p.grad = g
