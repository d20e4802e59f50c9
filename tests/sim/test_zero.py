"""ZeRO stages 0-3: Rajbhandari et al.'s Figure 1 in closed form, the traffic's volumes, and the steps they make.

``Psi`` parameters over ``Nd`` replicas, ``K`` = 12 bytes of optimizer state per parameter (32-bit master and Adam's
two moments), as the paper's Figure 1 (7.5 B parameters, 64 GPUs: 120, 31.4, 16.6 and 1.9 GB).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter

import pytest

from gpipe.schedule import Checkpoint, Op, Schedule, gpipe, schedule_kind
from gpipe.schedule.timeline import COLLECTIVE, Timeline
from gpipe.schedule.trace import chrome_trace
from sim.core.collectives import Gather, StageCollectives, Unit, add_collectives
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.device import device
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.core.rings import (
    allgather_seconds,
    allreduce_seconds,
    hierarchical_allgather_seconds,
    hierarchical_allreduce_seconds,
    hierarchical_reduce_scatter_seconds,
    reduce_scatter_seconds,
)
from sim.core.run import Run
from sim.planning.counting.training import TRAINING, Training, training_policy
from sim.planning.parallel.cluster import Cluster
from sim.planning.parallel.replicas import step_seconds
from sim.planning.parallel.zero import (
    ZERO_STAGES,
    Kind,
    ModelState,
    Transient,
    after_step_bytes,
    sent_per_step,
    sharded_state,
    stage_collectives,
    transient_bytes,
    units,
)

PSI, ND, K = 7_500_000_000, 64, 12
UNIT = LinkSpec("unit", 0.0, 1.0)  # 1 B/s: a ring over 2 replicas moves half the bytes in as many seconds


def _ring(replicas: int, link: LinkSpec = UNIT) -> Callable[[Kind, float], float]:
    """``(kind, bytes) -> seconds`` of a ring over ``replicas`` on ``link``."""
    ring = {Kind.ALL_REDUCE: allreduce_seconds, Kind.REDUCE_SCATTER: reduce_scatter_seconds,
            Kind.ALL_GATHER: allgather_seconds}
    return lambda kind, nbytes: ring[kind](nbytes, replicas, link)


def _stage(training: Training, parameters: int = PSI) -> StageCost:
    return StageCost(1.0, 2.0, parameter_bytes=parameters * training.weight_bytes,
                     gradient_bytes=parameters * training.gradient_bytes,
                     optimizer_bytes=parameters * training.optimizer_bytes)


@pytest.mark.parametrize(("policy", "g"), [("bf16-adam", 2), ("bf16-adam-fp32grad", 4)])
def test_figure_1_closed_forms(policy: str, g: int) -> None:
    training = training_policy(policy)
    states = [sharded_state(_stage(training), PSI, training, z, ND) for z in ZERO_STAGES]
    assert [s.total for s in states] == [(2 + g + K) * PSI, 2 * PSI + g * PSI + K * PSI // ND,
                                         2 * PSI + (g + K) * PSI // ND, (2 + g + K) * PSI // ND]
    # stage 1 moves the 32-bit master with the optimizer state: 2 Psi of copy plus 4 Psi / Nd of master remain
    assert states[1] == ModelState(2 * PSI + 4 * PSI // ND, g * PSI, 8 * PSI // ND)
    if policy == "bf16-adam":
        assert [round(s.total / 1e9, 1) for s in states] == [120.0, 31.4, 16.6, 1.9]


def test_without_mixed_precision_there_is_no_master_to_shard() -> None:
    training = training_policy("fp32-adam")  # 4 + 4 + 8 bytes a parameter; the weights are the compute copy
    states = [sharded_state(_stage(training), PSI, training, z, ND) for z in ZERO_STAGES]
    assert [(s.parameters, s.gradients, s.optimizer) for s in states] == [
        (4 * PSI, 4 * PSI, 8 * PSI), (4 * PSI, 4 * PSI, 8 * PSI // ND), (4 * PSI, 4 * PSI // ND, 8 * PSI // ND),
        (4 * PSI // ND, 4 * PSI // ND, 8 * PSI // ND)]


def test_one_replica_shards_nothing_and_sends_nothing() -> None:
    training = training_policy("bf16-adam")
    stage = _stage(training, 1000)
    for z in ZERO_STAGES:
        assert sharded_state(stage, 1000, training, z, 1) == ModelState(6000, 2000, 8000)
        assert transient_bytes([400, 600], training, z, 1) == Transient()
        assert stage_collectives([400, 600], [0.5, 0.5], training, z, 1, _ring(1)) is None
        assert after_step_bytes(2000, z, 1) == 0.0


@pytest.mark.parametrize("replicas", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("policy", sorted(TRAINING))
def test_memory_never_grows_with_the_stage(policy: str, replicas: int) -> None:
    training, parameters = training_policy(policy), 1_000_003  # a shard rounds up
    stage = _stage(training, parameters)
    states = [sharded_state(stage, parameters, training, z, replicas) for z in ZERO_STAGES]
    for a, b in zip(states, states[1:], strict=False):
        assert b.parameters <= a.parameters and b.gradients <= a.gradients and b.optimizer <= a.optimizer
        assert b.total <= a.total
    assert states[0] == ModelState(stage.parameter_bytes, stage.gradient_bytes, stage.optimizer_bytes)


def test_buffers_stay_whole_and_short_parameter_bytes_are_refused() -> None:
    training = training_policy("bf16-adam")
    buffered = StageCost(1.0, 1.0, parameter_bytes=6 * 100 + 50, gradient_bytes=200, optimizer_bytes=800)
    assert sharded_state(buffered, 100, training, 3, 4) == ModelState(2 * 25 + 4 * 25 + 50, 50, 200)
    with pytest.raises(ValueError, match="cannot hold 100 parameters"):
        sharded_state(StageCost(1.0, 1.0, parameter_bytes=500), 100, training, 1, 4)


@pytest.mark.parametrize(("zero", "replicas", "message"), [
    (4, 2, "unknown ZeRO stage 4; known: 0, 1, 2, 3"), (-1, 2, "unknown ZeRO stage -1"),
    (True, 2, "unknown ZeRO stage True"), (1, 0, "replicas must be an integer >= 1, got 0"),
])
def test_clear_errors(zero: int, replicas: int, message: str) -> None:
    training = training_policy("bf16-adam")
    for call in (lambda: sharded_state(_stage(training, 10), 10, training, zero, replicas),
                 lambda: transient_bytes([10], training, zero, replicas),
                 lambda: stage_collectives([10], [1.0], training, zero, replicas, _ring(replicas)),
                 lambda: after_step_bytes(20, zero, replicas)):
        with pytest.raises(ValueError, match=message):
            call()
    schedule = gpipe(1, 1)
    with pytest.raises(ValueError, match=message):
        step_seconds(simulate(schedule, CostModel.uniform(1, 1.0, 1.0)), [0.0], replicas, zero)


def test_a_sharding_group_divides_the_replicas() -> None:
    training = training_policy("bf16-adam")
    with pytest.raises(ValueError, match="a sharding group of 3 replicas does not divide the 8 replicas"):
        stage_collectives([10], [1.0], training, 3, 8, _ring(8), shard=3)
    with pytest.raises(ValueError, match="hybrid sharding needs the price of the all-reduce across the groups"):
        stage_collectives([10], [1.0], training, 3, 8, _ring(4), shard=4)


def test_transient_bytes_a_bucket_and_two_gathered_layers() -> None:
    """Layers of 10, 30 and 20 parameters, bf16-adam: ZeRO-2 a bucket of the stage's 60 gradients (2 B each),
    ZeRO-3 also the largest two consecutive layers' 16-bit copies (30 + 20)."""
    training, layers = training_policy("bf16-adam"), [10, 30, 20]
    assert [transient_bytes(layers, training, z, 4) for z in ZERO_STAGES] == [
        Transient(), Transient(), Transient(0, 120), Transient(100, 220)]
    assert transient_bytes(layers, training, 2, 4, bucket_elements=40) == Transient(0, 80)
    assert transient_bytes([7], training, 3, 4) == Transient(14, 28)


