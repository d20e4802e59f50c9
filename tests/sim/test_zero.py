"""ZeRO stages 0-3: Rajbhandari et al.'s Figure 1 in closed form, the traffic's volumes, and the steps they make.

``Psi`` parameters over ``Nd`` replicas, ``K`` = 12 bytes of optimizer state per parameter (32-bit master and Adam's
two moments), as the paper's Figure 1 (7.5 B parameters, 64 GPUs: 120, 31.4, 16.6 and 1.9 GB).
"""

from __future__ import annotations

import random

import pytest

from gpipe.schedule import Checkpoint, Op, gpipe, schedule_kind
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.planning.cluster import Cluster
from sim.planning.collectives import (
    allgather_seconds,
    allreduce_seconds,
    hierarchical_allgather_seconds,
    hierarchical_allreduce_seconds,
    hierarchical_reduce_scatter_seconds,
    reduce_scatter_seconds,
)
from sim.planning.replicas import step_seconds
from sim.planning.training import TRAINING, Training, training_policy
from sim.planning.zero import (
    ZERO_STAGES,
    Collective,
    Kind,
    ModelState,
    Transient,
    When,
    compute_copy_bytes,
    sharded_state,
    stage_traffic,
    stretched,
    task_seconds,
    transient_bytes,
)

PSI, ND, K = 7_500_000_000, 64, 12
UNIT = LinkSpec("unit", 0.0, 1.0)  # 1 B/s: a ring over 2 replicas moves half the bytes in as many seconds


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
        assert stage_traffic(2000, 2000, z, 1) == ()


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
                 lambda: stage_traffic(20, 20, zero, replicas)):
        with pytest.raises(ValueError, match=message):
            call()
    schedule = gpipe(1, 1)
    with pytest.raises(ValueError, match=message):
        step_seconds(schedule, simulate(schedule, CostModel.uniform(1, 1.0, 1.0)), [1], [0.0], replicas, UNIT,
                     zero=zero, parameter_bytes=[1])


def test_sharded_stages_need_the_parameter_bytes_they_gather() -> None:
    schedule = gpipe(2, 2)
    timeline = simulate(schedule, CostModel.uniform(2, 1.0, 2.0))
    with pytest.raises(ValueError, match="ZeRO-1 needs parameter_bytes per stage"):
        step_seconds(schedule, timeline, [1, 3], [0.0, 0.0], 2, UNIT, zero=1)


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


def _volume(zero: int, micro_batches: int, replicas: int = 8) -> float:
    training, parameters = training_policy("bf16-adam"), 1_000_000
    traffic = stage_traffic(parameters * training.gradient_bytes, compute_copy_bytes(parameters, training), zero,
                            replicas)
    return sum(c.per_step(micro_batches) * c.sent_bytes(replicas) for c in traffic)


def test_volumes_per_step() -> None:
    """Stages 1 and 2 send what the all-reduce sends (section 7.2.1), stage 3 1.5 times (7.2.2), for one
    micro-batch; with m, stage 2 reduce-scatters every one: (m + 1) / 2 times, stage 3 3m / 2 times."""
    plain = _volume(0, 1)
    assert plain == 2 * 7 / 8 * 2_000_000 == _volume(0, 4)
    assert _volume(1, 1) == _volume(1, 4) == plain and _volume(2, 1) == plain
    assert _volume(3, 1) == pytest.approx(1.5 * plain, rel=1e-15)
    assert _volume(2, 4) == pytest.approx(5 / 2 * plain, rel=1e-15)
    assert _volume(3, 4) == pytest.approx(6 * plain, rel=1e-15)


def test_the_traffic_as_data() -> None:
    rs, ag = Kind.REDUCE_SCATTER, Kind.ALL_GATHER
    assert stage_traffic(4, 2, 0, 2) == (Collective(Kind.ALL_REDUCE, 4, When.LAST_GRADIENT),)
    assert stage_traffic(4, 2, 1, 2) == (Collective(rs, 4, When.LAST_GRADIENT), Collective(ag, 2, When.AFTER_STEP))
    assert stage_traffic(4, 2, 2, 2) == (Collective(rs, 4, When.EACH_GRADIENT), Collective(ag, 2, When.AFTER_STEP))
    zero3 = stage_traffic(4, 2, 3, 2)
    assert zero3 == (Collective(ag, 2, When.FORWARD), Collective(ag, 2, When.BACKWARD),
                     Collective(rs, 4, When.GRADIENT))
    assert [c.when.in_task for c in zero3] == [True] * 3
    assert str(zero3[2]) == "reduce-scatter of 4 B inside each gradient task"
    assert [c.per_step(4, recomputes=3) for c in zero3] == [7, 4, 4]


# Today's step_seconds on four simulated schedules (stage j: F = 1 + j/4, B = 2 + (j mod 2)/2, W = 3/4 where
# split; copies 1/8 s; 3 + j gradient bytes; 4 replicas on a link of 4 B/s and 1 ms): alone, and through a
# cluster of 2 GPUs a node whose port (1 B/s, 10 ms) makes the reduction hierarchical.
PINNED = [
    ("1f1b", 8, 4, None, "never", (47.131, 1.1310000000000002), (50.56, 4.560000000000002)),
    ("gpipe", 4, 3, None, "except_last", (28.381, 1.1310000000000002), (31.81, 4.559999999999999)),
    ("zb-h1", 6, 4, None, "never", (40.881, 1.1310000000000002), (44.435, 4.685000000000002)),
    ("interleaved-1f1b", 4, 4, 2, "never", (37.381, 1.1310000000000002), (44.245000000000005, 7.9950000000000045)),
]


