"""The bytes autograd saves for backward, counted one way for the profiler, the recorder and the simulator.

Note [saved bytes]: every tensor autograd saves passes through the pack hook. Tensors sharing storage
with the model state (a block's parameters and buffers) are not activations, and are left out; the rest
are counted by the bytes of storage they cover, each byte once, however many ops save a view of it
(ReLU's output and the next Linear's input are one tensor).

Note [no cycle through the hook]: a pack hook that hands back the tensor it was given makes a cycle when
the op saves its own output (ReLU does): the output's ``grad_fn`` holds the saved value, which is the
output itself, through C++ references Python's collector cannot see. A graph that is never run backward
(a forward timed alone, a step abandoned after an error) then lives for ever, and code that measures
such forwards over and over leaks a graph each time. :class:`SavedBytes` hands back a detached alias instead (the
same storage and version counter, no ``grad_fn``), so a dropped graph is freed at once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SavedBytes", "storage_key"]


class SavedBytes:
    """Counts the bytes a grad-enabled forward saves for backward (Note [saved bytes]).

    ``with counter.hooks():`` installs the pack hook (and an unpack hook that returns the tensor);
    :attr:`nbytes` is what the forwards run inside kept, each byte of storage once. The profiler
    (:mod:`gpipe.profiling.profile`) and the executor's recorder (:mod:`gpipe.interpreter.recorder`) count with this one
    class.

    Args:
        block: the module whose parameters and buffers are model state, not saved activations; or
            the set of their :func:`storage_key`\\ s.
    """

    def __init__(self, block: nn.Module | set[tuple[str, int]]) -> None:
        self.model_state = block if isinstance(block, set) else {
            storage_key(t) for t in [*block.parameters(), *block.buffers()]}
        self.spans: dict[tuple[str, int], list[tuple[int, int]]] = {}

    def pack(self, t: Tensor) -> Tensor:
        key = storage_key(t)
        if key not in self.model_state and t.numel() > 0:
            self.spans.setdefault(key, []).append(_byte_span(t))
        return t.detach()  # Note [no cycle through the hook]

    def hooks(self) -> Any:
        """The context manager of both hooks."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack)

    @property
    def nbytes(self) -> int:
        return sum(_union_length(s) for s in self.spans.values())


def storage_key(t: Tensor) -> tuple[str, int]:
    """Which storage ``t`` views: its device and the storage's address (every view of one storage has the same
    key), as :class:`SavedBytes` tells model state from activations."""
    return str(t.device), t.untyped_storage().data_ptr()


def _unpack(t: Tensor) -> Tensor:
    return t


def _byte_span(t: Tensor) -> tuple[int, int]:
    """The bytes ``[start, end)`` of its storage that a tensor covers (strides included)."""
    extent = 1 + sum((int(size) - 1) * int(stride) for size, stride in zip(t.shape, t.stride(), strict=True))
    start = int(t.storage_offset()) * t.element_size()
    return start, start + extent * t.element_size()


def _union_length(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, -1
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total
