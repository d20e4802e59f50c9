"""``gpipe-sim demo --json`` and ``gpipe-sim compare`` end to end: a real process, real files, the report's fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("predicted_makespan", "measured_makespan", "makespan_error", "order_agreement")


def _check_report(report: dict, out: Path) -> None:
    for key in FIELDS:
        assert isinstance(report[key], float), key
    assert report["predicted_makespan"] > 0 and report["measured_makespan"] > 0
    error = (report["predicted_makespan"] - report["measured_makespan"]) / report["measured_makespan"]
    assert report["makespan_error"] == pytest.approx(error)
    assert report["order_agreement"] == 1.0
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((out / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    assert json.loads((out / "report.json").read_text())["makespan_error"] == report["makespan_error"]


@pytest.mark.slow
def test_demo_json_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "sim", "demo", "--json", "--steps", "2", "--out", str(out),
                             "--seed", "1"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1  # one JSON object on stdout; the progress bar went to stderr
    report = json.loads(lines[0])
    _check_report(report, out)
    assert report["steps"] == 2 and len(report["step_makespans"]) == 2 and report["seed"] == 1
    # Note [paired error]: each step against the prediction from the calibration pass right after it
    pairs = zip(report["step_predictions"], report["step_makespans"], strict=True)
    errors = sorted((p - m) / m for p, m in pairs)
    assert report["paired_error"] == pytest.approx((errors[0] + errors[1]) / 2)
    assert report["n"] == 2 and report["chunks"] == 4 and report["checkpoint"] == "except_last"


MODEL = '''
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)), \\
        torch.randn(16, 32)
'''


def _compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, *args: str) -> Path:
    """``gpipe-sim compare module:build`` on two CPU devices, chunks 2, of a model written to ``tmp_path``;
    returns its output folder."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "cmp"
    assert main(["compare", f"{module}:build", "--devices", "cpu,cpu", "--chunks", "2", *args, "--out", str(out),
                 "--no-progress"]) == 0
    return out


@pytest.mark.slow
def test_compare_runs_a_user_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = _compare(tmp_path, monkeypatch, "tinymodel", MODEL, "--balance", "2,3", "--checkpoint", "always",
                   "--steps", "2", "--verbose")
    text = capsys.readouterr().out
    assert "makespan (ms)" in text and "task order agreement" in text and "balance [2, 3]" in text
    assert "paired error" in text and "calibrated overheads: launch" in text and "worker threads" in text
    report = json.loads((out / "report.json").read_text())
    _check_report(report, out)
    assert report["balance"] == [2, 3] and report["m"] == 2 and report["checkpoint"] == "always"


ACTIVATIONS_ONLY = '''
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.ReLU(), nn.Tanh(), nn.Sigmoid(), nn.ReLU()), torch.randn(8, 16)
'''


@pytest.mark.slow
def test_compare_runs_a_model_without_parameters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to train but the input (Note [nothing else to train] in sim.calibration.experiment): it calibrates
    and compares."""
    out = _compare(tmp_path, monkeypatch, "activations", ACTIVATIONS_ONLY, "--balance", "2,2", "--steps", "1")
    lines = capsys.readouterr().out.splitlines()  # the default output (issue 21): short, no internals
    assert len(lines) <= 25 and "makespan (ms)" in "\n".join(lines) and "calibrated overheads" not in "\n".join(lines)
    assert lines[-1] == f"wrote {out}/timeline.png, {out}/trace.json, {out}/report.json"
    report = json.loads((out / "report.json").read_text())
    assert report["comparison"]["only_predicted"] == [] and report["comparison"]["only_measured"] == []
    assert {o["op"] for o in report["comparison"]["ops"]} == {"F", "R", "B"}