@pytest.mark.parametrize(("name", "m", "n", "devices", "checkpoint", "ring", "hierarchical"), PINNED)
def test_zero_0_is_todays_step(name: str, m: int, n: int, devices: int | None, checkpoint: Checkpoint,
                               ring: tuple[float, float], hierarchical: tuple[float, float]) -> None:
    kind = schedule_kind(name)
    schedule = kind(m, n, checkpoint) if devices is None else kind(m, n, checkpoint, devices=devices)
    split = schedule.splits_weight_gradient
    stages = tuple(StageCost(1.0 + 0.25 * j, 2.0 + 0.5 * (j % 2), weight=0.75 if split else 0.0) for j in range(n))
    timeline = simulate(schedule, CostModel(stages, copy_seconds=0.125))
    grads, updates, link = [3.0 + j for j in range(n)], [0.25 * (d + 1) for d in range(schedule.num_devices)], \
        LinkSpec("l", 1e-3, 4.0)
    cluster = Cluster(link, 2, LinkSpec("p", 1e-2, 1.0))

    def over(nbytes: float, d: int) -> float:
        return cluster.allreduce_seconds(nbytes, 1, schedule.num_devices, 4, d)

    assert step_seconds(schedule, timeline, grads, updates, 4, link) == ring
    assert step_seconds(schedule, timeline, grads, updates, 4, link, zero=0) == ring
    assert step_seconds(schedule, timeline, grads, updates, 4, link, over, zero=0) == hierarchical


def test_the_step_of_each_stage() -> None:
    """GPipe, 2 stages, 2 micro-batches, F = 1 s, B = 2 s, 2 replicas on 1 B/s; gradients 1 and 6 B, compute
    copies 2 and 4 B, optimizer steps 0.25 and 0.5 s. Stage 1's backwards end at 5 and 7, stage 0's at 7 and 9::

        ZeRO-0  all-reduce  s1 7 -> 13 (6 s)            s0 9 -> 10        step 13 + 0.5
        ZeRO-1  reduce-sc.  s1 7 -> 10 (3 s)            s0 9 -> 9.5       step 10 + max(0.125 + 1, 0.25 + 2)
        ZeRO-2  reduce-sc.  s1 5 -> 8, 8 -> 11          s0 7.5, 9.5       step 11 + 2.25
    """
    schedule = gpipe(2, 2, "never")
    timeline = simulate(schedule, CostModel.uniform(2, 1.0, 2.0))
    assert timeline.makespan == 9.0

    def step(zero: int) -> tuple[float, float]:
        return step_seconds(schedule, timeline, [1, 6], [0.25, 0.5], 2, UNIT, zero=zero, parameter_bytes=[2, 4])

    assert step(0) == (13.5, 4.0)
    assert step(1) == (12.25, 1.0 + 2.0)
    assert step(2) == (13.25, 2.0 + 2.0)
    cluster = Cluster(UNIT, 8)
    priced = step_seconds(schedule, timeline, [1, 6], [0.25, 0.5], 2, UNIT, zero=2, parameter_bytes=[2, 4],
                          reduce_scatter=lambda b, d: cluster.reduce_scatter_seconds(b, 1, 2, 2, d),
                          allgather=lambda b, d: cluster.allgather_seconds(b, 1, 2, 2, d))
    assert priced == step(2)


def test_zero_3_stretches_the_tasks_and_adds_nothing_after_them() -> None:
    """2 replicas on 1 B/s, a 3 B compute copy (gathered in 1.5 s) and 2 B of gradients (reduced in 1 s): F lasts
    max(1, 1.5) and B max(2, 1.5 + 1), so GPipe takes (m + n - 1)(1.5 + 2.5); the optimizer steps half its state."""
    traffic = stage_traffic(2, 3, 3, 2)

    def seconds(c: Collective) -> float:
        return reduce_scatter_seconds(c.nbytes, 2, UNIT)

    assert [task_seconds(traffic, op, False, seconds) for op in (Op.F, Op.R, Op.B, Op.W)] == [1.5, 1.5, 2.5, 0.0]
    assert [task_seconds(traffic, op, True, seconds) for op in (Op.F, Op.R, Op.B, Op.W)] == [1.5, 1.5, 1.5, 1.0]
    stage = stretched(StageCost(1.0, 2.0), traffic, False, seconds)
    assert (stage.forward, stage.backward, stage.recompute) == (1.5, 2.5, None)
    split = stretched(StageCost(1.0, 1.0, 0.25, weight=1.5, forward_checkpointed=0.5), traffic, True, seconds)
    assert (split.forward, split.backward, split.weight, split.recompute, split.forward_checkpointed) == \
        (1.5, 1.5, 1.5, 1.5, 1.5)
    plain = StageCost(1.0, 2.0)
    assert stretched(plain, stage_traffic(2, 3, 2, 2), False, seconds) is plain
    schedule = gpipe(2, 2, "never")
    timeline = simulate(schedule, CostModel((stage, stage), copy_seconds=0.0))
    assert timeline.makespan == 3 * 4.0
    assert step_seconds(schedule, timeline, [2, 2], [0.5, 1.0], 2, UNIT, zero=3, parameter_bytes=[3, 3]) == \
        (12.5, 0.0)