def test_reduce_scatter_and_all_gather_make_the_all_reduce_exactly() -> None:
    rng = random.Random(0)
    for _ in range(500):
        link = LinkSpec("l", rng.uniform(0, 1e-4), rng.uniform(1e9, 9e11))
        nic = LinkSpec("n", rng.uniform(0, 1e-4), rng.uniform(1e9, 1e11))
        nbytes, r, g, n = rng.uniform(0, 1e11), rng.randint(1, 64), rng.randint(1, 8), rng.randint(1, 16)
        ring = 2 * (r - 1) / r * nbytes / link.bandwidth + 2 * (r - 1) * link.latency if r > 1 else 0.0
        assert allreduce_seconds(nbytes, r, link) == ring
        assert reduce_scatter_seconds(nbytes, r, link) + allgather_seconds(nbytes, r, link) == ring
        assert hierarchical_reduce_scatter_seconds(nbytes, g, n, link, nic) \
            + hierarchical_allgather_seconds(nbytes, g, n, link, nic) \
            == hierarchical_allreduce_seconds(nbytes, g, n, link, nic)


def test_a_reduce_scatter_across_nodes_is_hierarchical() -> None:
    """8 replicas of a 2-GPU pipeline, 8 GPUs a node: 4 of each group in each of 2 nodes. In the node a ring of 4
    on the link leaves each GPU a summed quarter; across nodes a ring of 2 on one GPU's port halves it again."""
    link, port = LinkSpec("in-node", 1e-6, 200e9), LinkSpec("port", 5e-6, 25e9)
    cluster, nbytes = Cluster(link, 8, port), 1e9
    inside = 3 / 4 * nbytes / link.bandwidth + 3 * link.latency
    across = 1 / 2 * (nbytes / 4) / port.bandwidth + 1 * port.latency
    assert cluster.reduce_scatter_seconds(nbytes, 1, 2, 8, 0) == pytest.approx(inside + across, rel=1e-12)
    assert cluster.allgather_seconds(nbytes, 1, 2, 8, 1) == pytest.approx(inside + across, rel=1e-12)
    assert cluster.reduce_scatter_seconds(nbytes, 1, 2, 8, 0) > reduce_scatter_seconds(nbytes, 8, link)
    assert Cluster(link, 8).reduce_scatter_seconds(nbytes, 1, 2, 8, 0) == reduce_scatter_seconds(nbytes, 8, link)


