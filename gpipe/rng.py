"""Random state under pipelining: dropout draws the same numbers in a checkpointed forward and its recompute.

Note [random state]: torchgpipe saves the random state before a checkpointed forward and restores it
for the recompute. With one worker thread per device that does not work on CPU devices: all CPU
workers share one generator, so what a worker draws depends on what the others drew meanwhile, and
restoring the state on one thread rewinds the others. Instead, every *stochastic layer* (the dropout
family, ``RReLU``, and any layer with ``gpipe_stochastic = True``) draws from a generator seeded, just
for that call, with a seed derived from ``(step seed, micro-batch, stage, layer)``: the forward and its
recompute see identical numbers whatever the other threads do, and a checkpointed run draws exactly
what an uncheckpointed one does. The step seed comes from the global generator (CPU) at the start of
each training step, so ``torch.manual_seed`` makes a whole run reproducible.

The seeded call holds a process-wide lock around the layer's forward (the global generator is
shared), so stochastic layers of different workers take turns; other layers run in parallel. A layer
that draws random numbers without being marked is not covered: set ``layer.gpipe_stochastic = True``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["install", "is_stochastic", "seeded"]

_STOCHASTIC: tuple[type[nn.Module], ...] = (nn.modules.dropout._DropoutNd, nn.RReLU)
_lock = threading.RLock()
_local = threading.local()
_MASK = (1 << 63) - 1


def is_stochastic(layer: nn.Module) -> bool:
    return isinstance(layer, _STOCHASTIC) or bool(getattr(layer, "gpipe_stochastic", False))


@contextmanager
def seeded(step_seed: int, microbatch: int, stage: int) -> Iterator[None]:
    """Within this block (on this thread), stochastic layers draw from seeds of this task."""
    previous = getattr(_local, "task", None)
    _local.task = (step_seed, microbatch, stage)
    try:
        yield
    finally:
        _local.task = previous


def install(partition: nn.Module) -> list[RemovableHandle]:
    """Hook every stochastic layer of ``partition``; the hooks do nothing outside :func:`seeded`."""
    handles: list[RemovableHandle] = []
    for index, layer in enumerate(partition.modules()):
        if is_stochastic(layer):
            handles.append(layer.register_forward_pre_hook(_pre_hook(index)))
            handles.append(layer.register_forward_hook(_post_hook, always_call=True))
    return handles


def _pre_hook(index: int) -> Any:
    def hook(layer: nn.Module, args: Any) -> None:
        task = getattr(_local, "task", None)
        if task is None:
            return
        step_seed, i, j = task
        seed = hash((step_seed, i, j, index)) & _MASK
        _lock.acquire()
        try:
            saved = [(torch.default_generator, torch.default_generator.get_state())]
            torch.default_generator.manual_seed(seed)
            for device in {p.device for p in layer.parameters()} | _devices_of(args):
                if device.type == "cuda":
                    generator = torch.cuda.default_generators[device.index or 0]
                    saved.append((generator, generator.get_state()))
                    generator.manual_seed(seed)
            stack = getattr(_local, "saved", [])
            stack.append(saved)
            _local.saved = stack
        except BaseException:
            _lock.release()
            raise

    return hook


def _post_hook(layer: nn.Module, args: Any, output: Any) -> None:
    stack = getattr(_local, "saved", None)
    if getattr(_local, "task", None) is None or not stack:
        return
    try:
        for generator, state in reversed(stack.pop()):
            generator.set_state(state)
    finally:
        _lock.release()


def _devices_of(args: Any) -> set[torch.device]:
    return {a.device for a in args if isinstance(a, torch.Tensor)}
