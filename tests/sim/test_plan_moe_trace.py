"""``gpipe-sim plan --out DIR`` for a mixture of experts: the best row's predicted timeline shows the all-to-all as
collective tasks, and the table prints the all-to-all's seconds and those exposed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main

MOE = "mixtral:layers=4,hidden=256,heads=8,kv-heads=2,ffn=512,experts=8,top-k=2,seq=128,vocab=1000"


def test_the_best_rows_trace_holds_the_all_to_all_spans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    assert main(["plan", "--model", MOE, "--batch", "16", "--gpus", "16", "--hardware", "h100-sxm", "--link",
                 "nvlink", "--network", "infiniband-ndr", "--tensor-parallel", "1", "--expert-parallel", "8",
                 "--chunks", "2", "--schedule", "1f1b", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.lstrip().startswith("gpus"))
    assert "a2a (s)" in header and "exposed" in header
    events = json.loads((out / "best.trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("cat") == "collective" and e["name"].startswith("all-to-all dispatch")]
    assert spans and all(e["ph"] == "X" and e["dur"] > 0 for e in spans)
    # one span for each forward and each backward task: its MoE layers' dispatch and combine
    tasks = {e["name"] for e in events if e.get("cat") in ("F", "B")}
    assert {e["name"].rsplit(" for ", 1)[1] for e in spans} == tasks
    assert {t[0] for t in tasks} == {"F", "B"} and len(tasks) == 2 * 2 * 2  # 2 micro-batches on 2 stages
