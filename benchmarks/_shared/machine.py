"""The machine a benchmark runs on: what its results record of it, the threads a run sets, how busy it is.

Nothing here imports torch or the project when this module loads, so a script can set ``OMP_NUM_THREADS``
through :func:`omp_threads` before torch does (Note [threads]).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

__all__ = ["BUSY", "QUIET", "THREADS", "cpu_name", "facts", "load_average", "omp_threads", "set_threads",
           "wait_until_quiet"]

# Note [threads]: every benchmark sets its thread counts on purpose, and its results say so. On CPU devices the
# workers of a pipeline (and the ranks of a distributed one) share the machine's cores: an intra-op pool per worker
# that takes every core makes them fight, and the measurements turn into scheduling noise. So one intra-op thread
# per worker and per rank (``THREADS``), set in the main process and again in each spawned rank
# (:func:`set_threads`). The executor's workers are fresh threads, in which MKL does not see that setting; only
# ``OMP_NUM_THREADS`` in the environment before torch loads reaches them (:func:`omp_threads`; Note [one thread per
# worker] in ``sim/cli/demo.py``), which the scripts that measure the workers' tasks set as well.
THREADS = 1

# cores other processes keep busy: a measurement waits for fewer than QUIET (:func:`wait_until_quiet`) and is
# run again above BUSY, where the script has that gate
QUIET, BUSY = 0.15, 0.25


def omp_threads(threads: int = THREADS) -> None:
    """Note [threads]: ``OMP_NUM_THREADS`` for the threads torch starts, unless the environment sets it already.
    Call before torch loads; after, it changes nothing for this process (the results record the variable)."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def set_threads(threads: int = THREADS) -> None:
    """Note [threads]: torch's intra-op threads for this process; a spawned rank calls it again for its own."""
    import torch

    torch.set_num_threads(threads)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` where there is one, else what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The 1-minute load average now, to two decimals; ``None`` where the system does not say."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def facts() -> dict[str, Any]:
    """What every result records of the machine: the CPU, the cores this process may run on
    (:func:`sim.calibration.machine.cpu_count`), the architecture, the platform, Python's and torch's versions and the
    load when the results are written (the machine may be shared)."""
    import torch

    from sim.calibration.machine import cpu_count

    return {"cpu": cpu_name(), "cpus": cpu_count(), "machine": platform.machine(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "load": load_average()}


def wait_until_quiet(limit: float = 120.0) -> None:
    """Wait until other processes use fewer than ``QUIET`` cores over a second, for at most ``limit`` s."""
    from sim.calibration.machine import BackgroundLoad

    deadline = time.perf_counter() + limit
    while time.perf_counter() < deadline:
        meter = BackgroundLoad()
        time.sleep(1.0)
        cores = meter.cores()
        if cores is None or cores < QUIET:
            return
