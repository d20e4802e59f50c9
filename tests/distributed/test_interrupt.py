"""Ctrl-C on the launcher of ``gpipe-sim demo --processes`` (:func:`sim.calibration.processes.run_processes`)
stops every rank it spawned: SIGINT to the launcher alone, while the ranks train, leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)

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
from sim.calibration.experiment_setup import Setup

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


@contextlib.contextmanager
def _launched(tmp_path: Path, stderr: int) -> Iterator[tuple[subprocess.Popen[str], set[int]]]:
    """The launcher with its two ranks training; on the way out nothing it started is left (they run 100,000
    steps)."""
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    launcher = subprocess.Popen([sys.executable, "launch.py"], cwd=tmp_path, env=env, stderr=stderr, text=True)
    ranks: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and time.monotonic() < deadline:  # the two ranks (and the queue's resource tracker)
            ranks = {p for p in _children(launcher.pid) if "spawn_main" in _command(p)}
            time.sleep(0.2)
        assert len(ranks) == 2, f"the ranks never started: {launcher.poll()}"
        time.sleep(1.0)  # inside their steps
        yield launcher, ranks
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _gone(ranks: set[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(p) for p in ranks)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_sigint_to_the_launcher_stops_every_rank(tmp_path: Path) -> None:
    with _launched(tmp_path, subprocess.PIPE) as (launcher, ranks):
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
        assert "KeyboardInterrupt" in err
        assert _gone(ranks, 10)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_a_killed_launcher_leaves_no_rank_behind(tmp_path: Path) -> None:
    """Note [orphaned children] in sim.workers: SIGKILL runs none of the launcher's code; its ranks notice and exit."""
    with _launched(tmp_path, subprocess.DEVNULL) as (launcher, ranks):
        launcher.kill()
        launcher.wait(timeout=30)
        assert _gone(ranks, 60)  # a rank still importing torch watches once it starts


class _DiesOnArrival:
    """Pickles in the launcher; unpickling it in a spawned rank ends that rank with exit code 3, before it runs."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return os._exit, (3,)


def test_a_rank_that_dies_before_answering_ends_the_wait_at_once() -> None:
    """processes._spawn watches its ranks while it waits: a rank that dies unanswered names itself and its exit code
    within seconds, not after the whole timeout."""
    from sim.calibration.experiment_setup import Setup
    from sim.calibration.processes import _spawn

    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank \d exited with code 3 before any rank answered"):
        _spawn(_DiesOnArrival(), Setup(), (1, 1), (1024,), 2, timeout=300)  # type: ignore[arg-type]
    assert time.monotonic() - start < 60
