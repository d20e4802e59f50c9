"""``examples/train_replicated.py`` runs under torchrun on 4 processes (pp 2 x dp 2) and says its first step's
gradients equal one process's on the global batch, and its collectives are on every device's timeline."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.ranks import free_port

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)

ROOT = Path(__file__).resolve().parents[2]


def test_the_torchrun_example_trains_two_replicas_like_one_process() -> None:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                           f"--master-port={free_port()}", str(ROOT / "examples" / "train_replicated.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=None)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "first step: gradients on every rank equal to one process" in lines
    losses = [float(v) for v in next(line for line in lines if line.startswith("losses:")).split()[1:]]
    assert len(losses) == 6 and losses[-1] < losses[0]
    spans = [re.match(r"device (\d): all-reduce unit \d+ \(.+\) for [BW]", line) for line in lines]
    reduced = {int(m[1]) for m in spans if m}
    assert reduced == {0, 1, 2, 3}, lines
