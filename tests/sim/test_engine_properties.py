"""Properties every simulated timeline has, for random schedules (every registered one, overlapped pairs too),
placements, costs (with communication inside tasks too) and switches; and the one device loop against the plain
path's recurrence, and on SimPy's clock against its own (Note [local clocks] in sim.core.device)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Op, Schedule, Task
from gpipe.schedule.saved import held_bytes
from gpipe.schedule.timeline import COMPUTE, Span, Timeline
from sim.calibration.host import Overheads, executor_costs, with_overheads
from sim.core.config import SimConfig
from sim.core.copies import ON_COMPUTE
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.core.sharing import phased_pair_ends, task_phases

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


#: The registered schedules whose steady phase overlaps pairs of tasks (Note [overlapped pairs] in
#: gpipe.schedule.schedule).
_PAIRED = ("dualpipe-v", "dualpipe")


@st.composite
def cases(draw: st.DrawFn, shared: bool | None = None, pairs: bool = True) -> Case:
    """A schedule, a cost model and switches. One stage per device (each schedule that allows it), on a random
    placement when ``shared``; or a registered schedule's own layout of two stages per device (``shared`` not
    False), overlapped pairs (:data:`_PAIRED`) only where they are modelled (sim.core.overlap.check_pairs): copy
    streams, no contention."""
    per_device = [k for k, kind in SCHEDULES.items() if kind.place is None]
    placed = [k for k, kind in SCHEDULES.items()
              if kind.place is not None and (pairs or k not in _PAIRED)]
    name = draw(st.sampled_from(per_device + (placed if shared is not False else [])))
    kind = SCHEDULES[name]
    n, m = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    policy = draw(st.sampled_from(CHECKPOINT_MODES))
    share = draw(st.booleans()) if shared is None else shared
    if kind.place is None:
        placement = _surjective(draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))) if share else None
        schedule = kind(m, n, policy, placement)
    else:
        p = draw(st.integers(1, 3))
        n, m = 2 * p, draw(st.integers(2 * p, 2 * p + 3))
        try:
            schedule = kind(m, n, policy, kind.layout(n, p))
        except ValueError:  # a shape the schedule's constraints reject
            assume(False)
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
    over = Overheads(task=draw(st.sampled_from([0.0, 0.05])), handoff=draw(st.sampled_from([0.0, 0.1])),
                     gap=draw(st.sampled_from([0.0, 0.0, 0.07])), launch=draw(st.sampled_from([0.0, 0.2])),
                     contention=0.0 if schedule.pairs else draw(st.sampled_from([0.0, 0.0, 0.5])))
    scale = tuple(draw(st.lists(st.sampled_from([0.5, 1.0, 1.5]), min_size=m, max_size=m))) \
        if draw(st.booleans()) else ()
    cost = with_overheads(CostModel(stages, copy_seconds=copy_seconds, microbatch_scale=scale), over)
    # lockstep is GPipe's host loop; a 1F1B order merged onto shared devices may legally stall under it
    lockstep = draw(st.booleans()) and (name == "gpipe" or schedule.placement == tuple(range(n))) \
        and not schedule.pairs
    config = SimConfig(link=link, copy_streams=bool(schedule.pairs) or draw(st.booleans()),
                       enforce_backward_order=draw(st.booleans()), lockstep_forward=lockstep)
    return Case(schedule, cost, config)


def overheads(cost: CostModel) -> Overheads:
    """The executor's overheads in ``cost`` (every case's runner is the executor's)."""
    return executor_costs(cost).overheads


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
            + overheads(cost).task)


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
                assert span.start >= copy.end + overheads(cost).handoff - EPS
                assert copy.label == ("" if config.copy_streams else ON_COMPUTE)
            else:
                assert copy is None and span.start >= produced.end + overheads(cost).handoff - EPS
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
        if overheads(cost).contention == 0:
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
    cost = with_overheads(case.cost, Overheads(task=overheads(case.cost).task,
                                               handoff=overheads(case.cost).handoff))
    fast = simulate(case.schedule, cost, base).makespan
    for config in (SimConfig(link=base.link, lockstep_forward=True),
                   SimConfig(link=base.link, enforce_backward_order=False)):
        assert simulate(case.schedule, cost, config).makespan >= fast - EPS


