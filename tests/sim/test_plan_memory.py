"""Memory as the allocator sees it, the all-reduce overlapped with the drain, pinned configurations, the buyer.

Closed forms on uniform stages: ``S`` bytes saved per micro-batch and stage, ``C`` kept when checkpointed.
"""

from __future__ import annotations

import json

import pytest

from gpipe.schedule import SCHEDULES, gpipe, schedule_kind
from sim.cli import main
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.core.rings import allreduce_seconds
from sim.planning.buyer import answer, cheapest
from sim.planning.counting.flops import ModelProfile, count_layers
from sim.planning.counting.models.unet import unet, unet_sample
from sim.planning.parallel.memory import SEGMENT_BYTES, device_memory, round_block, round_segment, workspace_bytes
from sim.planning.plan import PlanRequest, plan

S, C = 1000, 10


def _stages(n: int, **extra: int) -> tuple[StageCost, ...]:
    return (StageCost(1.0, 2.0, send_bytes=0, saved_bytes=S, checkpoint_bytes=C, **extra),) * n


def test_1f1b_with_except_last_holds_two_full_activations() -> None:
    """1F1B recomputes micro-batch 4 on device 0 while the last one (not checkpointed) is still held: 2S + 3C.
    GPipe frees the last micro-batch's activation (its B runs first) before any recompute: S + 7C."""
    f1b = schedule_kind("1f1b")(8, 4, "except_last")
    fill = gpipe(8, 4, "except_last")
    peak = {name: device_memory(s, _stages(4), [0] * 4)[0] for name, s in (("1f1b", f1b), ("gpipe", fill))}
    assert peak["1f1b"].saved == 2 * S + 3 * C and peak["1f1b"].task == "R4@0"
    assert peak["gpipe"].saved == S + 7 * C


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("checkpoint", ["never", "except_last"])
def test_saved_bytes_at_the_peak_are_the_simulators_peak(name: str, checkpoint: str) -> None:
    kind = schedule_kind(name)
    try:
        schedule = kind(8, 4, checkpoint) if kind.place is None else kind(8, 8, checkpoint, devices=4)
    except ValueError:
        pytest.skip(f"{name} does not take this shape")
    stages = _stages(schedule.n)
    timeline = simulate(schedule, CostModel(stages, copy_seconds=0.0))
    parts = device_memory(schedule, stages, [0] * schedule.n)
    assert [p.saved for p in parts] == [timeline.peak_memory(d) for d in range(schedule.num_devices)]


def test_peak_parts_in_closed_form() -> None:
    """One stage, GPipe, two micro-batches: the peak is the first B, both activations held and gradients new."""
    params, grads, opt, working, workspace = 3 * SEGMENT_BYTES, 2 * SEGMENT_BYTES, 6 * SEGMENT_BYTES, 700, 4096
    stages = (StageCost(1.0, 2.0, saved_bytes=S, parameter_bytes=params, gradient_bytes=grads,
                        optimizer_bytes=opt),)
    (part,) = device_memory(gpipe(2, 1, "never"), stages, [working], workspace)
    raw = params + opt + grads + 2 * S + round_block(working) + workspace
    assert (part.parameters, part.optimizer, part.gradients, part.saved, part.working, part.workspace) == \
        (params, opt, grads, 2 * S, 1024, workspace)
    assert part.task == "B1@0" and part.total == round_segment(raw) == 12 * SEGMENT_BYTES
    assert part.to_dict()["model_state"] == params + opt + grads


def test_allocator_rounding_and_workspace() -> None:
    assert [round_block(x) for x in (0, 1, 512, 513)] == [0, 512, 512, 1024]
    assert [round_segment(x) for x in (0, 1, SEGMENT_BYTES, SEGMENT_BYTES + 1)] == [0, SEGMENT_BYTES,
                                                                                      SEGMENT_BYTES, 2 * SEGMENT_BYTES]
    assert workspace_bytes("h100-sxm") == 32 * 2**20 and workspace_bytes("a100-80gb") == 8 * 2**20 + 2**17
    assert workspace_bytes("cpu") == 0
    with pytest.raises(ValueError, match="give one of each per stage"):
        device_memory(gpipe(2, 2), _stages(2), [0])


def test_allreduce_ring_closed_form() -> None:
    """A ring all-reduce moves ``2 (r - 1) / r`` of its bytes and pays ``2 (r - 1)`` latencies (the step it makes
    of a timeline: tests/sim/test_zero.py)."""
    link = LinkSpec("unit", 0.0, 1.0)
    assert allreduce_seconds(3, 2, link) == 3.0 and allreduce_seconds(3, 1, link) == 0.0
    assert allreduce_seconds(8, 4, LinkSpec("l", 0.5, 2.0)) == 2 * 3 / 4 * 8 / 2 + 6 * 0.5


