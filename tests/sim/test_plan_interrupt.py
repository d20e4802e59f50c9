"""A ``gpipe-sim plan`` sweep over worker processes stops on Ctrl-C, and its workers never outlive it.

Note [interrupting a sweep] in :mod:`sim.planning.sweep_workers`. Each test starts a sweep of minutes in a subprocess
of its own session, waits for its two workers, signals it and checks the workers are gone; a sweep that ignores the
signal fails on the wait's timeout, which is generous (the normal case is about a second).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads a process's children from /proc")

# About 5,000 configurations, minutes of sweeping on any machine this runs on.
PLAN = ["plan", "--model", "gpt:175b,attention=math", "--batch", "4096", "--gpus", "1024,2048,4096,8192",
        "--tensor-parallel", "1,2,4,8", "--zero", "0,1,2,3", "--sequence-parallel", "off,on",
        "--checkpoint", "always,except_last,never,layers,selective", "--hardware", "h100-sxm", "--no-progress",
        "--top", "0", "--no-limit"]  # every configuration evaluated (Note [bounded sweep] would skip most), minutes
# The CLI sweeps with a worker per core: two on any machine, so the test has workers to end. SIGINT is restored
# to Python's handler, which a parent started in the background with SIGINT ignored would pass on as ignored.
BOOT = ("import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import sim.planning.plan\n"
        "sim.planning.plan.available_cores = lambda: [0, 1]\n"
        "from sim.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
WAIT = 60.0  # seconds: start-up (torch's import) on a loaded machine, and each wait below


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(x) for x in task.read_text().split()]
        except OSError:  # the task ended meanwhile
            pass
    return out


def _alive(pid: int) -> bool:
    """Running: its ``/proc`` entry is there and not a zombie's (a dead child its reaper has not collected)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def sweeping() -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A plan sweeping over two workers, and their pids; its process group (workers too) is killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", BOOT, *PLAN], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT
        while len(workers := _children(proc.pid)) < 2:
            assert proc.poll() is None, f"the plan ended before sweeping: {proc.communicate()[1]}"
            assert time.monotonic() < deadline, "no workers started"
            time.sleep(0.1)
        time.sleep(0.5)  # into the sweep
        yield proc, workers
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


# Ctrl-C reaches the whole group, whose workers ignore it; SIGINT to the parent alone is the harder case, and the one
# tested. SIGTERM, which Python does not handle, kills the parent as SIGKILL does.
@pytest.mark.parametrize("to", ["parent"])
def test_ctrl_c_ends_the_sweep_and_its_workers(sweeping: tuple[subprocess.Popen[str], list[int]], to: str) -> None:
    """SIGINT to the parent alone (``kill -INT``) or to its group (Ctrl-C): exit 130 without a traceback, no workers."""
    proc, workers = sweeping
    if to == "parent":
        proc.send_signal(signal.SIGINT)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert not [pid for pid in workers if _alive(pid)]


@pytest.mark.parametrize("how", [signal.SIGKILL])
def test_workers_end_with_their_parent(sweeping: tuple[subprocess.Popen[str], list[int]], how: int) -> None:
    """A parent killed outright runs no code: its workers see it gone and exit (Note [orphaned children])."""
    proc, workers = sweeping
    proc.send_signal(how)
    proc.wait(timeout=WAIT)
    deadline = time.monotonic() + WAIT
    while alive := [pid for pid in workers if _alive(pid)]:
        assert time.monotonic() < deadline, f"workers {alive} outlived their parent"
        time.sleep(0.1)
