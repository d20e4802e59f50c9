"""Sharded data parallelism in the planner as it runs: FSDP's resharding switch, hybrid sharding, and the collectives
as tasks on the predicted timeline (sim.planning.parallel.zero, sim.core.collectives)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpipe.schedule.timeline import COLLECTIVE
from sim.cli import main
from sim.planning.counting.models import get_model
from sim.planning.plan import PlanRequest, plan, row_timeline
from sim.planning.rows import Plan, PlanRow

SPEC = "gpt:layers=8,hidden=512,heads=8,seq=256,vocab=1000"
ARGV = ["plan", "--model", SPEC, "--batch", "16", "--gpus", "8", "--hardware", "a100-40gb", "--link", "nvlink3",
        "--network", "infiniband-hdr", "--gpus-per-node", "4", "--tensor-parallel", "1", "--stages", "1",
        "--chunks", "2", "--checkpoint", "never", "--schedule", "1f1b", "--no-progress"]


@pytest.fixture(scope="module")
def request_() -> PlanRequest:
    profile = get_model(SPEC).count(torch.bfloat16)
    return PlanRequest(profile=profile, batch=16, device="a100-40gb", gpus=[8], link="nvlink3",
                       network="infiniband-hdr", gpus_per_node=4, stages=[1], chunks=[2], checkpoints=["never"],
                       schedules=["1f1b"], zero=[1, 3], reshard_after_forward=[True, False], tokens_per_sample=256)


@pytest.fixture(scope="module")
def swept(request_: PlanRequest) -> Plan:
    return plan(request_, workers=1)


def _row(result: Plan, zero: int, reshard: bool = True) -> PlanRow:
    return next(r for r in result.rows if r.zero == zero and r.reshard_after_forward == reshard)


def test_resharding_is_swept_for_zero_3_only(swept: Plan) -> None:
    kinds = sorted((r.zero, r.reshard_after_forward) for r in swept.rows)
    assert kinds == [(1, True), (3, False), (3, True)]
    kept, resharded = _row(swept, 3, False), _row(swept, 3, True)
    # kept gathered: the stage's whole compute copy lives through the step, so more memory and fewer gathers
    assert kept.peak_memory_bytes > resharded.peak_memory_bytes
    assert json.loads(json.dumps(kept.to_dict()))["reshard_after_forward"] is False


def test_the_timeline_holds_every_layer_s_collectives(request_: PlanRequest, swept: Plan) -> None:
    """ZeRO-3 resharded, 2 micro-batches, one stage: each unit gathered before both Fs and both Bs and
    reduce-scattered after both Bs; the step is the timeline's end plus the (sharded) optimizer step."""
    row = _row(swept, 3, True)
    timeline = row_timeline(request_, row)
    spans = timeline.collective_spans(0)
    gathers = [s for s in spans if s.label.startswith("all-gather")]
    reductions = [s for s in spans if s.label.startswith("reduce-scatter")]
    assert gathers and len(gathers) == 2 * len(reductions)
    assert {s.task.op.value for s in gathers} == {"F", "B"} and {s.task.op.value for s in reductions} == {"B"}
    assert all(s.stream == COLLECTIVE for s in spans)
    assert timeline.end <= row.step_seconds
    kept = row_timeline(request_, _row(swept, 3, False))
    assert len([s for s in kept.collective_spans(0) if s.label.startswith("all-gather")]) == len(reductions) // 2


def test_hybrid_sharding_holds_more_and_reduces_across_groups(request_: PlanRequest, swept: Plan) -> None:
    asked = replace(request_, zero=[3], reshard_after_forward=[True], shard_group=4)
    (row,) = plan(asked, workers=1).rows
    assert row.shard_group == 4
    assert row.peak_memory_bytes > _row(swept, 3, True).peak_memory_bytes
    spans = row_timeline(asked, row).collective_spans(0)
    assert any(s.label.startswith("all-reduce across replicas") for s in spans)


def test_the_cli_writes_the_best_row_s_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    assert main([*ARGV, "--zero", "3", "--out", str(out)]) == 0
    assert "best.trace.json" in capsys.readouterr().out
    events = json.loads((out / "best.trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == COLLECTIVE and e["name"].startswith("all-gather") for e in events)


@pytest.mark.parametrize(("flags", "message"), [
    (["--reshard-after-forward", "maybe"], "--reshard-after-forward: unknown value 'maybe'"),
    (["--shard-group", "0"], "--shard-group"),
    (["--zero", "4"], "--zero lists ZeRO stages"),
])
def test_the_cli_refuses_bad_sharding_in_one_line(flags: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGV, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
