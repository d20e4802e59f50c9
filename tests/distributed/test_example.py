"""``examples/train_distributed.py`` runs under torchrun (``python -m torch.distributed.run``) on 2 processes and
says its first step's gradients equal one process's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.ranks import free_port

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)

ROOT = Path(__file__).resolve().parents[2]


def test_the_torchrun_example_trains_like_one_process() -> None:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           f"--master-port={free_port()}", str(ROOT / "examples" / "train_distributed.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=None)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "first step: gradients on every rank equal to one process" in lines
    losses = [float(v) for v in next(line for line in lines if line.startswith("losses:")).split()[1:]]
    assert len(losses) == 6 and losses[-1] < losses[0]
