"""Peak memory per device as PyTorch's CUDA caching allocator reserves it, for one schedule and its stage costs.

What decides "does it fit" is the allocator's peak, not the bytes saved for backward alone. Per device, while each
task of its list runs (Note [peak as the allocator sees it])::

    parameters + optimizer state + gradients accumulated so far      (model state)
  + bytes saved for backward                                         (Note [saved bytes] in gpipe.schedule.saved)
  + the running task's working set: the largest layer input plus the output it allocates (its gradients in B,
    and the weight gradient autograd makes before adding it into ``.grad``: Note [accumulated weight gradients])
  + the library's workspace
    rounded as the caching allocator rounds (Note [allocator rounding])
  + with torchgpipe's copy streams, what each micro-batch's stream keeps reserved (Note [a copy stream per
    micro-batch])

The peak is over the device's task order, the saved-bytes rule applied in that order, so it is the peak over the
step and never a sum of maxima.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from gpipe.schedule import Schedule, Task
from gpipe.schedule.saved import Held, held_bytes, held_while_running, task_arrays
from sim.core.cost import StageCost
from sim.core.tables import B, W
from sim.planning.counting.counts import ModelProfile

__all__ = ["BLOCK_BYTES", "COPY_STREAMS", "SEGMENT_BYTES", "MemoryParts", "copy_stream_bytes", "device_memory",
           "round_block", "round_segment", "stage_backward_working_bytes", "stage_working_bytes", "workspace_bytes"]

MiB = 2**20
# Note [allocator rounding]: PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) rounds every
# request up to a multiple of kMinBlockSize = 512 bytes, and reserves memory from the device in segments: 2 MiB
# (kSmallBuffer) for requests up to 1 MiB, 20 MiB (kLargeBuffer) for 1 to 10 MiB, and multiples of kRoundLarge =
# 2 MiB above. We round each part of a stage to 512-byte blocks and the device's total up to a whole 2 MiB; freed
# blocks stay cached and are reused, so reserved tracks the peak of allocated. Fragmentation (a cached block too
# small for the next request) is not modelled: the rule is a lower bound on reserved bytes, not an upper one.
BLOCK_BYTES = 512
SEGMENT_BYTES = 2 * MiB
# cuBLAS's workspace, taken from the caching allocator once per handle and stream: PyTorch's default
# CUBLAS_WORKSPACE_CONFIG is ":4096:8" (32 MiB) on Hopper and ":4096:2:16:8" (8 MiB + 128 KiB) before it
# (aten/src/ATen/cuda/CublasHandlePool.cpp). cuDNN's convolution workspace varies by algorithm and is not modelled.
_HOPPER = ("h100", "h200")
#: Where copies onto a device are allocated: ``shared`` (this project's executor: one copy stream per device, its
#: blocks counted with the saved bytes) or ``per_microbatch`` (torchgpipe: Note [a copy stream per micro-batch]).
COPY_STREAMS = ("shared", "per_microbatch")


def round_block(nbytes: float) -> int:
    """``nbytes`` rounded up to a whole 512-byte block (Note [allocator rounding])."""
    n = max(int(-(-nbytes // 1)), 0)
    return -(-n // BLOCK_BYTES) * BLOCK_BYTES


def round_segment(nbytes: int) -> int:
    """``nbytes`` rounded up to whole 2 MiB segments (Note [allocator rounding])."""
    return -(-nbytes // SEGMENT_BYTES) * SEGMENT_BYTES


def workspace_bytes(device: str) -> int:
    """cuBLAS's default workspace on the catalog device ``device``; none on a CPU."""
    if device == "cpu":
        return 0
    return 32 * MiB if device.startswith(_HOPPER) else 8 * MiB + 128 * 1024


def stage_working_bytes(profile: ModelProfile, balance: Sequence[int], microbatch: int,
                        gradient_bytes: int = 0) -> list[int]:
    """Each stage's working set for one micro-batch: the largest ``input + new output`` over its layers, plus
    ``gradient_bytes`` per parameter of the layer (Note [accumulated weight gradients]).

    While a layer runs forward its input and the output it allocates are both live (a tuple's skips passed through
    count once, in the input); its backward holds the gradients of the same two. What the layer saves for backward
    is counted apart (Note [saved bytes] in :mod:`gpipe.schedule.saved`).
    """

    def at(q: tuple[float, float]) -> float:
        return max(q[0] + q[1] * microbatch, 0.0)

    out, start = [], 0
    for size in balance:
        layers = profile.layers[start:start + size]
        out.append(round_block(max(at(x.input_bytes) + at(x.output_bytes if x.new_output_bytes is None
                                                          else x.new_output_bytes) + x.parameters * gradient_bytes
                                   for x in layers)))
        start += size
    return out


