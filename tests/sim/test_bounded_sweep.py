"""A sweep asked for its fastest rows skips what cannot be among them (Note [bounded sweep] in
sim.planning.sweep_workers), and the CLI's default layout is today's practice (Note [today's defaults] in
sim.planning.request)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import torch

from sim.cli import main
from sim.planning.counting.models import get_model
from sim.planning.parallel.configurations import Configuration
from sim.planning.plan import PlanRequest, plan
from sim.planning.request import practice_checkpoints, practice_degrees
from sim.planning.sweep import Sweep

SPEC = "gpt:layers=8,hidden=512,heads=8,seq=256,vocab=1000"


@pytest.fixture(scope="module")
def request_() -> PlanRequest:
    entry = get_model(SPEC)
    profiles = {(1, False): entry.count(torch.bfloat16),
                **{(t, True): entry.tensor_parallel(t, True).count(torch.bfloat16) for t in (2, 4)}}
    return PlanRequest(profile=profiles, batch=64, device="a100-40gb", gpus=[4, 8], link="nvlink3",
                       checkpoints=("except_last", "never", "layers"), zero=(0, 1),
                       tensor_parallel=(1, 2, 4), sequence_parallel=(True,), tokens_per_sample=256)


@pytest.fixture(scope="module")
def full(request_: PlanRequest) -> Any:
    return plan(request_, workers=1)


def _key(row: object) -> tuple[object, ...]:
    return tuple(getattr(row, f) for f in ("gpus", "stages", "replicas", "chunks", "checkpoint", "schedule",
                                           "virtual", "tensor_parallel", "zero", "sequence_parallel",
                                           "step_seconds"))


def _top(result: Any, gpus: int, k: int) -> list[tuple[object, ...]]:
    rows = sorted((r for r in result.rows if r.fits and r.gpus == gpus), key=lambda r: r.step_seconds)
    return [_key(r) for r in rows[:k]]


def test_the_floor_is_below_every_simulated_step(request_: PlanRequest, full: Any) -> None:
    sweep = Sweep(request_)
    fitting = [r for r in full.rows if r.fits]
    assert fitting
    for r in fitting:
        p = Configuration(r.gpus, r.stages, r.replicas, r.chunks, r.checkpoint, r.schedule, r.virtual,
                          r.tensor_parallel, r.zero, r.sequence_parallel)
        assert sweep.floor(p) <= r.step_seconds, r


@pytest.mark.parametrize("keep", [1, 5])
def test_a_bounded_sweep_ranks_the_full_sweep_s_fastest_exactly(request_: PlanRequest, full: Any, keep: int) -> None:
    bounded = plan(replace(request_, keep=keep), workers=2)
    assert bounded.skipped > len(full.rows) // 2  # the point of it
    assert len(bounded.rows) + bounded.skipped >= len(full.rows)
    for g in (4, 8):
        assert _top(bounded, g, keep) == _top(full, g, keep)
    assert full.best is not None and bounded.best is not None and _key(bounded.best) == _key(full.best)
    assert bounded.missing == full.missing


def test_keep_is_checked_when_the_request_is_built(request_: PlanRequest) -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="keep is the number of fastest configurations"):
            replace(request_, keep=bad)
    with pytest.raises(ValueError, match="and >= search"):
        replace(request_, keep=2, search=3)


def test_today_s_tensor_parallel_degrees_divide_a_node_the_heads_and_a_gpu_count() -> None:
    assert practice_degrees(lambda t: True, [1024]) == (1, 2, 4, 8)
    assert practice_degrees(lambda t: 12 % t == 0, [1024]) == (1, 2, 4)  # 12 heads: not 8
    assert practice_degrees(lambda t: True, [2, 6]) == (1, 2)  # 4 and 8 divide neither count
    assert practice_degrees(lambda t: True, [4, 16], gpus_per_node=4) == (1, 2, 4)
    assert practice_checkpoints(False) == ("always", "except_last", "never", "layers")
    assert practice_checkpoints(True)[-1] == "selective"
    assert "layers" not in practice_checkpoints(False, "per_microbatch")


def test_plan_without_layout_flags_sweeps_today_s_layouts(capsys: pytest.CaptureFixture[str]) -> None:
    """The default sweep spans tensor parallelism with sequence parallelism, per-layer recompute and ZeRO-1."""
    assert main(["plan", "--model", SPEC, "--batch", "64", "--gpus", "8", "--hardware", "a100-40gb",
                 "--link", "nvlink", "--schedule", "1f1b", "--chunks", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    seen = {(r["tensor_parallel"], r["sequence_parallel"]) for r in doc["rows"]}
    assert seen == {(1, False), (2, True), (4, True), (8, True)}
    assert {r["checkpoint"] for r in doc["rows"]} == {"always", "except_last", "never", "layers"}
    assert {r["zero"] for r in doc["rows"] if r["replicas"] > 1} == {0, 1}
    assert doc["skipped"] == 0  # --json evaluates every row


def test_the_table_counts_what_it_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", SPEC, "--batch", "64", "--gpus", "8", "--hardware", "a100-40gb",
                 "--link", "nvlink", "--top", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "skipped (slower at their compute alone than the fastest shown)" in out
    assert "--top 0 shows and evaluates all" in out
