"""The benchmarks' tests import the scripts and what they share as the package ``benchmarks`` (the repository's
root is on ``sys.path``: pytest's ``pythonpath``); :func:`run_benchmark` runs a script end to end as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Ran(NamedTuple):
    """What :func:`run_benchmark` ran: the JSON the script wrote, where, and what it printed."""

    doc: dict[str, Any]
    out: Path
    stdout: str


@pytest.fixture
def run_benchmark(tmp_path: Path) -> Callable[..., Ran]:
    """``run(script, *args, timeout=240)``: ``python -m benchmarks.<script> *args --out <tmp>/<name>.json`` from the
    repository root (``script`` is dotted below ``benchmarks``: ``fidelity``, ``investigations.step_spread``),
    checked to exit 0 (its output in the failure)."""

    def run(script: str, *args: str, timeout: float = 240) -> Ran:
        out = tmp_path / f"{script.rpartition('.')[2]}.json"
        command = [sys.executable, "-m", f"benchmarks.{script}", *args, "--out", str(out)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return Ran(json.loads(out.read_text()), out, done.stdout)

    return run
