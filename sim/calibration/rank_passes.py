"""The profiling passes each rank of a multi-process run takes between its steps, and their cost model.

A rank of :func:`sim.calibration.processes.run_processes` profiles only its own stages, in its own process, after
every training step, while the other ranks profile theirs (Note [calibrated in the ranks]): :func:`stage_inputs`
gives each of its stages the input that stage sees, :func:`rank_pass` times them as the recording interpreter runs
them (:func:`gpipe.profiling.profile.time_recorded`). Rank 0 gathers every rank's passes and :func:`gathered_passes`
puts them in the single-process experiment's order, per step and per stage, for its own aggregation
(:func:`sim.calibration.outcome.interleaved_cost`, Note [median pass] there). :func:`local_gaps` reads the
host seconds between a rank's tasks off a probe pipeline's timeline (Note [gap between tasks]).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from gpipe.profiling.profile import RecordedSeconds, preserved, time_recorded
from gpipe.schedule import Op
from gpipe.schedule.timeline import Timeline

__all__ = ["RankPass", "gathered_passes", "local_gaps", "rank_pass", "stage_inputs"]

Batch = Tensor | tuple[Tensor, ...]
RankPass = dict[int, RecordedSeconds]
"""One rank's profiling pass after one step: the seconds of each of its stages, by stage index."""


def stage_inputs(parts: Sequence[nn.Module], sample: Batch, stages: Iterable[int]) -> dict[int, Batch]:
    """The input each of ``stages`` gets when ``sample`` (the first micro-batch) flows through ``parts`` in order.

    As :func:`gpipe.profiling.profile.time_recorded` chains its blocks: each output detached, requiring grad iff it did.
    The partitions before a stage run once each, left as found (:func:`gpipe.profiling.profile.preserved`, the random
    state forked).
    """
    wanted = set(stages)
    inputs: dict[int, Batch] = {}
    x = sample
    with torch.random.fork_rng(devices=[]):
        for j, part in enumerate(parts):
            if j in wanted:
                inputs[j] = x
            if len(inputs) == len(wanted):
                break
            with preserved(part), torch.enable_grad():
                y = part(x)
            x = y.detach().requires_grad_(y.requires_grad) if isinstance(y, Tensor) else \
                tuple(t.detach().requires_grad_(t.requires_grad) for t in y)
    return inputs


def rank_pass(parts: Sequence[nn.Module], inputs: Mapping[int, Batch], *, streak: int = 1,
              split: bool = False) -> RankPass:
    """One profiling pass of this rank's stages (the keys of ``inputs``, from :func:`stage_inputs`): an untimed
    run, then ``streak`` timed runs of each kind in a row (Note [streaks] in :mod:`gpipe.profiling.timing`);
    ``split``: the backward in ``B`` and ``W`` (Note [split runs] there). Each stage is timed in a session of its
    own, since a rank's stages need not be neighbours (a looped layout's are not)."""
    return {j: time_recorded([parts[j]], inputs[j], warmup=1, repeats=1, streak=streak, split=split)[0]
            for j in sorted(inputs)}


def gathered_passes(gathered: Sequence[Sequence[RankPass]], placement: Sequence[int]) -> list[list[RecordedSeconds]]:
    """Every rank's passes (``gathered[r][k]``: rank ``r``'s pass after step ``k``) as per step, per stage.

    Raises:
        ValueError: the ranks took different numbers of passes, or a pass of rank ``r`` has other stages than
            ``placement`` gives ``r``.
    """
    if len(gathered) != max(placement) + 1:
        raise ValueError(f"passes of {len(gathered)} ranks for a placement on {max(placement) + 1}: gather one list "
                         "per rank")
    counts = {len(p) for p in gathered}
    if len(counts) != 1:
        raise ValueError(f"the ranks took {sorted(len(p) for p in gathered)} passes: every rank profiles after "
                         "every step")
    for r, passes in enumerate(gathered):
        own = sorted(j for j, d in enumerate(placement) if d == r)
        for k, one in enumerate(passes):
            if sorted(one) != own:
                raise ValueError(f"rank {r}'s pass {k} has stages {sorted(one)}; the placement {tuple(placement)} "
                                 f"gives it stages {own}")
    return [[gathered[d][k][j] for j, d in enumerate(placement)] for k in range(counts.pop())]


# Note [gap between tasks]: between two tasks a rank's main thread sends the results of the first (the wire's
# flush), checks for failures elsewhere and takes the inputs of the next: host seconds outside both spans, the
# simulator's ``Overheads.gap``. Small per task, they add up in a schedule of many tasks per rank (a looped
# layout, many micro-batches), and no profiled stage holds them. So before training, the ranks run a probe pipeline of
# tiny stages (one Linear each, the same schedule and chunks) and the gap is the median idle time before a task
# whose inputs are this rank's own (an ``R``, a ``W``, the first stage's ``F``), where nothing was waited for.
def local_gaps(timeline: Timeline) -> list[float]:
    """Seconds each device sat idle right before a task whose inputs it held already (Note [gap between tasks])."""
    gaps = []
    for d in sorted({s.device for s in timeline.spans}):
        spans = sorted((s for s in timeline.spans if s.device == d and s.stream == "compute"), key=lambda s: s.start)
        for before, after in itertools.pairwise(spans):
            op = after.task.op
            if op is Op.R or op is Op.W or (op is Op.F and after.task.stage == 0):
                gaps.append(max(0.0, after.start - before.end))
    return gaps
