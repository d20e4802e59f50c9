"""Properties every simulated timeline has, for random schedules (overlapped pairs too), placements, costs (with
communication inside tasks too) and switches."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpipe.schedule import CHECKPOINT_MODES, Op, Schedule, Task, dualpipe_v, gpipe, one_f_one_b, zb_h1
from gpipe.timeline import COMPUTE, MemorySample, Span, Timeline
from sim.calibration.host import Overheads, with_overheads
from sim.core.config import SimConfig
from sim.core.copies import ON_COMPUTE
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec

EPS = 1e-9
PROPERTIES = settings(max_examples=50, deadline=None, derandomize=True)


@dataclass(frozen=True)
class Case:
    schedule: Schedule
    cost: CostModel
    config: SimConfig


def _surjective(raw: list[int]) -> list[int]:
    """Relabel devices by first appearance, so they are 0..k-1 without gaps."""
    labels: dict[int, int] = {}
    return [labels.setdefault(d, len(labels)) for d in raw]


@st.composite
def cases(draw: st.DrawFn, shared: bool | None = None, pairs: bool = True) -> Case:
    """A schedule, a cost model and switches; a schedule with overlapped pairs (DualPipeV, its two stages on
    each device) only where they are modelled (sim.core.overlap.check_pairs): copy streams, no contention."""
    kinds = ["gpipe", "1f1b", "zb-h1"] + (["dualpipe-v"] if pairs and shared is not False else [])
    kind = draw(st.sampled_from(kinds))
    n, m = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    policy = draw(st.sampled_from(CHECKPOINT_MODES))
    share = draw(st.booleans()) if shared is None else shared
    placement = _surjective(draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))) if share else None
    if kind == "dualpipe-v":
        n = 2 * draw(st.integers(1, 3))
        m = draw(st.integers(n, n + 3))
        schedule = dualpipe_v(m, n, policy)
    else:
        schedule = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[kind](m, n, policy, placement)
    seconds = st.floats(0.05, 5.0, allow_nan=False)
    stages = tuple(
        StageCost(draw(seconds), draw(seconds), draw(st.none() | seconds), send_bytes=draw(st.integers(0, 4)),
                  saved_bytes=draw(st.integers(0, 1000)), checkpoint_bytes=draw(st.integers(0, 100)),
                  forward_checkpointed=draw(st.none() | seconds), weight=draw(seconds),
                  weight_bytes=draw(st.none() | st.integers(0, 1000)),
                  communication=draw(st.sampled_from([0.0, 0.0, 0.4, 1.3])))
        for _ in range(n))
    copy_seconds = draw(st.none() | st.sampled_from([0.0, 0.3, 1.7]))
    link = LinkSpec("test", draw(st.sampled_from([0.0, 0.2])), draw(st.sampled_from([1.0, 4.0]))) \
        if copy_seconds is None and draw(st.booleans()) else None
    overheads = Overheads(task=draw(st.sampled_from([0.0, 0.05])), handoff=draw(st.sampled_from([0.0, 0.1])),
                          contention=0.0 if schedule.pairs else draw(st.sampled_from([0.0, 0.0, 0.5])))
    scale = tuple(draw(st.lists(st.sampled_from([0.5, 1.0, 1.5]), min_size=m, max_size=m))) \
        if draw(st.booleans()) else ()
    cost = with_overheads(CostModel(stages, copy_seconds=copy_seconds, microbatch_scale=scale), overheads)
    # lockstep is GPipe's host loop; a 1F1B order merged onto shared devices may legally stall under it
    lockstep = draw(st.booleans()) and (kind == "gpipe" or placement is None) and not schedule.pairs
    config = SimConfig(link=link, copy_streams=bool(schedule.pairs) or draw(st.booleans()),
                       enforce_backward_order=draw(st.booleans()), lockstep_forward=lockstep)
    return Case(schedule, cost, config)


def copy_seconds(case: Case, producer: Task) -> float:
    """What the contract says a copy of ``producer``'s result takes."""
    cost, link = case.cost, case.config.link
    if cost.copy_seconds is not None:
        return cost.copy_seconds
    if link is None:
        return 0.0
    stage = producer.stage if producer.op is Op.F else producer.stage - 1
    return link.transfer_seconds(cost.stages[stage].send_bytes * cost.scale(producer.microbatch))


