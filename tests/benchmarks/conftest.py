"""The benchmarks' tests import what the scripts share (``benchmarks/_shared``) as the scripts do: from
``benchmarks/`` on ``sys.path``; :func:`run_benchmark` runs a script end to end as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = str(ROOT / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)


class Ran(NamedTuple):
    """What :func:`run_benchmark` ran: the JSON the script wrote, where, and what it printed."""

    doc: dict[str, Any]
    out: Path
    stdout: str


@pytest.fixture
def run_benchmark(tmp_path: Path) -> Callable[..., Ran]:
    """``run(script, *args, timeout=240)``: ``benchmarks/<script>.py *args --out <tmp>/<script>.json`` from the
    repository root, checked to exit 0 (its output in the failure)."""

    def run(script: str, *args: str, timeout: float = 240) -> Ran:
        out = tmp_path / f"{script}.json"
        command = [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args, "--out", str(out)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return Ran(json.loads(out.read_text()), out, done.stdout)

    return run
