"""Ctrl-C on the launcher of ``gpipe-sim demo --processes`` (:func:`sim.calibration.processes.run_processes`)
stops every rank it spawned: SIGINT to the launcher alone, while the ranks train, leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A shell without job control starts background commands with SIGINT ignored, and an ignored signal stays ignored
# through exec: under such a runner the launcher would never see the Ctrl-C this test sends. A terminal's Ctrl-C
# reaches a program with Python's default handler, so the launcher puts it back first.
LAUNCHER = '''
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import functools, torch
from torch import nn
from sim.calibration.processes import run_processes
from sim.calibration.setup import Setup

def build():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)), torch.randn(8, 4)

if __name__ == "__main__":
    run_processes(build, Setup(chunks=2, steps=100000, warmup_steps=0, warmup=0, repeats=1), 2)
'''


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_sigint_to_the_launcher_stops_every_rank(tmp_path: Path) -> None:
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    launcher = subprocess.Popen([sys.executable, "launch.py"], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                                text=True)
    ranks: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and time.monotonic() < deadline:  # the two ranks (and the queue's resource tracker)
            ranks = {p for p in _children(launcher.pid) if "spawn_main" in _command(p)}
            time.sleep(0.2)
        assert len(ranks) == 2, f"the ranks never started: {launcher.poll()}"
        time.sleep(1.0)  # inside their steps
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
        assert "KeyboardInterrupt" in err
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in ranks)
    finally:
        _kill(launcher, ranks)


def _kill(launcher: subprocess.Popen[str], ranks: set[int]) -> None:
    """A failed test leaves no rank training (they run 100,000 steps)."""
    if launcher.poll() is None:
        launcher.kill()
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_a_killed_launcher_leaves_no_rank_behind(tmp_path: Path) -> None:
    """Note [orphaned ranks]: SIGKILL runs none of the launcher's code; its ranks notice and exit."""
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    launcher = subprocess.Popen([sys.executable, "launch.py"], cwd=tmp_path, env=env, stderr=subprocess.DEVNULL,
                                text=True)
    ranks: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and time.monotonic() < deadline:
            ranks = {p for p in _children(launcher.pid) if "spawn_main" in _command(p)}
            time.sleep(0.2)
        assert len(ranks) == 2, f"the ranks never started: {launcher.poll()}"
        time.sleep(1.0)
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 60  # a rank still importing torch watches once it starts
        while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in ranks)
    finally:
        _kill(launcher, ranks)