def communication_seconds(cost: CostModel, task: Task) -> float:
    """Note [communication] in sim.core.cost: the stage's for F, R and B, none for W; scaled with the micro-batch."""
    return 0.0 if task.op is Op.W else cost.stages[task.stage].communication * cost.scale(task.microbatch)


def nominal_seconds(schedule: Schedule, cost: CostModel, task: Task) -> float:
    """What a task takes alone: its compute, its communication and the runner's host seconds."""
    s = cost.stages[task.stage]
    forward = s.forward_seconds(schedule.is_checkpointed(task.microbatch))
    base = {Op.F: forward, Op.B: s.backward, Op.R: s.recompute_seconds, Op.W: s.weight}[task.op]
    return (base * cost.scale(task.microbatch) + communication_seconds(cost, task)
            + cost.runner.overheads.task)


def disjoint(spans: list[Span]) -> bool:
    ordered = sorted(spans, key=lambda s: (s.start, s.end))
    return all(a.end <= b.start + EPS for a, b in zip(ordered, ordered[1:], strict=False))


@PROPERTIES
@given(cases())
def test_timeline_invariants(case: Case) -> None:
    schedule, cost, config = case.schedule, case.cost, case.config
    tl = simulate(schedule, cost, config)
    compute = {s.task: s for s in tl.compute_spans()}
    copies = {(s.device, s.task): s for s in tl.copy_spans()}
    # every task exactly once, on its stage's device, in the device's order
    assert Counter(s.task for s in tl.compute_spans()) == Counter(schedule.all_tasks())
    assert all(s.device == schedule.device_of(s.task.stage) for s in compute.values())
    partner = dict(schedule.pairs)
    for d in range(schedule.num_devices):
        # one compute task at a time, but for a pair (one span from its start to its later end); in list order
        spans = [compute[t] for t in schedule.tasks[d]]
        units = [Span(d, COMPUTE, a.task, a.start, max(a.end, b.end)) if a.task in partner else a
                 for a, b in zip(spans, spans[1:] + spans[:1], strict=True) if a.task not in partner.values()]
        assert disjoint(units)
        assert all(a.start <= b.start + EPS for a, b in zip(spans, spans[1:], strict=False))
        assert all(compute[a].start == compute[b].start for a, b in schedule.pairs)
    # every dependency: after its producer, and after the copy that carries it
    for task, span in compute.items():
        for dep in schedule.dependencies(task):
            produced = compute[dep]
            if produced.device == span.device:
                assert span.start >= produced.end - EPS
                continue
            seconds = copy_seconds(case, dep)
            copy = copies.get((span.device, dep))
            if seconds > 0:
                assert copy is not None and abs(copy.duration - seconds) < EPS
                assert copy.start >= produced.end - EPS
                assert span.start >= copy.end + cost.runner.overheads.handoff - EPS
                assert copy.label == ("" if config.copy_streams else ON_COMPUTE)
            else:
                assert copy is None and span.start >= produced.end + cost.runner.overheads.handoff - EPS
    # copies: FIFO per directed pair on copy streams; on compute, they also exclude compute
    for src in range(schedule.num_devices):
        for dst in range(schedule.num_devices):
            pair = [c for c in tl.copy_spans(dst) if schedule.device_of(c.task.stage) == src]
            assert disjoint(pair)
    if not config.copy_streams:
        for d in range(schedule.num_devices):
            mine = [c for c in tl.copy_spans() if d in (c.device, schedule.device_of(c.task.stage))]
            assert disjoint(tl.compute_spans(d) + mine)
    # durations: exact without contention, never shorter with it; a pair shares its device (sim.core.sharing)
    for a, b in schedule.pairs:
        ta, tb = nominal_seconds(schedule, cost, a), nominal_seconds(schedule, cost, b)
        first, second = sorted((compute[a], compute[b]), key=lambda s: s.end)
        xa, xb = communication_seconds(cost, a), communication_seconds(cost, b)
        if xa == xb == 0:
            assert abs(first.duration - 2 * min(ta, tb)) < EPS and abs(second.duration - (ta + tb)) < EPS
        else:  # Note [communication]: no faster than alone, no slower than in turn, the busier resource's at least
            assert compute[a].duration >= ta - EPS and compute[b].duration >= tb - EPS
            assert max(ta - xa + tb - xb, xa + xb) - EPS <= second.duration <= ta + tb + EPS
    for task, span in compute.items():
        if task in partner or task in partner.values():
            continue
        if cost.runner.overheads.contention == 0:
            assert abs(span.duration - nominal_seconds(schedule, cost, task)) < EPS
        else:
            assert span.duration >= nominal_seconds(schedule, cost, task) - EPS
    if config.lockstep_forward:
        for task, span in compute.items():
            if task.op is Op.F:
                k = task.microbatch + task.stage
                before = [s.end for t, s in compute.items() if t.op is Op.F and t.microbatch + t.stage == k - 1]
                assert span.start >= max(before, default=0.0) - EPS
    check_memory(tl, schedule)