def test_units_join_small_layers() -> None:
    """Note [units]: a unit closes at half the largest layer (50): 1 + 100, 100, 2 + 100, and the trailing 3 joins
    the last; each unit computes its layers' shares."""
    got = units([1, 100, 100, 2, 100, 3], [0.0, 0.25, 0.25, 0.0, 0.25, 0.25])
    assert [n for n, _ in got] == [101, 100, 105]
    assert [x for _, x in got] == pytest.approx([0.25, 0.25, 0.5])
    assert units([4, 4], [0.0, 0.0]) == [(4, 0.5), (4, 0.5)]  # no compute counted: the parameters' shares


def _run(schedule_name: str, zero: int, m: int = 4, checkpoint: Checkpoint = "never", *, reshard: bool = True,
         layers: int = 2, n: int = 2, devices: int | None = None) -> Timeline:
    """A schedule whose stages each hold ``layers`` layers of 10 parameters, its collectives over 4 replicas."""
    training = training_policy("bf16-adam")
    kind = schedule_kind(schedule_name)
    schedule = kind(m, n, checkpoint) if devices is None else kind(m, n, checkpoint, devices=devices)
    split = schedule.splits_weight_gradient
    collectives = stage_collectives([10] * layers, [1.0] * layers, training, zero, 4, _ring(4),
                                    reshard_after_forward=reshard)
    stage = StageCost(1.0, 2.0, weight=0.5 if split else 0.0, collectives=collectives)
    return simulate(schedule, CostModel((stage,) * n))


def _count(timeline: Timeline, device: int = 0) -> dict[str, int]:
    out: dict[str, int] = {}
    for span in timeline.collective_spans(device):
        kind = span.label.split(" unit")[0]
        out[kind] = out.get(kind, 0) + 1
    return out


