"""The profiler's timed runs of blocks: clocks, the order of runs in a pass, streaks, and a recording executor's runs.

Times are medians over ``repeats`` passes after ``warmup`` untimed ones; a pass runs every block once,
so a burst of noise from a busy machine spoils one sample of each block rather than all samples of one.
The clock is ``time.perf_counter`` on CPU and CUDA events on CUDA (after a device synchronise, so
earlier work is not billed to the block).

Note [issue seconds]: on CUDA the host only launches kernels, and returns before they end; every run is
also timed on the host, from the call to its return (``..._issue_seconds``). That is the host's share of
a task, which an executor's worker cannot overlap with its next task, while the kernels' seconds can
overlap the host's next work (``sim.core.device``, Note [asynchronous devices]). Where the host sets the pace
(many small kernels) the two are about equal; where the kernels do, the issue seconds are far smaller. On
CPU the host runs the work itself, and the issue seconds equal the seconds.

Note [recorded runs]: a recording :class:`gpipe.GPipe` counts the bytes each grad-enabled forward
saves with a Python pack hook (:class:`gpipe.autograd.saved.SavedBytes`, the very hook that measures ``saved_bytes``),
and its backward takes every saved tensor back through an unpack hook. For a block of many small layers
that is a large share of its time, and how large depends on what the layers save (a Linear's input
and weight, a ReLU's output): it is measured on the block itself, not estimated per tensor. The hooks
are installed outside the timed region, so what they add is their per-tensor calls.

Note [run order]: a pass runs the blocks as a training step does: every grad-enabled forward in block order
(graphs kept), then every backward in reverse order, then every no-grad forward, then (with ``recorded``) the
recorded runs in the same order. Between two runs of a block the other blocks ran, as in a pipeline step; timed
back to back instead, a block finds what it just used still in the caches and on the allocator's free lists, and
runs faster than it does in a step.

Note [streaks]: a pipeline's worker runs its stage back to back (the forward of every micro-batch in a row, then
a recompute and a backward per micro-batch) on a core that stays busy, warmer than a pass that alternates blocks
and cores. ``streak=k`` runs each kind of run ``k`` times in a row per block (the backwards in the reverse order
of the forwards, as GPipe's), inside the order above; untimed passes run once each. Timed one at a time, tasks
run slower than their spans in the steps, and a prediction built from them comes out over
(benchmarks/fidelity.py measures it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gpipe.autograd.phase import checkpointing
from gpipe.autograd.saved import SavedBytes
from gpipe.autograd.split_backward import SplitPlans, backward_input
from gpipe.checks import check_positive
from gpipe.interpreter.affinity import Cores, check_affinity, pinned
from gpipe.profiling.session import Device, TensorOrTensors, _call, _fresh, _session, _Step

__all__ = ["RecordedSeconds", "time_recorded"]

Clock = Callable[[Callable[[], Any]], tuple[float, float, Any]]  # runs a thunk: (seconds, issue seconds, result)


@dataclass(frozen=True)
class RecordedSeconds:
    """Median seconds of the runs a recording executor's tasks are predicted from, for one block.

    Attributes:
        forward: grad-enabled forward under the recorder's hooks (Note [recorded runs]): an ``F`` that
            is not checkpointed, and every ``R``.
        backward: its backward, every saved tensor back through the unpack hook: a ``B``.
        forward_nograd: forward under ``no_grad`` with checkpointing set: a checkpointed ``F``.
        weight: with a split backward (Note [split runs]), its weight-gradient part, a ``W``; ``backward``
            is then the input-gradient part, a ``B``. 0 when the backward is not split.
    """

    forward: float
    backward: float
    forward_nograd: float
    weight: float = 0.0


def time_recorded(blocks: Sequence[nn.Module], sample: TensorOrTensors, *,
                  device: Device | Sequence[Device] | None = None, warmup: int = 1, repeats: int = 1,
                  affinity: Sequence[Cores | None] | None = None, streak: int = 1,
                  split: bool = False) -> list[RecordedSeconds]:
    """Only the seconds a recording executor's tasks take: :func:`gpipe.profiling.profile.profile_blocks` with
    ``recorded=True`` less its plain (hook-free) forward and backward, which such an executor never runs; about half the
    cost, for sampling a machine between training steps (Note [interleaved calibration] in
    ``sim.calibration.experiment``). The runs that remain run in the same order (Note [run order]): every no-grad
    forward, then the recorded forwards and backwards. Bytes are not returned: they do not change from
    pass to pass (:func:`gpipe.profiling.session.profile_sizes`).

    Args:
        blocks: as for :func:`gpipe.profiling.profile.profile_blocks`.
        sample: as for :func:`gpipe.profiling.profile.profile_blocks`.
        device: as for :func:`gpipe.profiling.profile.profile_blocks`.
        warmup: untimed passes first.
        repeats: timed passes; each time is the median over them.
        affinity: as for :func:`gpipe.profiling.profile.profile_blocks`.
        streak: runs of each kind a block makes in a row within a pass (Note [streaks]); each time
            is the median over every timed run.
        split: time the backward as a schedule with ``W`` tasks runs it, in two parts (Note [split runs]).

    Returns:
        One :class:`RecordedSeconds` per block.

    Raises:
        ValueError: as :func:`gpipe.profiling.profile.profile_blocks`.
        TypeError: as :func:`gpipe.profiling.profile.profile_blocks`.
    """
    cores = check_affinity(affinity, len(blocks)) or [None] * len(blocks)
    _check_counts(warmup, repeats)
    check_positive("streak", streak)
    with _session(blocks, sample, device) as steps:
        runs = _timed_runs(steps, cores, warmup, repeats, plain=False, recorded=True, streak=streak, split=split)
    return [RecordedSeconds(forward=t["forward_recorded"], backward=t["backward_recorded"], forward_nograd=t["nograd"],
                            weight=t["weight_recorded"]) for t in runs]


def _check_counts(warmup: int, repeats: int) -> None:
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")


def _timed_runs(steps: Sequence[_Step], cores: Sequence[Cores | None], warmup: int, repeats: int, *,
                plain: bool, recorded: bool, streak: int = 1, split: bool = False) -> list[dict[str, float]]:
    """Per block, the median seconds over ``repeats`` timed passes after ``warmup`` untimed ones: with
    ``plain`` the ``forward``, the ``backward`` and the ``weight``, then the no-grad forward (``nograd``), then
    with ``recorded`` the ``forward_recorded``, ``backward_recorded`` and ``weight_recorded`` (Note [run order]:
    one kind of run over every block, then the next; ``streak`` runs of it in a row, Note [streaks]; ``split``:
    Note [split runs]); each with its ``..._issue`` seconds (Note [issue seconds])."""
    clocks = [_clock(step.device) for step in steps]
    plans = [SplitPlans([p for p in step.block.parameters() if p.requires_grad]) for step in steps]  # Note [split runs]
    runs: list[list[list[dict[str, float]]]] = [[] for _ in steps]  # per block, per pass, per run of the streak
    for k in range(warmup + repeats):  # passes over all blocks, so a burst of noise hits one pass
        row = streak if k >= warmup else 1  # an untimed pass only warms up (Note [streaks])
        times: list[list[dict[str, float]]] = [[{} for _ in range(row)] for _ in steps]
        if plain:
            for t, block in zip(times, _train_pass(steps, clocks, cores, plans, streak=row, split=split), strict=True):
                for s, (f, b, w, fi, bi, wi) in zip(t, block, strict=True):
                    s.update(forward=f, backward=b, weight=w, forward_issue=fi, backward_issue=bi, weight_issue=wi)
        for t, step, clock, where in zip(times, steps, clocks, cores, strict=True):
            for s, (n, ni) in zip(t, _nograd_runs(step, clock, where, row), strict=True):
                s["nograd"], s["nograd_issue"] = n, ni
        if recorded:
            for t, block in zip(times, _train_pass(steps, clocks, cores, plans, recorded=True, streak=row,
                                                   split=split), strict=True):
                for s, (f, b, w, fi, bi, wi) in zip(t, block, strict=True):
                    s.update(forward_recorded=f, backward_recorded=b, weight_recorded=w, forward_recorded_issue=fi,
                             backward_recorded_issue=bi, weight_recorded_issue=wi)
        for block_runs, t in zip(runs, times, strict=True):
            block_runs.append(t)
    return [{key: statistics.median(s[key] for t in block_runs[warmup:] for s in t) for key in block_runs[0][0]}
            for block_runs in runs]

# --- times ----------------------------------------------------------------------------------------

Times = tuple[float, float, float, float, float, float]  # forward, backward, weight, then the issue seconds of each


# Note [split runs]: a schedule with ``W`` tasks runs a stage's backward as two tasks, ``B`` the gradients of the
# stage's inputs and ``W`` the parameters' from what ``B`` kept (Note [split backward] in
# gpipe.autograd.split_backward). ``split=True`` times the two with the executor's own functions, one after the other on
# one graph: ``backward`` is the ``B`` part (0 for a block whose input needs no gradient, as the first stage's, whose
# ``B`` only hands the outputs to ``W``) and ``weight`` the ``W`` part (0 for a block without trainable parameters);
# without it ``weight`` is 0. Each block keeps its split plans across passes, as the executor keeps a stage's across
# steps (Note [plans across steps] in gpipe.autograd.split_backward), and learns its graph's before its first ``B``,
# untimed: the times are the executor's in steady state, where every ``B`` finds its plan.

def _train_pass(steps: Sequence[_Step], clocks: Sequence[Clock], cores: Sequence[Cores | None],
                plans: Sequence[SplitPlans], recorded: bool = False, streak: int = 1,
                split: bool = False) -> list[list[Times]]:
    """Per block, ``streak`` times (Note [streaks]): the seconds of a grad-enabled forward, of its backward and
    of its weight gradient (``split``, Note [split runs]; else 0), in a step's order (Note [run order]), then
    the issue seconds of each (Note [issue seconds]).

    Every forward first, in block order (each block's ``streak`` forwards in a row), keeping the graphs;
    then every backward, blocks in reverse order, each block's in the reverse of its forwards'. With
    ``recorded``, under a recording executor's hooks (Note [recorded runs]).
    """
    graphs: list[list[tuple[float, float, list[Tensor], list[Tensor], list[Tensor]]]] = []
    for step, clock, where in zip(steps, clocks, cores, strict=True):
        built = []
        with pinned(where):
            for _ in range(streak):
                leaves = tuple(t.detach().requires_grad_(t.requires_grad) for t in step.inputs)
                with torch.enable_grad(), (SavedBytes(step.block).hooks() if recorded else nullcontext()):
                    fresh = _fresh(leaves)
                    forward, issue, (_, outputs) = clock(lambda: _call(step.block, fresh, step.atomic))  # noqa: B023
                tensors = [t for t in outputs if t.requires_grad]
                inputs = [t for t in leaves if t.requires_grad]
                built.append((forward, issue, tensors, [torch.ones_like(t) for t in tensors], inputs))
        graphs.append(built)
    times: list[list[Times]] = []
    for step, clock, where, built, learnt in reversed(list(zip(steps, clocks, cores, graphs, plans, strict=True))):
        block: list[Times] = []
        params = learnt.params
        with pinned(where):
            for forward, issue, tensors, grads, inputs in reversed(built):
                backward = backward_issue = weight = weight_issue = 0.0
                if tensors and not split:
                    backward, backward_issue, _ = clock(lambda: torch.autograd.backward(tensors, grads))  # noqa: B023
                elif tensors:  # Note [split runs]: B then W, as the executor runs them (gpipe.autograd.split_backward)
                    if inputs:
                        if not learnt.plans:  # the block's first B: learns its plan untimed
                            learnt.plan(learnt.walk(tensors, inputs)[0])
                        backward, backward_issue, (_, kept) = clock(
                            lambda: backward_input(tensors, grads, inputs, params, learnt))  # noqa: B023
                    else:
                        _, kept = backward_input(tensors, grads, inputs, params)
                    if params:
                        weight, weight_issue, _ = clock(kept.accumulate)
                for p in step.block.parameters():
                    p.grad = None
                block.append((forward, backward, weight, issue, backward_issue, weight_issue))
        built.clear()  # the graphs die here
        times.append(block[::-1])
    return times[::-1]


def _nograd_runs(step: _Step, clock: Clock, cores: Cores | None = None, streak: int = 1) -> list[tuple[float, float]]:
    """Seconds and issue seconds of ``streak`` forwards in a row as a checkpointed micro-batch runs them."""
    out = []
    with pinned(cores), torch.no_grad(), checkpointing():
        for _ in range(streak):
            fresh = _fresh(step.inputs)
            seconds, issue, _ = clock(lambda: _call(step.block, fresh, step.atomic))  # noqa: B023
            out.append((seconds, issue))
    return out


def _clock(dev: torch.device) -> Clock:
    """A function that runs a thunk and returns (seconds, issue seconds, its result): Note [issue seconds]."""
    if dev.type == "cuda":
        def cuda_clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
            with torch.cuda.device(dev):
                torch.cuda.synchronize(dev)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                tick = time.perf_counter()
                result = fn()
                issue = time.perf_counter() - tick
                end.record()
                end.synchronize()
                return start.elapsed_time(end) / 1000.0, issue, result
        return cuda_clock

    def host_clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
        tick = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - tick
        return seconds, seconds, result
    return host_clock