def check_memory(tl: Timeline, schedule: Schedule) -> None:
    for d in range(schedule.num_devices):
        series = tl.memory_series(d)
        assert series[0] == (0.0, 0) and series[-1][1] == 0  # everything saved is freed by the end
        assert all(b >= 0 for _, b in series)


@PROPERTIES
@given(cases(shared=False, pairs=False))
def test_ablations_never_beat_the_defaults(case: Case) -> None:
    """With one stage per device every link carries one producer's results in its list order, so
    holding anything back (lockstep, no fork/join) can only delay: the timeline is monotone."""
    base = SimConfig(link=case.config.link)
    cost = with_overheads(case.cost, Overheads(task=case.cost.runner.overheads.task,
                                               handoff=case.cost.runner.overheads.handoff))
    fast = simulate(case.schedule, cost, base).makespan
    for config in (SimConfig(link=base.link, lockstep_forward=True),
                   SimConfig(link=base.link, enforce_backward_order=False)):
        assert simulate(case.schedule, cost, config).makespan >= fast - EPS


@PROPERTIES
@given(cases())
def test_simulation_is_deterministic_and_contention_zero_is_free(case: Case) -> None:
    first = simulate(case.schedule, case.cost, case.config)
    assert simulate(case.schedule, case.cost, case.config) == first
    if case.cost.runner.overheads.contention == 0:
        plain = with_overheads(case.cost, Overheads(task=case.cost.runner.overheads.task,
                                                   handoff=case.cost.runner.overheads.handoff))
        assert simulate(case.schedule, plain, case.config).spans == first.spans
    assert all(s.stream == COMPUTE or s.end >= s.start for s in first.spans)


@PROPERTIES
@given(cases())
def test_local_clocks_give_the_general_device_process_s_timeline_bit_for_bit(case: Case) -> None:
    """Note [local clocks] in sim.core.device: the plain path's device loop follows the general one's rules."""
    from sim.core import run

    cost = with_overheads(case.cost, replace(case.cost.runner.overheads, contention=0.0))
    config = replace(case.config, copy_streams=True, lockstep_forward=False)
    assert run.Run(case.schedule, cost, config).local_clocks()  # the plain path is the one under test
    plain = simulate(case.schedule, cost, config)
    original = run.Run.local_clocks
    try:
        run.Run.local_clocks = lambda self: False  # type: ignore[method-assign]
        general = simulate(case.schedule, cost, config)
    finally:
        run.Run.local_clocks = original  # type: ignore[method-assign]
    assert sorted(plain.spans, key=_key) == sorted(general.spans, key=_key)
    assert sorted(plain.memory, key=_sample) == sorted(general.memory, key=_sample)


def _key(span: Span) -> tuple[int, str, str, str, float, float]:
    return (span.device, span.stream, str(span.task), span.label, span.start, span.end)


def _sample(sample: MemorySample) -> tuple[int, float, int]:
    return (sample.device, sample.time, sample.bytes)