@pytest.mark.parametrize(("zero", "checkpoint", "reshard", "expected"), [
    (0, "never", True, {"all-reduce": 2}),  # each of the 2 units once, as the last backward makes it
    (1, "never", True, {"reduce-scatter": 2}),
    (2, "never", True, {"reduce-scatter": 2 * 4}),  # every micro-batch
    (3, "never", True, {"all-gather": 2 * (4 + 4), "reduce-scatter": 2 * 4}),  # before every F and B
    (3, "always", True, {"all-gather": 2 * (4 + 4 + 4), "reduce-scatter": 2 * 4}),  # and every R
    (3, "never", False, {"all-gather": 2, "reduce-scatter": 2 * 4}),  # once a step
])
def test_the_collective_tasks_of_each_stage(zero: int, checkpoint: Checkpoint, reshard: bool,
                                            expected: dict[str, int]) -> None:
    """1F1B, 4 micro-batches, 2 stages of 2 units each, 4 replicas: the collectives on device 0's stream."""
    timeline = _run("1f1b", zero, checkpoint=checkpoint, reshard=reshard)
    assert _count(timeline) == expected == _count(timeline, 1)
    assert all(s.stream == COLLECTIVE and s.end > s.start for s in timeline.collective_spans())
    assert timeline.copy_spans() == []  # copies are free here, and a collective is not a copy


def test_split_backward_reduces_after_w_and_gathers_before_b() -> None:
    """ZB-H1 splits B and W: ZeRO-3 reduces each unit after every W, and W gathers nothing."""
    timeline = _run("zb-h1", 3)
    assert _count(timeline) == {"all-gather": 2 * (4 + 4), "reduce-scatter": 2 * 4}
    served = {s.task.op.value for s in timeline.collective_spans() if s.label.startswith("reduce-scatter")}
    assert served == {"W"}
    assert {s.task.op.value for s in timeline.collective_spans() if s.label.startswith("all-gather")} == {"F", "B"}


def test_overlapped_pairs_gather_first_and_reduce_after() -> None:
    """DualPipeV's pairs: every collective of a ZeRO-3 stage still runs, none during a pair's own tasks."""
    timeline = _run("dualpipe-v", 3, m=8, n=4, devices=2)
    assert _count(timeline) == {"all-gather": 2 * 2 * (8 + 8), "reduce-scatter": 2 * 2 * 8}


def test_buckets_overlap_the_last_backward() -> None:
    """One stage, one micro-batch, F = 1 s, B = 4 s, 2 replicas on 1 B/s. One unit of 4 parameters (8 B of
    gradients, all-reduced in 8 s) reduces after B: 5 -> 13. Four units of 1 reduce as B makes each (reverse order,
    each 2 s): 2 -> 4, 4 -> 6, 6 -> 8, 8 -> 10."""
    training = training_policy("bf16-adam")
    ends = []
    for layers in ([4], [1, 1, 1, 1]):
        shares = [1.0] * len(layers)
        stage = StageCost(1.0, 4.0, collectives=stage_collectives(layers, shares, training, 0, 2, _ring(2)))
        ends.append(simulate(gpipe(1, 1, "never"), CostModel((stage,))).end)
    assert ends == [13.0, 10.0]


def test_the_step_of_each_stage() -> None:
    """GPipe, 2 stages, 2 micro-batches, F = 1 s, B = 2 s, 2 replicas on 1 B/s; stages of 1 and 3 parameters
    (bf16: gradients and compute copies of 2 and 6 B), optimizer steps 0.25 and 0.5 s. Stage 1's backwards end at
    5 and 7, stage 0's at 7 and 9::

        ZeRO-0  all-reduce  s1 7 -> 13                  s0 9 -> 11        step 13 + 0.5
        ZeRO-1  reduce-sc.  s1 7 -> 10                  s0 9 -> 10        step 10 + max(0.125 + 1, 0.25 + 3)
        ZeRO-2  reduce-sc.  s1 5 -> 8, 8 -> 11          s0 7 -> 8, 9 -> 10   step 11 + 3.25
    """
    training, schedule = training_policy("bf16-adam"), gpipe(2, 2, "never")

    def step(zero: int) -> tuple[float, float]:
        stages = tuple(StageCost(1.0, 2.0, collectives=stage_collectives([n], [1.0], training, zero, 2, _ring(2)))
                       for n in (1, 3))
        timeline = simulate(schedule, CostModel(stages))
        after = [allgather_seconds(after_step_bytes(2 * n, zero, 2), 2, UNIT) for n in (1, 3)]
        return step_seconds(timeline, [0.25, 0.5], 2, zero, after)

    assert step(0) == (13.5, 4.0)
    assert step(1) == (13.25, 1.0 + 3.0)
    assert step(2) == (14.25, 2.0 + 3.0)


