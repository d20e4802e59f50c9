"""The profiler's walk through blocks of layers: each placed on its device, fed the previous block's output and sized.

A sample flows through the blocks in order, block ``k`` receiving block ``k - 1``'s output, and each
block is measured alone on a detached copy of its input (the diagram in :mod:`gpipe.profiling.profile`).
:func:`profile_sizes` returns only the bytes (:class:`BlockSizes`); the timed runs are
:mod:`gpipe.profiling.timing`'s.

Note [saved bytes per block]: each block's saved bytes are counted by :class:`gpipe.autograd.saved.SavedBytes`
(Note [saved bytes] there), each block on its own, as if it ran on its own device: summing single layers
may count a boundary tensor twice, once in each layer that keeps it.

Note [no side effects]: blocks are profiled in place, in training mode, and left as found: gradients,
buffers (BatchNorm's running statistics), plain numeric attributes (counters such as
``DeferredBatchNorm``'s pending micro-batches), every module's training flag, and the CPU and CUDA
random state are saved first and restored after. Every run gets a fresh clone of its input (made
outside the timed region), so in-place layers neither fail on a leaf nor change the next run's input.
A block that is not on the requested ``device`` is profiled as a deep copy moved there, held until
the profile is done.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gpipe.autograd.preserved import preserved
from gpipe.autograd.saved import SavedBytes
from gpipe.skip.skippable import SkipKey, use_tracker

__all__ = ["BlockSizes", "Device", "TensorOrTensors", "profile_sizes"]

Device = torch.device | str | int
TensorOrTensors = Tensor | tuple[Tensor, ...]


@dataclass(frozen=True)
class BlockSizes:
    """Bytes of one block for one input (:mod:`gpipe.profiling.profile` says what each counts)."""

    output_bytes: int
    saved_bytes: int
    input_bytes: int
    parameter_bytes: int
    gradient_bytes: int


def profile_sizes(blocks: Sequence[nn.Module], sample: TensorOrTensors, *,
                  device: Device | Sequence[Device] | None = None) -> list[BlockSizes]:
    """Only the bytes of :func:`gpipe.profiling.profile.profile_blocks`: one forward per block, nothing timed.

    Args:
        blocks: as for :func:`gpipe.profiling.profile.profile_blocks`.
        sample: as for :func:`gpipe.profiling.profile.profile_blocks`.
        device: as for :func:`gpipe.profiling.profile.profile_blocks`.

    Returns:
        One :class:`BlockSizes` per block.

    Raises:
        ValueError: no blocks, or a device list of the wrong length.
        TypeError: an input or output that is not a tensor or a tuple of tensors.
    """
    with _session(blocks, sample, device) as steps:
        return [step.sizes for step in steps]


# --- the walk through the blocks ------------------------------------------------------------------

@dataclass(frozen=True)
class _Step:
    """One block ready to run: placed on its device, with its leaf inputs and its measured sizes."""

    block: nn.Module
    device: torch.device
    inputs: tuple[Tensor, ...]
    atomic: bool  # the input is one tensor, not a tuple
    sizes: BlockSizes


@contextmanager
def _session(blocks: Sequence[nn.Module], sample: TensorOrTensors,
             device: Device | Sequence[Device] | None) -> Iterator[list[_Step]]:
    """Place, size and chain every block; on exit leave every block as found (:func:`preserved`)."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("nothing to profile: no blocks")
    devices = _devices(len(blocks), device)
    atomic, inputs = _as_tuple(sample, "the sample")
    inputs = tuple(t.detach().requires_grad_(t.requires_grad and t.is_floating_point()) for t in inputs)
    cuda = sorted({d for d in devices if d is not None and d.type == "cuda"} |
                  {t.device for b in blocks for t in _state(b) if t.device.type == "cuda"}, key=str)
    with ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=cuda, enabled=True))
        stack.enter_context(use_tracker(_ProfileTracker()))
        steps = []
        for block, wanted in zip(blocks, devices, strict=True):
            if wanted is not None and not {t.device for t in _state(block)} <= {wanted}:
                block = copy.deepcopy(block).to(wanted)
            dev = wanted or _device_of(block) or (inputs[0].device if inputs else torch.device("cpu"))
            inputs = tuple(t.detach().to(dev).requires_grad_(t.requires_grad) for t in inputs)
            stack.enter_context(preserved(block))
            sizes, (out_atomic, outputs) = _measure_sizes(block, inputs, atomic)
            steps.append(_Step(block, dev, inputs, atomic, sizes))
            atomic = out_atomic
            inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in outputs)
        yield steps