# Note [accumulated weight gradients]: when a parameter's ``.grad`` exists (every backward of a stage after its first
# in a step, or every one when gradients are not reset to None), autograd's AccumulateGrad adds the new gradient in
# place, so the layer's whole weight gradient is allocated before it is added and freed. A backward's working set is
# then its layer's input and output gradients plus that layer's weight gradient; the first backward of a stage
# instead keeps the gradient it makes as ``.grad`` (counted in ``gradients``).
def stage_backward_working_bytes(profile: ModelProfile, balance: Sequence[int], microbatch: int,
                                 gradient_bytes: int) -> list[int]:
    """Each stage's backward working set when ``.grad`` exists: the largest ``input + new output + weight gradient``.

    ``gradient_bytes``: bytes per parameter of a gradient (Note [accumulated weight gradients]).
    """
    return stage_working_bytes(profile, balance, microbatch, gradient_bytes)


# Note [a copy stream per micro-batch]: torchgpipe copies micro-batch i onto a device on a stream of its own
# (``copy_streams[j][i]``): the stage input in the forward, the gradient of the stage output in the backward (both
# live at B(i, j)). PyTorch's caching allocator only reuses a cached block on the stream that allocated it, so each
# of the m streams keeps its own reservation, ``input + output gradient`` rounded up to whole 2 MiB, and these add
# over micro-batches instead of being reused. From the second step on every one is reserved from the start, so the
# sum is counted at every task; a checkpointed input is counted there and not again in ``saved``.
def copy_stream_bytes(schedule: Schedule, stages: Sequence[StageCost], scales: Sequence[float] = ()) -> list[int]:
    """Per device, the bytes its per-micro-batch copy streams keep reserved (Note [a copy stream per micro-batch])."""
    n, placement = schedule.n, schedule.placement
    out = []
    for d in range(schedule.num_devices):
        received = [(j > 0 and placement[j - 1] != d, j < n - 1 and placement[j + 1] != d) for j in range(n)]
        total = 0
        for i in range(schedule.m):
            scale = scales[i] if scales else 1.0
            stream = sum(round_block(stages[j].checkpoint_bytes * scale) * fwd
                         + round_block(stages[j].send_bytes * scale) * bwd
                         for j in schedule.stages_on(d) for fwd, bwd in [received[j]])
            total += round_segment(stream)
        out.append(total)
    return out


@dataclass(frozen=True)
class MemoryParts:
    """One device's memory at its peak, in bytes, part by part.

    Attributes:
        parameters: weights of its stages (a 16-bit copy and the 32-bit master in mixed precision).
        optimizer: optimizer state of its stages.
        gradients: the gradients its stages had accumulated by then (a stage's appear with its first backward).
        saved: bytes saved for backward then, as the simulator holds them.
        working: the working set of the task then running.
        workspace: the library's workspace (cuBLAS).
        rounding: what the allocator's rounding adds (Note [allocator rounding]).
        task: the task running at the peak (``"B(3,1)"``), ``""`` before the first.
        copies: what per-micro-batch copy streams keep reserved (Note [a copy stream per micro-batch]); 0 with
            a shared copy stream.
    """

    parameters: int
    optimizer: int
    gradients: int
    saved: int
    working: int
    workspace: int
    rounding: int
    task: str = ""
    copies: int = 0

    @property
    def model_state(self) -> int:
        return self.parameters + self.optimizer + self.gradients

    @property
    def total(self) -> int:
        return self.model_state + self.saved + self.working + self.workspace + self.rounding + self.copies

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model_state": self.model_state, "total": self.total}