def test_zero_3_gathers_before_each_task_one_unit_ahead() -> None:
    """One stage, GPipe, 2 micro-batches, F = 1 s, B = 2 s, one unit of 1 parameter over 2 replicas on 1 B/s (each
    gather and reduce-scatter 1 s). Gathers: F0's at 0 -> 1; F1's prefetched as F0 starts, 1 -> 2; B1's as F1
    starts, 2 -> 3; B0's as B1 starts, 3 -> 4. F0 1 -> 2, F1 2 -> 3, B1 3 -> 5 (reduce 5 -> 6), B0 5 -> 7 (reduce
    7 -> 8): the step is 8 + the halved optimizer step."""
    training = training_policy("bf16-adam")
    stage = StageCost(1.0, 2.0, collectives=stage_collectives([1], [1.0], training, 3, 2, _ring(2)))
    timeline = simulate(gpipe(2, 1, "never"), CostModel((stage,)))
    assert [(s.start, s.end) for s in timeline.collective_spans()] == [
        (0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0)]
    assert [(s.start, s.end) for s in timeline.compute_spans()] == [(1.0, 2.0), (2.0, 3.0), (3.0, 5.0), (5.0, 7.0)]
    assert step_seconds(timeline, [0.5], 2, 3) == (8.25, 1.0)


def test_hybrid_sharding_all_reduces_the_shard_across_groups() -> None:
    """HSDP: 8 replicas in groups of 4; each unit's reduced shard (1/4 of its gradients) is all-reduced across the
    2 groups after the last backward, once a step."""
    training = training_policy("bf16-adam")
    collectives = stage_collectives([8, 8], [1.0, 1.0], training, 3, 8, _ring(4), shard=4,
                                    replicate=lambda nbytes: allreduce_seconds(nbytes, 2, UNIT))
    assert collectives is not None
    assert [u.replicate for u in collectives.units] == [allreduce_seconds(16 / 4, 2, UNIT)] * 2
    timeline = simulate(gpipe(3, 1, "never"), CostModel((StageCost(1.0, 2.0, collectives=collectives),)))
    assert _count(timeline)["all-reduce across replicas"] == 2


