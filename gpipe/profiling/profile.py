"""Measure blocks of layers: forward, backward and no-grad forward seconds, and the bytes each keeps and sends.

One profiler serves both :func:`gpipe.balance.balance_by_time` (blocks are single layers) and
``sim.calibration.calibrate`` (blocks are whole partitions). A sample flows through the blocks in order, block ``k``
receiving block ``k - 1``'s output, and each block is measured alone on a detached copy of its input::

    sample -> [block 0] -> y0 -> [block 1] -> y1 -> ...
                 |                  |
        measured on x0        measured on y0.detach() (requires grad iff y0 did)

Per block, :class:`BlockProfile` holds:

- ``forward_seconds``: forward with grad enabled (it records the graph): an ``F`` that is not
  checkpointed, and every ``R`` (a recompute is exactly this forward);
- with ``split=True``, ``weight_seconds``: the weight-gradient part of the backward, a ``W`` task, and
  ``backward_seconds`` the input-gradient part, a ``B`` (Note [split runs] in :mod:`gpipe.profiling.timing`);
- ``forward_nograd_seconds``: forward under ``no_grad`` (with :func:`gpipe.autograd.phase.checkpointing` set):
  the ``F`` of a checkpointed micro-batch, cheaper because nothing is saved;
- ``backward_seconds``: ``torch.autograd.backward`` of this block's outputs alone, with a gradient of
  ones, into its parameters and (when it requires grad) its input;
- with ``recorded=True``, ``forward_recorded_seconds`` and ``backward_recorded_seconds``: the same
  forward and backward while a recording executor's saved-tensor hooks count the bytes (Note [recorded
  runs]);
- ``output_bytes`` (sent to the next block), ``input_bytes`` (what checkpointing keeps),
  ``saved_bytes`` (kept for backward, from ``torch.autograd.graph.saved_tensors_hooks``),
  ``parameter_bytes`` (parameters and buffers) and ``gradient_bytes`` (trainable parameters).

The walk through the blocks, their sizes and Note [no side effects] are in :mod:`gpipe.profiling.session`;
the timed runs and Notes [issue seconds], [recorded runs], [run order] and [streaks] in
:mod:`gpipe.profiling.timing`; :func:`preserved` in :mod:`gpipe.autograd.preserved`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from gpipe.autograd.preserved import preserved
from gpipe.interpreter.affinity import Cores, check_affinity
from gpipe.profiling.session import BlockSizes, Device, TensorOrTensors, _session, profile_sizes
from gpipe.profiling.timing import RecordedSeconds, _check_counts, _timed_runs, time_recorded

__all__ = ["BlockProfile", "BlockSizes", "Device", "RecordedSeconds", "TensorOrTensors", "preserved", "profile_blocks",
           "profile_sizes", "time_recorded"]


@dataclass(frozen=True)
class BlockProfile(BlockSizes):
    """Bytes and median seconds of one block for one input."""

    forward_seconds: float
    forward_nograd_seconds: float
    backward_seconds: float
    forward_recorded_seconds: float | None = None
    backward_recorded_seconds: float | None = None
    forward_issue_seconds: float | None = None
    forward_nograd_issue_seconds: float | None = None
    backward_issue_seconds: float | None = None
    forward_recorded_issue_seconds: float | None = None
    backward_recorded_issue_seconds: float | None = None
    weight_seconds: float = 0.0
    weight_recorded_seconds: float | None = None

    @property
    def recompute_seconds(self) -> float:
        """A recompute is a grad-enabled forward."""
        return self.forward_seconds

    @property
    def train_seconds(self) -> float:
        """Forward plus backward (both parts of a split one) without checkpointing: what ``balance_by_time``
        balances."""
        return self.forward_seconds + self.backward_seconds + self.weight_seconds


def profile_blocks(blocks: Sequence[nn.Module], sample: TensorOrTensors, *,
                   device: Device | Sequence[Device] | None = None, warmup: int = 2,
                   repeats: int = 5, recorded: bool = False,
                   affinity: Sequence[Cores | None] | None = None, split: bool = False) -> list[BlockProfile]:
    """Time and size each block, the sample flowing through the blocks in sequence.

    Args:
        blocks: the blocks, in order; each takes the previous one's output (a tensor, or a tuple of
            tensors passed as one argument, as ``nn.Sequential`` does).
        sample: the first block's input (a micro-batch); its ``requires_grad`` is respected.
        device: where to run: one device for all blocks or one per block; a block elsewhere is
            profiled as a copy moved there. ``None``: each block where its parameters are (a block
            without any where its input is).
        warmup: untimed passes over the blocks before timing.
        repeats: timed passes; each time is the median over them.
        recorded: also time the forward and backward with a recording executor's hooks
            (Note [recorded runs]); otherwise those two times are ``None``.
        affinity: one set of CPU cores per block (or ``None``): each block runs on the calling thread
            moved to its cores, as a pinned worker runs it (:mod:`gpipe.interpreter.affinity`); restored after.
        split: time each backward in two parts, as a schedule with ``W`` tasks runs it (Note [split runs] in
            :mod:`gpipe.profiling.timing`): ``backward_seconds`` the input gradient, ``weight_seconds`` the rest.

    Returns:
        One :class:`BlockProfile` per block.

    Raises:
        ValueError: no blocks, ``warmup < 0``, ``repeats < 1``, a device or affinity list of the
            wrong length, or cores this process cannot use.
        TypeError: an input or output that is not a tensor or a tuple of tensors.
    """
    cores = check_affinity(affinity, len(blocks)) or [None] * len(blocks)
    _check_counts(warmup, repeats)
    with _session(blocks, sample, device) as steps:
        runs = _timed_runs(steps, cores, warmup, repeats, plain=True, recorded=recorded, split=split)
    return [BlockProfile(**vars(step.sizes), forward_seconds=t["forward"], forward_nograd_seconds=t["nograd"],
                         backward_seconds=t["backward"], forward_recorded_seconds=t.get("forward_recorded"),
                         backward_recorded_seconds=t.get("backward_recorded"),
                         forward_issue_seconds=t["forward_issue"], forward_nograd_issue_seconds=t["nograd_issue"],
                         backward_issue_seconds=t["backward_issue"],
                         forward_recorded_issue_seconds=t.get("forward_recorded_issue"),
                         backward_recorded_issue_seconds=t.get("backward_recorded_issue"),
                         weight_seconds=t["weight"], weight_recorded_seconds=t.get("weight_recorded"))
            for step, t in zip(steps, runs, strict=True)]
