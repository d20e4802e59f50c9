"""This project's schedules against torch.distributed.pipelining's, through its action format: its schedules import,
validate and simulate here; ours load there; each registered counterpart runs the same order.

torch's schedule classes compute every rank's ``pipeline_order`` in ``__init__`` from what they read of their
stages (count, pipeline size, rank), so they are built here on :class:`StageShape` records, without processes:
the orders are torch's own code. ``ScheduleGPipe`` and ``Schedule1F1B`` (one stage per rank) draw theirs in
``_get_pipeline_order``, apart from the loop that runs them; the others run the order they compute.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.distributed.pipelining import schedules as tp

from gpipe.schedule import SCHEDULES, Op, Schedule, from_pipelining, read_pipelining_csv, write_pipelining_csv
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

SHAPES = [(2, 4), (3, 6), (4, 8)]  # (p ranks, m micro-batches) that every class below takes
FSDP_AND_DATA_PARALLEL = (tp.UNSHARD, tp.RESHARD, tp.REDUCE_GRAD)
BACKWARD, FORWARD = re.compile(r"^\d+B\d+$"), re.compile(r"^(\d+)F(\d+)$")  # a full backward, a forward


class StageShape:
    """What torch's schedule constructors read of a pipeline stage: its index, the stage count, the pipeline's
    size and this rank; they write the stage-to-rank mapping back."""

    def __init__(self, index: int, stages: int, ranks: int, rank: int) -> None:
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, stages, ranks, rank
        self.submod = torch.nn.Identity()
        self.stage_index_to_group_rank: dict[int, int] = {}


def torch_order(cls: type, p: int, m: int, v: int) -> dict[int, list[str]]:
    """Rank 0's instance of ``cls`` for ``p`` ranks, ``v`` stages each, ``m`` micro-batches: every rank's actions."""
    n = p * v
    stages = [StageShape(s, n, p, 0) for s in range(n) if _rank_of(cls, s, p) == 0]
    schedule = cls(stages[0], m) if v == 1 and issubclass(cls, tp.PipelineScheduleSingle) else cls(stages, m)
    return {r: ["" if a is None else str(a) for a in actions] for r, actions in schedule.pipeline_order.items()}


def _rank_of(cls: type, stage: int, p: int) -> int:
    v_shape = cls in (tp.ScheduleZBVZeroBubble, tp.ScheduleDualPipeV)
    return (stage if stage < p else 2 * p - 1 - stage) if v_shape else stage % p


def backwards_in_forward_order(order: dict[int, list[str]]) -> dict[int, list[str]]:
    """Our GPipe from torch's: each rank's backwards reversed (torch runs them in micro-batch order, as its
    ``_step_microbatches`` does; ours, as GPipe and torchgpipe do, in reverse)."""
    out = {}
    for r, words in order.items():
        backwards = iter(reversed([w for w in words if BACKWARD.match(w)]))
        out[r] = [next(backwards) if BACKWARD.match(w) else w for w in words]
    return out


def last_rank_forwards_one_later(order: dict[int, list[str]]) -> dict[int, list[str]]:
    """Our 1F1B from torch's drawing of it: on the last rank torch 2.13 writes ``F1 .. Fm`` for ``F0 .. Fm-1``
    (its ``Schedule1F1B._get_pipeline_order`` starts counting forwards at 1 there)."""
    last = max(order)
    shifted = [FORWARD.sub(lambda f: f"{f[1]}F{int(f[2]) - 1}", w) for w in order[last]]
    return {**order, last: shifted}


# (torch's class, stages per rank, this project's name, what turns torch's order into ours; None: nothing).
# A row compares once its name is registered (the generators arrive on their own branches).
AGAINST_TORCH: list[tuple[type, int, str, Callable[[dict[int, list[str]]], dict[int, list[str]]] | None]] = [
    (tp.ScheduleGPipe, 1, "gpipe", backwards_in_forward_order),
    (tp.Schedule1F1B, 1, "1f1b", last_rank_forwards_one_later),
    (tp.ScheduleLoopedBFS, 1, "gpipe", None),
    (tp.ScheduleLoopedBFS, 2, "looped-bfs", None),
    (tp.ScheduleInterleaved1F1B, 2, "interleaved-1f1b", None),
    (tp.ScheduleInterleavedZeroBubble, 1, "zb-h1", None),
    (tp.ScheduleZBVZeroBubble, 2, "zb-v", None),
    (tp.ScheduleDualPipeV, 2, "dualpipe-v", None),
]
# every class, with the stages per rank it is built for here
TORCH_CLASSES = [(tp.ScheduleGPipe, 1), (tp.ScheduleLoopedBFS, 1), (tp.ScheduleLoopedBFS, 2),
                 (tp.ScheduleInterleaved1F1B, 2), (tp.ScheduleInterleavedZeroBubble, 1),
                 (tp.ScheduleInterleavedZeroBubble, 2), (tp.ScheduleZBVZeroBubble, 2), (tp.ScheduleDualPipeV, 2)]


@pytest.mark.parametrize(("p", "m"), SHAPES)
@pytest.mark.parametrize(("cls", "v", "name", "adjust"), AGAINST_TORCH,
                         ids=[f"{c.__name__}-v{v}-{n}" for c, v, n, _ in AGAINST_TORCH])
def test_torch_runs_what_our_generator_of_that_name_runs(
    cls: type, v: int, name: str, adjust: Callable[[dict[int, list[str]]], dict[int, list[str]]] | None,
    p: int, m: int,
) -> None:
    if name not in SCHEDULES:
        pytest.skip(f"{name!r} is not registered on this branch")
    order = torch_order(cls, p, m, v)
    theirs = from_pipelining(adjust(order) if adjust else order, "never", name=name, m=m)
    ours = SCHEDULES[name](m, p * v, "never", devices=p)
    assert theirs.placement == ours.placement
    assert theirs.tasks == ours.tasks


def test_the_two_differences_as_pictures() -> None:
    """p=2, m=3 (and m=2 for 1F1B): torch's GPipe runs backwards in micro-batch order, ours in reverse; torch's
    1F1B drawing numbers the last rank's forwards from 1."""
    gpipe = torch_order(tp.ScheduleGPipe, 2, 3, 1)
    assert gpipe == {0: ["0F0", "0F1", "0F2", "0B0", "0B1", "0B2", "0REDUCE_GRAD"],
                     1: ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2", "1REDUCE_GRAD"]}
    assert backwards_in_forward_order(gpipe)[1] == ["1F0", "1F1", "1F2", "1B2", "1B1", "1B0", "1REDUCE_GRAD"]
    one_f_one_b = torch_order(tp.Schedule1F1B, 2, 2, 1)
    assert one_f_one_b == {0: ["0F0", "0F1", "0B0", "0B1", "0REDUCE_GRAD"],
                           1: ["1F1", "1B0", "1F2", "1B1", "1REDUCE_GRAD"]}
    assert last_rank_forwards_one_later(one_f_one_b)[1] == ["1F0", "1B0", "1F1", "1B1", "1REDUCE_GRAD"]
    with pytest.raises(ValueError, match=r"rank 1: action '1F2' is outside m=2 micro-batches"):
        from_pipelining(one_f_one_b, m=2)


def _costs(schedule: Schedule) -> CostModel:
    """F 1 s, a backward 3 s: B 3 s, or B 2 s (the input gradient) and W 1 s when split."""
    split = schedule.splits_weight_gradient
    return CostModel((StageCost(1.0, 2.0 if split else 3.0, weight=1.0 if split else 0.0),) * schedule.n)


@pytest.mark.parametrize(("p", "m"), SHAPES)
@pytest.mark.parametrize(("cls", "v"), TORCH_CLASSES, ids=[f"{c.__name__}-v{v}" for c, v in TORCH_CLASSES])
def test_every_torch_schedule_imports_validates_and_simulates(cls: type, v: int, p: int, m: int) -> None:
    schedule = from_pipelining(torch_order(cls, p, m, v), "never", name=cls.__name__, m=m)
    assert (schedule.m, schedule.n, schedule.num_devices) == (m, p * v, p)
    assert schedule.placement == tuple(_rank_of(cls, s, p) for s in range(p * v))
    assert schedule.validate() is schedule
    timeline = simulate(schedule, _costs(schedule))
    assert len(timeline.spans) == sum(len(ts) for ts in schedule.tasks)  # copies are free: no copy spans
    assert [row["busy"] for row in timeline.summary()["devices"]] == [4.0 * m * v] * p
    if v == 1 and not schedule.splits_weight_gradient:  # GPipe's closed form, backwards in either order
        assert timeline.makespan == (m + p - 1) * 4.0


def test_uniform_costs_simulate_torch_gpipe_with_recompute() -> None:
    """The caller's policy adds an R before each checkpointed B. The last stage runs its m forwards by
    ``(m + n - 1) f``, then m pairs ``R + B``; the gradient then takes ``(n - 1) b`` down, each stage's R run
    while it waits: ``(m + n - 1)(f + b) + m r`` (m=4, n=3, f=r=1, b=2: 22)."""
    schedule = from_pipelining(torch_order(tp.ScheduleGPipe, 3, 4, 1), "always")
    assert sum(t.op is Op.R for t in schedule.all_tasks()) == 4 * 3
    assert simulate(schedule, CostModel.uniform(3, 1.0, 2.0)).makespan == (4 + 3 - 1) * (1.0 + 2.0) + 4 * 1.0


@pytest.mark.parametrize("name", [name for name, kind in SCHEDULES.items() if kind.copies == 1])
def test_torch_loads_our_csv_and_lowers_it_to_sends_and_receives(name: str, tmp_path: Path) -> None:
    """Their ``_load_csv`` validates our file and adds the communication; their dry run of it finishes; the
    lowered order reads back here as the same schedule. (A schedule of two copies of the stages has no CSV: its
    refusal is tests/test_dualpipe_two_way.py's.)"""
    for p, m in SHAPES:
        try:
            ours = SCHEDULES[name](m, 2 * p if SCHEDULES[name].place else p, "never", devices=p)
        except ValueError:  # a shape this schedule does not take
            continue
        path = write_pipelining_csv(ours, tmp_path / f"{name}-{p}-{m}.csv")
        stages = [StageShape(s, ours.n, p, 0) for s in ours.stages_on(0)]
        runtime = tp._PipelineScheduleRuntime(stages, m)
        runtime._load_csv(str(path))
        assert runtime.stage_index_to_group_rank == dict(enumerate(ours.placement))
        lowered = {r: [str(a) for a in actions] for r, actions in runtime.pipeline_order_with_comms.items()}
        sends_and_compute = {r: [a for a in actions if a.computation_type not in FSDP_AND_DATA_PARALLEL]
                             for r, actions in runtime.pipeline_order_with_comms.items()}  # what the dry run takes
        tp._simulate_comms_compute(sends_and_compute, runtime.stage_index_to_group_rank.__getitem__, ours.n)
        assert any("SEND_F" in a for a in lowered[0]) or ours.n == 1
        assert from_pipelining(lowered, "never", name=name).tasks == ours.tasks


@pytest.mark.parametrize("form", ["compute_only", "compute_comms"])
def test_we_read_the_csv_torch_writes(form: str, tmp_path: Path) -> None:
    for cls, v in TORCH_CLASSES[1:]:  # the classes with a runtime (ScheduleGPipe's has no _dump_csv forms)
        p, m = 2, 4
        stages = [StageShape(s, p * v, p, 0) for s in range(p * v) if _rank_of(cls, s, p) == 0]
        instance = cls(stages, m)
        path = tmp_path / f"{cls.__name__}-{v}-{form}.csv"
        instance._dump_csv(str(path), format=form)
        expected = from_pipelining({r: [str(a) if a else "" for a in acts] for r, acts in
                                    instance.pipeline_order.items()})
        assert read_pipelining_csv(path).tasks == expected.tasks