def test_gathers_need_the_plain_path_and_collectives_show_in_the_trace() -> None:
    gathering = StageCost(1.0, 2.0, collectives=StageCollectives((Unit(1.0, gather=0.5),), Gather.EACH_TASK))
    with pytest.raises(ValueError, match="plain path only"):
        simulate(gpipe(2, 1), CostModel((gathering,)), SimConfig(copy_streams=False))
    stage = StageCost(1.0, 2.0, collectives=StageCollectives((Unit(1.0, reduce=0.5),)))
    off_path = simulate(gpipe(2, 1, "never"), CostModel((stage,)), SimConfig(copy_streams=False))
    assert [(s.start, s.end) for s in off_path.collective_spans()] == [(6.0, 6.5)]  # after the last B, 4 -> 6
    with pytest.raises(ValueError, match="shares of a stage must sum to 1"):
        StageCollectives((Unit(0.5),))
    with pytest.raises(ValueError, match="Unit.gather must be a finite number >= 0"):
        Unit(1.0, gather=-1.0)
    timeline = simulate(gpipe(2, 1), CostModel((stage,)))
    threads = {e["args"]["name"] for e in chrome_trace(timeline)["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"compute", "collective"}
    once = StageCollectives((Unit(1.0),), Gather.ONCE)
    assert [once.gathers(op, first) for op, first in ((Op.F, True), (Op.F, False), (Op.B, False))] == \
        [True, False, False]


@pytest.mark.parametrize(("zero", "checkpoint", "reshard"), [
    (0, "never", True), (1, "never", True), (2, "never", True), (3, "never", True), (3, "always", True),
    (3, "never", False)])
def test_the_bytes_sent_are_the_simulated_collectives(zero: int, checkpoint: Checkpoint, reshard: bool) -> None:
    """sent_per_step's closed form against the collectives the simulation ran: each span's label carries its bytes
    (1F1B, 4 micro-batches, 2 units of 10 bf16 parameters a stage, 4 replicas)."""
    timeline = _run("1f1b", zero, checkpoint=checkpoint, reshard=reshard)
    share = {"all-reduce": 2 * 3 / 4, "reduce-scatter": 3 / 4, "all-gather": 3 / 4}
    sent = sum(share[s.label.split(" unit")[0]] * float(s.label.split("(")[1].split(" B")[0])
               for s in timeline.collective_spans(0))
    recomputes = 4 if checkpoint == "always" else 0
    assert sent == pytest.approx(sent_per_step(40, 40, zero, 4, 4, recomputes, reshard_after_forward=reshard)
                                 - after_step_bytes(40, zero, 4) * 3 / 4)


def _in_loop(schedule: Schedule, cost: CostModel) -> Timeline:
    """The device loop with the collectives in it (what a gathering stage runs), for stages that only reduce."""
    run = Run(schedule, cost, SimConfig())
    for d in range(run.devices):
        run.env.process(device(run, d))
    run.env.run()
    return run.timeline()


@pytest.mark.parametrize(("name", "devices"), [("1f1b", None), ("zb-h1", None), ("interleaved-1f1b", 2),
                                               ("dualpipe-v", 2)])
@pytest.mark.parametrize("zero", [0, 1, 2])
def test_reductions_after_the_fact_are_the_device_loop_s(name: str, devices: int | None, zero: int) -> None:
    """Note [collectives after the fact]: where nothing gathers, the compute timeline plus each device's stream run
    over it equals the simulation with the collectives in the loop, span for span."""
    training = training_policy("bf16-adam")
    kind = schedule_kind(name)
    schedule = kind(8, 4, "never") if devices is None else kind(8, 4, "never", devices=devices)
    split = schedule.splits_weight_gradient
    rng = random.Random(zero)
    stages = tuple(StageCost(rng.uniform(0.5, 1.5), rng.uniform(1.0, 2.0), weight=0.5 if split else 0.0,
                             collectives=stage_collectives([10, 20, 30], [0.2, 0.3, 0.5], training, zero, 4,
                                                           _ring(4)))
                   for _ in range(4))
    cost = CostModel(stages, copy_seconds=0.1)
    after, loop = simulate(schedule, cost), _in_loop(schedule, cost)
    key = attrgetter("device", "stream", "task", "label")
    got, want = {key(s): (s.start, s.end) for s in after.spans}, {key(s): (s.start, s.end) for s in loop.spans}
    assert got.keys() == want.keys() and len(got) == len(after.spans)
    for k, times in got.items():  # equal but for rounding: a unit's end is summed from its task's span here
        assert times == pytest.approx(want[k], rel=1e-12), k
    assert after.collective_spans()


def test_collectives_added_keep_the_timeline_s_measures() -> None:
    """Timeline.with_spans: a timeline measured before its collectives are added carries its per-device measures
    over, and they equal those of one measured after."""
    stage = StageCost(1.0, 2.0, saved_bytes=10, collectives=StageCollectives((Unit(1.0, reduce=0.5),)))
    cost = CostModel((stage, stage), copy_seconds=0.25)
    base = simulate(gpipe(4, 2, "never"), CostModel((replace(stage, collectives=None),) * 2, copy_seconds=0.25))
    measured = [(base.busy(d), base.peak_memory(d), len(base.compute_spans(d))) for d in range(2)]
    added = add_collectives(base, gpipe(4, 2, "never"), [stage.collectives] * 2)
    fresh = simulate(gpipe(4, 2, "never"), cost)
    for timeline in (added, fresh):
        assert [(timeline.busy(d), timeline.peak_memory(d), len(timeline.compute_spans(d))) for d in range(2)] == \
            measured
        assert [len(timeline.collective_spans(d)) for d in range(2)] == [1, 1]
    with pytest.raises(ValueError, match="with_spans adds spans beside the compute"):
        base.with_spans(base.compute_spans(0)[:1])
