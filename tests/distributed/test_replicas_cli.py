"""``gpipe-sim demo --processes 1 --replicas 2``: two replicas of a one-rank pipeline spawned by the command, their
gradient all-reduces predicted beside measured (end to end, slow); bad values of ``--replicas`` refused in one
line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _collectives(trace: dict) -> dict[str, list[str]]:
    """Each timeline's collective spans' names, by its process (``predicted: device 0``), in time order."""
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    spans: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == "collective":
            spans[names[e["pid"]]].append((e["ts"], e["name"]))
    return {process: [name for _, name in sorted(got)] for process, got in spans.items()}


@pytest.mark.slow
def test_demo_on_two_replicas_reports_predicted_and_measured_collectives(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "sim", "demo", "--processes", "1", "--replicas", "2", "--steps", "2",
                           "--json", "--no-progress", "--out", "out"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["processes"], report["replicas"], report["n"], report["placement"]) == (1, 2, 1, [0])
    assert report["allreduce"]["latency"] > 0 and report["allreduce"]["bandwidth"] > 0
    # one bucket of the demo's 2.26 MiB of gradients on each replica's rank, predicted and measured (the loss's
    # all-reduce left out of both)
    rows = report["collectives"]
    assert [(r["device"], r["predicted_count"], r["measured_count"]) for r in rows] == [(0, 1, 1), (1, 1, 1)]
    assert all(r["predicted_seconds"] > 0 and r["measured_seconds"] > 0 for r in rows)
    assert report["comparison"]["order_agreement"] == 1.0 and len(report["comparison"]["devices"]) == 2
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    got = _collectives(trace)
    for device in (0, 1):  # the same labels and bytes on both sides, the executor's bucket, in the same task
        assert got[f"predicted: device {device}"] == got[f"measured: device {device}"] == \
            ["all-reduce unit 0 (2.26 MiB) for B0@0"], got  # after the last B


@pytest.mark.parametrize(("args", "message"), [
    (["--processes", "1", "--replicas", "1"], "--processes must be >= 2, got 1"),
    (["--processes", "2", "--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["--replicas", "2"], "--replicas replicates the pipeline of --processes N: give --processes too"),
    (["--processes", "1", "--replicas", "2", "--bucket-bytes", "0"], "--bucket-bytes must be >= 1, got 0"),
    (["--processes", "2", "--bucket-bytes", "1024"], "--bucket-bytes sizes the gradients' all-reduces of --replicas"),
])
def test_bad_replicas_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              args: list[str], message: str) -> None:
    assert main(["demo", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
