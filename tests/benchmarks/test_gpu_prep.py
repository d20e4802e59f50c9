"""The GPU checks' CPU side: fidelity_cuda's grid, estimate and per-task seconds; scripts/gpu-checks without a GPU."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from gpipe.schedule import gpipe
from gpipe.schedule.timeline import Timeline
from sim.core.cost import CostModel
from sim.core.engine import simulate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fidelity_cuda() -> ModuleType:
    return importlib.import_module("benchmarks.fidelity_cuda")


def test_dry_run_prints_the_grid_and_its_estimate(fidelity_cuda: ModuleType,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert fidelity_cuda.main(["--grid", "checks", "--dry-run", "--budget", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = fidelity_cuda.CHECKS
    expected = fidelity_cuda.START_SECONDS + sum(fidelity_cuda.estimate_seconds(r) for r in rows)
    assert len(lines) == len(rows) + 1
    assert lines[-1] == (f"{len(rows)} rows to run, 0 skipped; estimated GPU time {expected:.0f} s "
                         "(11 steps a row; Note [GPU time estimate])")
    assert {r.model for r in rows} == {"wide", "mlp", "gpt"}
    assert {r.checkpoint for r in rows} == {"always", "except_last", "never"}
    assert {r.chunks for r in rows} >= {1, 32}


def test_estimate_is_its_closed_form(fidelity_cuda: ModuleType) -> None:
    row = fidelity_cuda.Row("wide", "gpipe", 16, "never")
    assert fidelity_cuda.estimate_seconds(row, steps=3) == pytest.approx(16.0 + 5 * 2 * (0.010 + 0.004 * 16))


def test_a_dry_run_past_the_budget_names_the_fix(fidelity_cuda: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        fidelity_cuda.main(["--dry-run", "--budget", "60"])
    assert stopped.value.code == 2
    assert "over --budget 60 s: run fewer rows" in capsys.readouterr().err


def test_refused_rows_are_skipped_with_the_generators_reason(fidelity_cuda: ModuleType,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert fidelity_cuda.main(["--dry-run", "--models", "gpt", "--schedules", "dualpipe-v", "--chunks", "1,4",
                               "--checkpoints", "never"]) == 0
    out = capsys.readouterr().out
    assert "skipped: dualpipe-v needs at least as many micro-batches as stages" in out
    assert "1 rows to run, 1 skipped" in out


@pytest.mark.parametrize("argv", [["--models", "vgg"], ["--schedules", "nope"], ["--chunks", "0"],
                                  ["--chunks", "a"], ["--steps", "0"]])
def test_bad_axes_are_refused(fidelity_cuda: ModuleType, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        fidelity_cuda.main([*argv, "--dry-run"])
    assert stopped.value.code == 2


def test_even_balance(fidelity_cuda: ModuleType) -> None:
    assert fidelity_cuda.even_balance(16, 2) == (8, 8)
    assert fidelity_cuda.even_balance(10, 4) == (3, 3, 2, 2)


def test_task_seconds_of_a_run_that_costs_what_it_profiled() -> None:
    """The simulator's own timeline as the measured one, with an ideal runner: every task's spans are its profiled
    seconds, so each ratio is exactly 1 and the seconds are the cost model's."""
    from benchmarks._shared.cuda_tasks import task_seconds

    schedule = gpipe(4, 2, "except_last")
    cost = CostModel.uniform(2, 1.0, 2.0, recompute=1.5)
    timeline: Timeline = simulate(schedule, cost)
    rows = task_seconds(schedule, cost, timeline, timeline)
    got = {(r["stage"], r["op"], r["checkpointed"]): (r["tasks"], r["profiled_s"], r["ratio"]) for r in rows}
    assert got == {(j, op, ck): (n, s, 1.0) for j in (0, 1)
                   for op, ck, n, s in (("B", False, 4, 2.0), ("F", False, 1, 1.0), ("F", True, 3, 1.0),
                                        ("R", False, 3, 1.5))}


def test_gpu_state_without_cuda_is_empty() -> None:
    from benchmarks._shared.cuda_tasks import gpu_state

    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    assert gpu_state() == []


def test_gpu_checks_without_a_gpu_says_so_and_writes_nothing(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path; on a GPU the script runs for minutes")
    done = subprocess.run([str(ROOT / "scripts" / "gpu-checks"), str(tmp_path / "out")], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"gpu-checks: no CUDA device here ({sys.executable}): nothing to check; run this on a "
                           "machine with a GPU\n")
    assert not (tmp_path / "out").exists()