@PROPERTIES
@given(cases())
def test_simulation_is_deterministic_and_contention_zero_is_free(case: Case) -> None:
    first = simulate(case.schedule, case.cost, case.config)
    assert simulate(case.schedule, case.cost, case.config) == first
    if overheads(case.cost).contention == 0:
        over = overheads(case.cost)
        plain = with_overheads(case.cost, Overheads(task=over.task, handoff=over.handoff, gap=over.gap,
                                                   launch=over.launch))
        assert simulate(case.schedule, plain, case.config).spans == first.spans
    assert all(s.stream == COMPUTE or s.end >= s.start for s in first.spans)


def plain(case: Case) -> Case:
    """``case`` on the plain path (Run.local_clocks): copy streams, no lockstep, no contention."""
    cost = with_overheads(case.cost, replace(overheads(case.cost), contention=0.0))
    return Case(case.schedule, cost, replace(case.config, copy_streams=True, lockstep_forward=False))


def recurrence(case: Case) -> tuple[dict[Task, tuple[float, float]], dict[tuple[int, Task], tuple[float, float]],
                                    list[list[tuple[float, int]]]]:
    """The plain path's timeline with fork/join, from its recurrence rather than from events: a device's next task
    (or pair) starts once the device is free (``launch``, ``gap`` after its last end) and its inputs are in; a copy
    leaves as its producer ends, after the previous copy on its directed link, and is usable ``handoff`` after it
    arrives; a pair's tasks end as sim.core.sharing says. Returns compute spans, copy spans and memory samples."""
    schedule, cost, over = case.schedule, case.cost, overheads(case.cost)
    where, partner = schedule.device_of, {**dict(schedule.pairs), **{b: a for a, b in schedule.pairs}}
    dsts: dict[Task, set[int]] = {}
    for task in schedule.all_tasks():
        for dep in schedule.dependencies(task):
            if where(dep.stage) != where(task.stage):
                dsts.setdefault(dep, set()).add(where(task.stage))
    spans: dict[Task, tuple[float, float]] = {}
    copies: dict[tuple[int, Task], tuple[float, float]] = {}
    usable: dict[tuple[int, Task], float] = {}
    link_free: dict[tuple[int, int], float] = {}
    memory = [Replay(schedule, cost, d) for d in range(schedule.num_devices)]
    at = [0] * schedule.num_devices
    clock, free_at = [0.0] * schedule.num_devices, [over.launch] * schedule.num_devices
    while sum(at) < sum(map(len, schedule.tasks)):
        moved = False
        for d, tasks in enumerate(schedule.tasks):
            while at[d] < len(tasks):
                group = [tasks[at[d]]] + ([tasks[at[d] + 1]] if tasks[at[d]] in dict(schedule.pairs) else [])
                inputs = [(d, dep) for task in group for dep in schedule.dependencies(task) if where(dep.stage) != d]
                if any(key not in usable for key in inputs):
                    break
                start = max([clock[d], free_at[d]] + [usable[key] for key in inputs])
                alone = [nominal_seconds(schedule, cost, task) for task in group]
                if len(group) == 1:
                    ends = [start + alone[0]]
                else:
                    talk = [communication_seconds(cost, task) for task in group]
                    a, b = (task_phases(s - x, x, t.op is Op.B) for s, x, t in zip(alone, talk, group, strict=True))
                    ends = list(phased_pair_ends(start, a, b))
                for end, task in sorted(zip(ends, group, strict=True), key=lambda e: e[0]):
                    spans[task] = (start, end)
                    memory[d].task(task, start, end)
                    for dst in sorted(dsts.get(task, ())):
                        leave = max(end, link_free.get((d, dst), 0.0))
                        link_free[d, dst] = arrive = leave + copy_seconds(case, task)
                        if arrive > leave:
                            copies[dst, task] = (leave, arrive)
                        usable[dst, task] = arrive + over.handoff
                clock[d] = max(ends)
                if over.gap:
                    free_at[d] = clock[d] + over.gap
                at[d] += len(group)
                moved = True
        assert moved, "the recurrence stalls where the simulation does not"
    assert set(partner) <= set(spans)
    return spans, copies, [r.samples for r in memory]


