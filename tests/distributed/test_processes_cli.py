"""``gpipe-sim demo --processes 2`` and ``compare --processes 2``: ranks spawned by the command, listening on
loopback only, predicted vs measured in one report (end to end, slow), the stage seconds profiled in the ranks; bad
values of ``--processes`` refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.cli import main
from tests.distributed.listening import children, is_loopback, listening

ROOT = Path(__file__).resolve().parents[2]
READS_SOCKETS = Path("/proc/net/tcp").exists()  # Linux's table of sockets
MODEL = '''
import torch
from torch import nn

def build():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)), \\
        torch.randn(16, 32)
'''


def _gpipe_sim(cwd: Path, *args: str) -> dict:
    """Run the command; while it runs, read its ranks' listening sockets: loopback only (Note [loopback only] in
    :mod:`gpipe.distributed.loopback`; the store once listened on every interface, unauthenticated)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = subprocess.Popen([sys.executable, "-m", "sim", *args, "--json", "--no-progress", "--out", "out"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    seen: set[tuple[int, str, int]] = set()
    try:
        while command.poll() is None and READS_SOCKETS:
            seen |= set(listening(children(command.pid)))
            time.sleep(0.05)
        stdout, stderr = command.communicate(timeout=300)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 0, stderr
    if READS_SOCKETS:
        assert seen, "no listening socket seen among the ranks"
        assert all(is_loopback(address) for _, address, _ in seen), sorted(seen)
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    report = json.loads(lines[0])
    assert report["predicted_makespan"] > 0 and report["measured_makespan"] > 0
    error = (report["predicted_makespan"] - report["measured_makespan"]) / report["measured_makespan"]
    assert report["makespan_error"] == pytest.approx(error)
    assert report["order_agreement"] == 1.0 and report["processes"] == 2
    assert report["link"]["name"] == "gloo-loopback" and report["link"]["bandwidth"] > 0
    assert report["clock_residual"] >= 0
    # the ranks' passes after every recorded step: one prediction each (Note [calibrated in the ranks])
    assert len(report["step_predictions"]) == len(report["step_makespans"]) and report["paired_error"] is not None
    trace = json.loads((cwd / "out" / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    assert json.loads((cwd / "out" / "report.json").read_text())["makespan_error"] == report["makespan_error"]
    return report


@pytest.mark.slow
def test_demo_on_two_processes_reports_predicted_and_measured(tmp_path: Path) -> None:
    report = _gpipe_sim(tmp_path, "demo", "--processes", "2", "--steps", "2")
    assert (report["schedule"], report["m"], report["n"], report["placement"]) == ("gpipe", 4, 2, [0, 1])
    assert len(report["step_makespans"]) == 2


@pytest.mark.slow
def test_compare_on_two_processes_places_four_stages_by_the_layout(tmp_path: Path) -> None:
    (tmp_path / "mymodel.py").write_text(MODEL)
    report = _gpipe_sim(tmp_path, "compare", "mymodel:build", "--processes", "2", "--schedule", "interleaved-1f1b",
                        "--stages", "4", "--chunks", "4", "--steps", "2")
    assert (report["n"], report["placement"]) == (4, [0, 1, 0, 1])
    assert sum(report["balance"]) == 5


@pytest.mark.parametrize(("args", "message"), [
    (["--processes", "1"], "--processes must be >= 2, got 1"),
    (["--processes", "2", "--devices", "2"], "--processes runs a rank per schedule device"),
    # refused before "spawning N processes" is printed, and before any rank starts
    (["--processes", "64"], "--processes 64 runs a stage on each rank, more than the 20 layers of the demo's model"),
    (["--processes", "2", "--schedule", "zb-v", "--stages", "3"], "3 stages, which schedule 'zb-v' cannot place on 2 "
     "processes: a V places two stages on each device"),
    (["--processes", "2", "--schedule", "zb-v", "--stages", "6"], "give 3 devices (a rank per device: --processes 3)"),
    (["--processes", "2", "--chunks", "1000"], "--chunks 1000 is more than the 64 samples of the mini-batch"),
])
def test_bad_processes_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               args: list[str], message: str) -> None:
    assert main(["demo", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_the_stages_default_to_the_fewest_the_layout_places_on_the_ranks() -> None:
    """A rank per stage, or two for a V: what ``--processes P`` runs without ``--stages`` or ``--balance``."""
    from sim.calibration.experiment_setup import Setup
    from sim.calibration.processes import _stage_count

    assert [_stage_count(Setup(schedule=name), 2) for name in ("gpipe", "1f1b", "zb-v", "dualpipe-v")] == [2, 2, 4, 4]
    assert _stage_count(Setup(schedule="interleaved-1f1b", stages=4), 2) == 4
