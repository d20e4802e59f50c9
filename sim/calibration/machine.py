"""The machine an experiment measures on: devices, cores, threads, the allocator, other processes.

What :mod:`sim.calibration.experiment` (and the CLI and the fidelity benchmark) set up or watch around a
measurement, none of it specific to pipelines: which devices and cores the partitions get, how many
intra-op threads PyTorch uses (:func:`intra_op_threads`, Note [threads]), how glibc hands memory back
(:func:`keep_freed_memory`, Note [allocator]), when Python's collector runs
(:func:`collected_after`, Note [collect after the step]), and how busy the rest of the machine is
(:class:`BackgroundLoad`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator, Sequence

import torch

from gpipe.interpreter.affinity import available_cores, supported

__all__ = [
    "BackgroundLoad",
    "collected_after",
    "cpu_count",
    "default_devices",
    "intra_op_threads",
    "keep_freed_memory",
    "shares_cores",
    "worker_affinity",
]


def default_devices(partitions: int) -> tuple[str, ...]:
    """One device per partition: the CUDA devices when there are enough, else the CPU for every one.

    A single CUDA device is not shared by several partitions here; two workers on one GPU contend in
    ways the simulator does not model, so the CPU is the honest default then.
    """
    if partitions < 1:
        raise ValueError(f"need at least one partition, got {partitions}")
    if torch.cuda.is_available() and torch.cuda.device_count() >= partitions:
        return tuple(f"cuda:{k}" for k in range(partitions))
    return ("cpu",) * partitions


def worker_affinity(devices: Sequence[str]) -> list[frozenset[int] | None] | None:
    """One core per partition for :class:`gpipe.GPipe`'s ``cpu_affinity``: partition ``j`` on the ``j``-th core.

    Only where every device is the CPU and threads can be pinned (Linux); ``None`` otherwise. With
    more partitions than cores, the cores are dealt round (partitions then share them).
    """
    if not devices or not supported() or any(torch.device(d).type != "cpu" for d in devices):
        return None
    cores = available_cores()
    return [frozenset({cores[j % len(cores)]}) for j in range(len(devices))]


def shares_cores(devices: Sequence[str]) -> bool:
    """Whether the partitions' workers compete for the same cores: two or more CPU devices."""
    return len(devices) >= 2 and all(torch.device(d).type == "cpu" for d in devices)


# Note [allocator]: glibc hands large freed blocks back to the operating system (``munmap``, heap
# trimming), so the next allocation of that size touches fresh pages and page-faults; on a virtual
# machine that can double a convolution's time, depending on what was freed before, which neither the
# profiler nor the simulator can know. :func:`keep_freed_memory` tells glibc to keep freed memory for
# reuse (``mallopt``); the CLI commands and the fidelity benchmark call it once, before measuring.
def keep_freed_memory() -> bool:
    """Note [allocator]: make glibc keep freed memory for reuse, for the rest of the process.

    Sets ``M_MMAP_THRESHOLD`` to its maximum (32 MiB: smaller blocks come from the heap, not from
    ``mmap``), ``M_TRIM_THRESHOLD`` to 1 GiB and ``M_TOP_PAD`` to 64 MiB (the heap is not trimmed
    after every free). It cannot be undone within the process.

    Returns:
        Whether the settings took effect (``False`` off glibc, e.g. on macOS or musl).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # from glibc's malloc.h
    return all([mallopt(m_mmap_threshold, 32 * 2**20) == 1, mallopt(m_trim_threshold, 2**30) == 1,
                mallopt(m_top_pad, 64 * 2**20) == 1])


# Note [collect after the step]: Python's cyclic collector runs in whichever thread allocates and holds the
# interpreter lock while it walks every object (a long walk once torch is imported); a worker's backward
# needs that lock for each saved tensor the recorder's hook unpacks, so a collection started elsewhere stalls it.
# :func:`collected_after` turns the collector off for a measured step and collects once after it. Collecting
# before each step also prevents the stall, but its walk evicts from the caches what the step's first tasks need;
# after the step, the profiling pass's untimed run absorbs it. What was alive before the block is frozen
# (``gc.freeze``) while it runs, so the collection after it walks only what the block allocated, the step's
# garbage among it, not every object of a process that has imported torch, each step.
@contextlib.contextmanager
def collected_after() -> Iterator[None]:
    """Note [collect after the step]: no cyclic garbage collection inside the block; one collection after it, of
    what the block allocated."""
    enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()
        if enabled:
            gc.enable()


# Note [threads]: on CPU devices every worker of the executor computes on the same cores. ``threads``
# sets PyTorch's intra-op threads for the whole experiment (calibration included) and restores the
# previous setting afterwards; one thread per worker on two cores is the setting the contention
# measurements are made for, and ``None`` leaves the setting alone. The executor's workers are fresh
# threads, in which MKL does not see this setting: only ``OMP_NUM_THREADS=1`` in the environment before
# torch loads reaches them (``sim/cli/demo.py`` sets it for the CLI, Note [one thread per worker]).
@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Note [threads]: set the intra-op threads for the block and restore them after."""
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class BackgroundLoad:
    """CPU time that processes other than this one and its children used since it was made (Linux: ``/proc``).

    A child counts once it has ended and been waited for (``cutime`` and ``cstime``): the ranks a multi-process
    experiment spawns and joins are its own work, not the machine's background."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.ticks = self._ticks()

    @staticmethod
    def _ticks() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
            with open("/proc/self/stat") as f:
                mine = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            return None
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
        # utime + stime of this process (all its threads) and cutime + cstime of its children waited for
        return busy, int(mine[11]) + int(mine[12]) + int(mine[13]) + int(mine[14])

    def cores(self) -> float | None:
        """Average cores the other processes kept busy; ``None`` where ``/proc`` is not there."""
        now = self._ticks()
        elapsed = time.perf_counter() - self.start
        if now is None or self.ticks is None or elapsed <= 0:
            return None
        per_second = os.sysconf("SC_CLK_TCK")
        other = (now[0] - self.ticks[0]) - (now[1] - self.ticks[1])
        return max(0.0, other / per_second / elapsed)


def cpu_count() -> int | None:
    """The cores this process may run on (all of the machine's where that cannot be asked)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()