# Note [peak as the allocator sees it]: each device's list is replayed in task order (the saved bytes depend on that
# order alone, not on the times: gpipe.schedule.saved.held_while_running), and the peak is taken while each task
# runs: after an F's or an R's own hold, before a B's or a W's free. A stage's gradients count from its first B (its
# first W when the backward is split), when autograd allocates them; the workspace from the first task. Saved bytes
# and working sets scale with an uneven last micro-batch as the simulator's do.
def device_memory(schedule: Schedule, stages: Sequence[StageCost], working: Sequence[int], workspace: int = 0,
                  scales: Sequence[float] = (), backward_working: Sequence[int] = (),
                  copy_streams: str = "shared") -> list[MemoryParts]:
    """The peak of each device of ``schedule`` as the allocator sees it (Note [peak as the allocator sees it]).

    Args:
        schedule: what runs where, in which order.
        stages: one :class:`StageCost` per stage (its saved, checkpoint and weight bytes, and model state).
        working: each stage's working set per micro-batch (:func:`stage_working_bytes`).
        workspace: bytes of the library's workspace per device (:func:`workspace_bytes`).
        scales: per micro-batch factor on saved bytes and working sets (an uneven last chunk); ``()``: all 1.
        backward_working: each stage's working set in a backward that accumulates into ``.grad``
            (:func:`stage_backward_working_bytes`); ``()``: ``working``.
        copy_streams: one of :data:`COPY_STREAMS` (Note [a copy stream per micro-batch]).

    Raises:
        ValueError: ``stages``, ``working`` or ``backward_working`` does not have one entry per stage, or an
            unknown ``copy_streams``.
    """
    n = schedule.n
    if len(stages) != n or len(working) != n or len(backward_working) not in (0, n):
        raise ValueError(f"the schedule has {n} stages but got {len(stages)} stage costs, {len(working)} working "
                         f"sets and {len(backward_working)} backward working sets; give one of each per stage")
    if copy_streams not in COPY_STREAMS:
        raise ValueError(f"copy_streams must be one of {', '.join(COPY_STREAMS)}, got {copy_streams!r}")
    accumulating = list(backward_working) if backward_working else list(working)
    devices = schedule.num_devices
    split = schedule.splits_weight_gradient
    checkpointed = [schedule.is_checkpointed(i) for i in range(schedule.m)]
    copies = [0] * devices
    if copy_streams == "per_microbatch":
        copies = copy_stream_bytes(schedule, stages, scales)
        # Note [a copy stream per micro-batch]: a received checkpointed input lives on its copy stream
        stages = [replace(s, checkpoint_bytes=0) if j > 0 and schedule.placement[j - 1] != schedule.placement[j]
                  else s for j, s in enumerate(stages)]
    scale = np.asarray(scales, dtype=np.float64) if scales else None
    held = held_bytes(checkpointed, split, [s.saved_bytes for s in stages], [s.checkpoint_bytes for s in stages],
                      [s.weight_bytes for s in stages], scales)
    working_a = np.asarray(working, dtype=np.float64)
    accumulating_a = np.asarray(accumulating, dtype=np.float64)
    grad_bytes = np.array([round_block(s.gradient_bytes) for s in stages], dtype=np.int64)
    grad_code = W if split else B
    out = []
    for d in range(devices):
        mine = schedule.stages_on(d)
        params = sum(round_block(stages[j].parameter_bytes) for j in mine)
        optimizer = sum(round_block(stages[j].optimizer_bytes) for j in mine)
        tasks = schedule.tasks[d]
        if not tasks:
            rounding = round_segment(params + optimizer) - params - optimizer
            out.append(MemoryParts(params, optimizer, 0, 0, 0, 0, rounding, copies=copies[d]))
            continue
        k = _replay(tasks, held, scale, working_a, accumulating_a, grad_bytes, grad_code)
        raw = params + optimizer + k.gradients + k.saved + k.live + workspace
        at = int(np.argmax(raw))  # the first of the largest, as the allocator first reaches it
        total = int(raw[at])
        out.append(MemoryParts(params, optimizer, int(k.gradients[at]), int(k.saved[at]), int(k.live[at]), workspace,
                               round_segment(total) - total, str(tasks[at]), copies[d]))
    return out


@dataclass(frozen=True)
class _Replayed:
    """Per task of one device, while it runs: gradients accumulated, bytes saved, its working set."""

    gradients: np.ndarray
    saved: np.ndarray
    live: np.ndarray


def _replay(tasks: tuple[Task, ...], held: Held, scale: np.ndarray | None, working: np.ndarray,
            accumulating: np.ndarray, grad_bytes: np.ndarray, grad_code: int) -> _Replayed:
    """The parts of one device's list while each task runs: a stage's gradients from its first ``grad_code`` task,
    the saved bytes by :func:`~gpipe.schedule.saved.held_while_running`, the task's working set."""
    code, i, j = task_arrays(tasks)
    grad_op = code == grad_code
    first = np.zeros(len(tasks), dtype=bool)
    idx = np.flatnonzero(grad_op)
    _, at = np.unique(j[idx], return_index=True)
    first[idx[at]] = True
    gradients = np.cumsum(np.where(first, grad_bytes[j], 0))
    size = np.where(grad_op & ~first, accumulating[j], working[j]) * (scale[i] if scale is not None else 1.0)
    live = np.where(code == W, 0, _round_blocks(size))
    return _Replayed(gradients, held_while_running(tasks, held), live)


def _round_blocks(nbytes: np.ndarray) -> np.ndarray:
    """:func:`round_block` of each element."""
    n = np.maximum(np.ceil(nbytes), 0).astype(np.int64)
    return -(-n // BLOCK_BYTES) * BLOCK_BYTES
