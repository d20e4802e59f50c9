"""ZeRO in the planner's sweep: each device holds its shard of the model state, the traffic each stage implies is
scheduled, and what does not fit is neither simulated nor priced (Note [not simulated] in sim.planning.rows)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import cache

import pytest
import torch

from sim.cli import main
from sim.core.cost import StageCost
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.models import get_model
from sim.planning.counting.training import training_policy
from sim.planning.hardware.catalog import get_device, get_link
from sim.planning.parallel.cluster import Cluster
from sim.planning.parallel.memory import round_block
from sim.planning.parallel.zero import sharded_state
from sim.planning.plan import PlanRequest, plan
from sim.planning.rows import Plan, PlanRow

SMALL = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"
TRAINING = "fp16-adam"


@cache
def _profile() -> ModelProfile:
    return get_model(SMALL).count(torch.float16)


def _plan(zero: tuple[int, ...], device: str | object = "a100-80gb", **kwargs: object) -> Plan:
    return plan(PlanRequest(profile=_profile(), batch=32, device=device, gpus=[4], link="nvlink3",  # type: ignore[arg-type]
                            training=TRAINING, chunks=[4], checkpoints=["never"], schedules=["1f1b"], zero=zero,
                            **kwargs))  # type: ignore[arg-type]


def _row(result: Plan, stages: int, zero: int) -> PlanRow:
    (row,) = [r for r in result.rows if r.stages == stages and r.zero == zero]
    return row


def _whole(params: int) -> StageCost:
    """One stage holding every parameter, unsharded, as the planner prices it."""
    tr = training_policy(TRAINING)
    return StageCost(0.0, 0.0, parameter_bytes=params * tr.weight_bytes, gradient_bytes=params * tr.gradient_bytes,
                     optimizer_bytes=params * tr.optimizer_bytes)


def test_each_device_holds_its_shard_of_the_model_state() -> None:
    result = _plan((0, 1, 2, 3), stages=[1])
    params = _profile().parameters
    for z in (0, 1, 2, 3):
        row = _row(result, 1, z)
        assert row.replicas == 4
        want = sharded_state(_whole(params), params, training_policy(TRAINING), z, 4)
        part = row.memory_parts[0]
        assert (part.parameters, part.optimizer) == (round_block(want.parameters), round_block(want.optimizer))
        assert row.model_state_bytes[0] == want.total
    states = [_row(result, 1, z).model_state_bytes[0] for z in (0, 1, 2, 3)]
    assert states == sorted(states, reverse=True) and states[3] < states[0] / 3


def test_one_replica_runs_plain_data_parallelism_only() -> None:
    result = _plan((0, 1, 2, 3), stages=[4])  # 4 stages x 1 replica: nothing to shard over
    assert {r.zero for r in result.rows} == {0}


def test_a_configuration_fits_under_zero_and_not_without() -> None:
    roomy = _plan((0, 1), stages=[1])
    plain, sharded = _row(roomy, 1, 0), _row(roomy, 1, 1)
    assert sharded.peak_memory_bytes < plain.peak_memory_bytes
    tight = replace(get_device("a100-80gb"), memory_bytes=(sharded.peak_memory_bytes + plain.peak_memory_bytes) // 2)
    result = _plan((0, 1), tight, stages=[1])
    assert _row(result, 1, 1).fits and not _row(result, 1, 0).fits
    missed = _row(result, 1, 0)
    assert not missed.simulated and math.isnan(missed.step_seconds) and missed.bound == "memory"
    assert result.best is not None and result.best.zero == 1


def test_zero_3_stretches_its_tasks_by_their_gathers_on_a_slow_network() -> None:
    fast = _plan((0, 3), stages=[1], replicas=[4])
    slow = _plan((0, 3), stages=[1], replicas=[4], gpus_per_node=1, network="ethernet-100g")
    assert _row(slow, 1, 3).step_seconds > _row(fast, 1, 3).step_seconds
    # every F gathers the stage's 16-bit weights and every B gathers them again and reduce-scatters the gradients
    cluster = Cluster(get_link("nvlink3"), 1, get_link("ethernet-100g"))
    params = _profile().parameters
    gather = cluster.allgather_seconds(2 * params, 1, 1, 4, 0)
    reduce = cluster.reduce_scatter_seconds(2 * params, 1, 1, 4, 0)
    assert _row(slow, 1, 3).step_seconds >= 4 * (2 * gather + reduce)


def test_zero_1_moves_the_gather_after_the_step() -> None:
    result = _plan((0, 1), stages=[1], replicas=[4], gpus_per_node=1, network="ethernet-100g")
    plain, sharded = _row(result, 1, 0), _row(result, 1, 1)
    assert sharded.allreduce_exposed_seconds > 0 and plain.allreduce_exposed_seconds >= 0


def test_the_rows_carry_tokens_and_utilisation() -> None:
    result = plan(PlanRequest(profile=_profile(), batch=32, device="a100-80gb", gpus=[4], link="nvlink3",
                              training=TRAINING, chunks=[4], checkpoints=["never", "always"], schedules=["1f1b"],
                              stages=[4], tokens_per_sample=128))
    never, always = (next(r for r in result.rows if r.checkpoint == c) for c in ("never", "always"))
    for r in (never, always):
        assert r.tokens_per_second == pytest.approx(r.throughput * 128)
        assert r.mfu is not None and r.hfu is not None and 0 < r.mfu <= r.hfu < 1
        assert r.bound in ("compute", "bubble", "data-parallel", "optimizer")
    assert never.hfu == pytest.approx(never.mfu)  # nothing recomputed
    # the recomputed forward is a third of forward + backward when the backward costs twice the forward: about
    assert always.hfu / always.mfu == pytest.approx(4 / 3, rel=0.1)


@pytest.mark.parametrize(("flags", "needle"), [
    (["--zero", "4"], "--zero lists ZeRO stages"),
    (["--zero", "x"], "--zero takes comma-separated integers"),
])
def test_the_cli_refuses_a_bad_zero_stage_in_one_line(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                     needle: str) -> None:
    code = main(["plan", "--model", SMALL, "--batch", "32", "--gpus", "4", "--hardware", "a100-80gb", *flags])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_the_cli_sweeps_zero_stages_and_prints_them(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", SMALL, "--batch", "32", "--gpus", "4", "--hardware", "a100-80gb",
                 "--link", "nvlink3", "--zero", "0,1,3", "--pipeline", "1", "--chunks", "4", "--schedule", "1f1b",
                 "--checkpoint", "never", "--tensor-parallel", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert sorted(r["zero"] for r in doc["rows"]) == [0, 1, 3]
    for r in doc["rows"]:
        assert r["tokens_per_second"] == pytest.approx(r["throughput"] * 128)
        assert {"mfu", "hfu", "bound", "sequence_parallel", "simulated"} <= set(r)
