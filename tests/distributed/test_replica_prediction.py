"""The simulator's prediction of a replicated pipeline (issue 48), in one process (no ranks): each stage's gradient
all-reduces are the executor's buckets, with its labels and bytes, priced as gloo's ring."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpipe.distributed.reduction import buckets, stage_buckets
from gpipe.schedule import SCHEDULES, Op, Task
from gpipe.schedule.size import format_bytes
from gpipe.schedule.timeline import COLLECTIVE, COMPUTE, Span, Timeline
from sim.calibration.calibrate import partitions_of
from sim.calibration.processes import process_config
from sim.calibration.replicas import (
    Replication,
    compare_collectives,
    replicated,
    unit_shares,
    with_replicas,
    without_loss,
)
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.core.rings import allreduce_seconds

CAP = 200  # bytes: stage 0 in two buckets, stage 1 in four (4-byte floats)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 32), nn.Linear(32, 4))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_the_prediction_reduces_each_executor_bucket_once_with_its_label_and_bytes(name: str) -> None:
    parts = partitions_of(_model(), [2, 2])
    link = LinkSpec("probe", 2e-5, 1e9)
    split = name == "zb-h1"
    plain = CostModel(tuple(StageCost(1e-3, 2e-3, weight=1e-3 if split else 0.0) for _ in parts))
    cost = with_replicas(plain, parts, torch.randn(4, 8), Replication(2, CAP), link, split=split)
    schedule = SCHEDULES[name](4, 2)
    timeline = simulate(schedule, cost, process_config(link))
    last_gradient = {schedule.tasks[d][k].stage: schedule.tasks[d][k] for d in range(2)
                     for k in schedule.gradient_positions[d]}
    for j, part in enumerate(parts):
        buckets = stage_buckets(j, part, CAP)  # what DistributedGPipe reduces, in its order
        spans = [s for s in timeline.collective_spans(j) if s.task.stage == j]
        # the executor's label (gpipe.distributed.reduction, Note [a collective's span]) and gloo's ring price
        assert [s.label for s in spans] == [f"all-reduce unit {b.unit} ({format_bytes(b.nbytes)})" for b in buckets]
        assert [s.duration for s in spans] == pytest.approx([allreduce_seconds(b.nbytes, 2, link) for b in buckets])
        assert {s.task for s in spans} == {last_gradient[j]}  # after the stage's last gradient task
    assert len(timeline.collective_spans()) == 6
    collectives = cost.stages[1].collectives
    assert collectives is not None
    shares = [u.share for u in collectives.units]
    assert len(shares) == 4 and sum(shares) == pytest.approx(1.0) and min(shares) >= 0


def test_a_bucket_ends_where_the_backward_passes_its_first_parameter() -> None:
    part = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    at = {id(p): k for k, p in enumerate(part.parameters())}  # weight 0, bias 0, weight 2, bias 2: 16, 8, 16, 8 B
    each_alone = buckets(0, list(part.parameters()), cap_bytes=16)
    assert {b.unit: [at[id(p)] for p in b.params] for b in each_alone} == {3: [3], 2: [2], 1: [1], 0: [0]}
    # the backward runs layer 2 (3 of 6 s: units 3 and 2 are done), then the ReLU and layer 0 (units 1 and 0)
    assert unit_shares(part, each_alone, [1.0, 2.0, 3.0]) == pytest.approx([0.0, 0.5, 0.0, 0.5])
    assert unit_shares(part, buckets(0, list(part.parameters()), cap_bytes=24), [1.0, 2.0, 3.0]) == \
        pytest.approx([0.5, 0.5])


def test_replicas_are_copied_onto_every_devices_and_the_loss_is_left_out() -> None:
    f = Task(Op.F, 0, 0)
    one = Timeline((Span(0, COMPUTE, f, 0.0, 1.0), Span(0, COLLECTIVE, f, 1.0, 2.0, "all-reduce unit 0 (4 B)")), (), 1)
    two = replicated(one, 2)
    assert two.num_devices == 2 and [s.device for s in two.spans] == [0, 0, 1, 1]
    measured = Timeline((*one.spans, Span(0, COLLECTIVE, f, 2.0, 3.0, "all-reduce loss (4 B)")), (), 1)
    assert without_loss(measured).makespan == 2.0
    with pytest.raises(ValueError, match="--replicas must be an integer >= 1"):
        Replication(0)


def test_a_collective_measured_is_the_groups_shortest_span_of_it() -> None:
    """Note [a collective's own seconds]: replica 0 issued at 0 and waited for replica 1, which issued at 2."""
    b = Task(Op.B, 0, 0)
    label = "all-reduce unit 0 (4 B)"
    predicted = replicated(Timeline((Span(0, COMPUTE, b, 0.0, 2.0), Span(0, COLLECTIVE, b, 2.0, 3.5, label)), (), 1), 2)
    measured = Timeline((Span(0, COMPUTE, b, 0.0, 0.5), Span(0, COLLECTIVE, b, 0.5, 3.0, label),
                         Span(1, COMPUTE, b, 0.0, 2.0), Span(1, COLLECTIVE, b, 2.0, 3.0, label)), (), 2)
    rows = compare_collectives(predicted, measured, 2)
    assert [(r.predicted_seconds, r.measured_seconds, r.recorded_seconds) for r in rows] == [(1.5, 1.0, 2.5),
                                                                                             (1.5, 1.0, 1.0)]
    assert rows[0].error == pytest.approx(0.5)
