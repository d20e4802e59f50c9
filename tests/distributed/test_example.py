"""The torchrun examples run under ``python -m torch.distributed.run`` and say their first step's gradients equal one
process's: ``examples/train_distributed.py`` on 2 processes, ``examples/train_replicated.py`` on 4 (pp 2 x dp 2),
whose collectives are on every device's timeline."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.ranks import free_port

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(example: str, processes: int) -> list[str]:
    """What ``example`` printed on ``processes`` ranks, having said its first step's gradients are one process's and
    its losses fell over six steps."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                           f"--master-port={free_port()}", str(ROOT / "examples" / example)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=None)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "first step: gradients on every rank equal to one process" in lines
    losses = [float(v) for v in next(line for line in lines if line.startswith("losses:")).split()[1:]]
    assert len(losses) == 6 and losses[-1] < losses[0]
    return lines


def test_the_torchrun_example_trains_like_one_process() -> None:
    _torchrun("train_distributed.py", 2)


def test_the_torchrun_example_trains_two_replicas_like_one_process() -> None:
    lines = _torchrun("train_replicated.py", 4)
    spans = [re.match(r"device (\d): all-reduce unit \d+ \(.+\) for [BW]", line) for line in lines]
    assert {int(m[1]) for m in spans if m} == {0, 1, 2, 3}, lines