@pytest.fixture(scope="module")
def small_unet() -> ModelProfile:
    return count_layers(unet(1, 4), unet_sample(2))  # 65 layers


def test_a_pinned_configuration_is_evaluated_exactly(small_unet: ModelProfile) -> None:
    result = plan(PlanRequest(profile=small_unet, batch=8, device="tesla-p40", gpus=[2, 4], link="pcie",
                              training="fp32-rmsprop", chunks=[4], checkpoints=["except_last"], schedules=["gpipe"],
                              balance=[30, 35], replicas=[2]))
    (row,) = result.rows
    assert (row.gpus, row.stages, row.replicas, row.balance) == (4, 2, 2, (30, 35))
    assert row.parameters == small_unet.parameters and result.training == "fp32-rmsprop"
    # fp32 RMSprop: 4 bytes of weights, 4 of gradients and one 4-byte running average per parameter
    assert sum(p.optimizer for p in row.memory_parts) == pytest.approx(4 * small_unet.parameters, abs=2 * 512)
    assert row.memory_bytes == tuple(p.total for p in row.memory_parts)
    with pytest.raises(ValueError, match="cover the model's 65 layers exactly"):
        plan(PlanRequest(profile=small_unet, batch=8, device="tesla-p40", gpus=[2], balance=[30, 30]))
    with pytest.raises(ValueError, match="replicas lists data-parallel copies"):
        plan(PlanRequest(profile=small_unet, batch=8, device="tesla-p40", gpus=[2], replicas=[0]))
    with pytest.raises(ValueError, match=r"nothing to sweep.*with balance \[30, 35\] and replicas \[3\]"):
        plan(PlanRequest(profile=small_unet, batch=8, device="tesla-p40", gpus=[2], balance=[30, 35], replicas=[3]))


def test_the_buyer_gets_the_fewest_gpus_that_reach_the_target(small_unet: ModelProfile) -> None:
    result = plan(PlanRequest(profile=small_unet, batch=64, device="tesla-p40", gpus=[1, 2, 4], link="pcie",
                              training="fp32-sgd", chunks=[4], checkpoints=["never"], schedules=["gpipe"],
                              price_per_gpu_hour=1.0))
    fastest = max(r.throughput for r in result.rows if r.gpus == 1)
    target = fastest * 1.01  # one GPU falls short
    row = cheapest(result, target)
    assert row is not None and row.gpus == 2 and row.fits and row.throughput >= target
    assert all(r.throughput <= row.throughput for r in result.rows if r.gpus == 2 and r.fits)
    (best,) = answer([result], target)
    assert best.row == row and best.dollars_per_hour == 2.0
    assert cheapest(result, 1e12) is None
    with pytest.raises(ValueError, match="target throughput must be a finite number"):
        answer([result], 0.0)


def test_cli_pins_balance_replicas_and_optimizer(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "unet:1,4", "--batch", "8", "--gpus", "4", "--hardware", "tesla-p40", "--chunks",
            "4", "--checkpoint", "except_last", "--schedule", "gpipe", "--balance", "30,35", "--replicas", "2",
            "--optimizer", "rmsprop", "--zero", "0", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["training"] == "fp32-rmsprop" and len(doc["rows"]) == 1
    row = doc["rows"][0]
    assert row["balance"] == [30, 35] and row["replicas"] == 2 and row["parameters"] > 0
    assert [p["total"] for p in row["memory_parts"]] == row["memory_bytes"]
    assert {"model_state", "saved", "working", "workspace", "rounding"} <= set(row["memory_parts"][0])


@pytest.mark.parametrize(("args", "message"), [
    (["--hardware", "h100-sxm,a100-80gb"], "several need --target-throughput"),
    (["--price", "a100-80gb=1.4"], "--price names 'a100-80gb', which is not in --hardware"),
    (["--price", "cheap"], "--price takes USD or NAME=USD"),
    (["--training", "fp32-sgd", "--optimizer", "adam"], "give the optimizer once"),
    (["--target-throughput", "0"], "--target-throughput"),
])
def test_cli_bad_buyer_input(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--model": "unet:1,4", "--batch": "8", "--gpus": "2", "--hardware": "h100-sxm"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    assert main(["plan"] + [x for kv in base.items() for x in kv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("gpipe-sim plan: error:")