class Replay:
    """The saved-bytes rule (Note [saved bytes] in gpipe.schedule.saved) applied on one device at the starts and ends
    the recurrence gives its tasks."""

    def __init__(self, schedule: Schedule, cost: CostModel, d: int) -> None:
        stages = cost.stages
        scales = [cost.scale(i) for i in range(schedule.m)] if cost.microbatch_scale else ()
        self.held = held_bytes([schedule.is_checkpointed(i) for i in range(schedule.m)],
                               schedule.splits_weight_gradient, [s.saved_bytes for s in stages],
                               [s.checkpoint_bytes for s in stages], [s.weight_bytes for s in stages], scales)
        self.samples: list[tuple[float, int]] = [(0.0, 0)]

    def _change(self, nbytes: int, time: float) -> None:
        if nbytes:
            self.samples.append((time, self.samples[-1][1] + nbytes))

    def task(self, task: Task, start: float, end: float) -> None:
        at = (list(Op).index(task.op), task.microbatch, task.stage)
        self._change(int(self.held.at_start[at]), start)
        self._change(int(self.held.at_end[at]), end)


@PROPERTIES
@given(cases())
def test_the_plain_path_follows_its_recurrence(case: Case) -> None:
    """Every schedule, placements, copies on links, checkpointing, pairs, communication, scaled micro-batches and
    the runner's costs: the device loop on its local clocks gives the recurrence's every span and memory sample."""
    case = plain(replace(case, config=replace(case.config, enforce_backward_order=True)))
    tl = simulate(case.schedule, case.cost, case.config)
    spans, copies, memory = recurrence(case)
    compute = {s.task: (s.start, s.end) for s in tl.compute_spans()}
    assert compute.keys() == spans.keys()
    assert all(_close(compute[task], spans[task]) for task in spans), case
    sent = {(s.device, s.task): (s.start, s.end) for s in tl.copy_spans()}
    assert sent.keys() == copies.keys() and all(_close(sent[key], copies[key]) for key in copies)
    for d, samples in enumerate(memory):
        got = [(m.time, m.bytes) for m in tl.memory if m.device == d]
        assert [b for _, b in got] == [b for _, b in samples]
        assert all(abs(x - y) < EPS for (x, _), (y, _) in zip(got, samples, strict=True))


@PROPERTIES
@given(cases(pairs=False))
def test_simpy_s_clock_gives_the_local_clocks_timeline(case: Case) -> None:
    """Note [local clocks] in sim.core.device: a device on SimPy's clock computes what one on its own clock does.
    Every device asynchronous with no host seconds is a synchronous device exactly (Note [asynchronous devices]),
    but takes SimPy's clock; fork/join off too, whose stall releases held copies at the latest clock."""
    case = plain(case)
    cost = with_overheads(case.cost, replace(overheads(case.cost), task=0.0, handoff=0.0, gap=0.0))
    local = simulate(case.schedule, cost, case.config)
    every = frozenset(range(case.schedule.num_devices))
    on_simpy = simulate(case.schedule, cost, replace(case.config, asynchronous=every))
    assert [_key(s) for s in sorted(local.spans, key=_key)] == [_key(s) for s in sorted(on_simpy.spans, key=_key)]
    assert all(_close((a.start, a.end), (b.start, b.end))
               for a, b in zip(sorted(local.spans, key=_key), sorted(on_simpy.spans, key=_key), strict=True))
    assert [(m.device, m.bytes) for m in local.memory] == [(m.device, m.bytes) for m in on_simpy.memory]
    assert all(abs(a.time - b.time) < EPS for a, b in zip(local.memory, on_simpy.memory, strict=True))


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) < EPS and abs(a[1] - b[1]) < EPS


def _key(span: Span) -> tuple[int, str, str, str]:
    return (span.device, span.stream, str(span.task), span.label)