class _ProfileTracker:
    """Skip connections while blocks are profiled one at a time, each run many times.

    A pop returns the latest stash of its name as a fresh leaf, every time it runs: the popping block is
    timed with its skip input (and the gradient it sends back) but apart from the stashing block's graph.
    """

    def __init__(self) -> None:
        self.table: dict[SkipKey, Tensor] = {}

    def save(self, key: SkipKey, tensor: Tensor) -> None:
        self.table[key] = tensor.detach()

    def load(self, key: SkipKey) -> Tensor:
        if key not in self.table:
            raise RuntimeError(f"pop({key[1]!r}) before any stash({key[1]!r}): the layer that stashes it must come "
                               "first in the module")
        value = self.table[key]
        return value.detach().requires_grad_(value.is_floating_point())


def _devices(count: int, device: Device | Sequence[Device] | None) -> list[torch.device | None]:
    if device is None:
        return [None] * count
    if isinstance(device, (torch.device, str, int)):
        return [_normalize(device)] * count
    devices: list[torch.device | None] = [_normalize(d) for d in device]
    if len(devices) != count:
        raise ValueError(f"{len(devices)} devices for {count} blocks; give one per block, or one")
    return devices


def _normalize(device: Device) -> torch.device:
    """``"cuda"`` means the current CUDA device, so that it compares equal to a tensor's ``cuda:0``."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _device_of(block: nn.Module) -> torch.device | None:
    return next((t.device for t in _state(block)), None)


def _state(block: nn.Module) -> Iterator[Tensor]:
    yield from block.parameters()
    yield from block.buffers()


def _as_tuple(value: Any, what: str) -> tuple[bool, tuple[Tensor, ...]]:
    if isinstance(value, Tensor):
        return True, (value,)
    if isinstance(value, tuple) and all(isinstance(t, Tensor) for t in value):
        return False, value
    raise TypeError(f"{what} must be a tensor or a tuple of tensors, got {type(value).__name__}")


def _fresh(leaves: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Clones to feed a block: an in-place first layer then neither fails on a leaf nor edits ``leaves``."""
    return tuple(t.clone() for t in leaves)


def _call(block: nn.Module, inputs: tuple[Tensor, ...], atomic: bool) -> tuple[bool, tuple[Tensor, ...]]:
    return _as_tuple(block(inputs[0] if atomic else inputs), f"the output of {type(block).__name__}")


def _nbytes(tensors: Sequence[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# --- sizes ----------------------------------------------------------------------------------------

def _measure_sizes(block: nn.Module, inputs: tuple[Tensor, ...], atomic: bool
                   ) -> tuple[BlockSizes, tuple[bool, tuple[Tensor, ...]]]:
    counter = SavedBytes(block)
    # Fresh leaves, as in every timed run, so the hook sees exactly what a timed forward saves.
    leaves = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
    with torch.enable_grad(), counter.hooks():
        output = _call(block, _fresh(leaves), atomic)
    params = list(block.parameters())
    sizes = BlockSizes(
        output_bytes=_nbytes(output[1]),
        saved_bytes=counter.nbytes,
        input_bytes=_nbytes(inputs),
        parameter_bytes=_nbytes(params) + _nbytes(list(block.buffers())),
        gradient_bytes=_nbytes([p for p in params if p.requires_grad]),
    )
    return sizes, output
