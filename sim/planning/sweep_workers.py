"""A sweep's configurations evaluated together: over worker processes forked from this one (Note [sweep workers]),
stopped whole by Ctrl-C (Note [interrupting a sweep]), and bounded to what may rank (Note [bounded sweep]).
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import process as futures_process

from sim.planning.parallel.configurations import Configuration
from sim.planning.rows import PlanRow
from sim.planning.sweep import Sweep
from sim.workers import exit_with_parent

__all__ = ["evaluate_all"]


# Note [sweep workers]: configurations are independent, so a sweep splits them into contiguous runs (configurations
# that share a simulation stay together, Note [reuse in a sweep]) over worker processes forked from this one: a fork
# starts in milliseconds with the counts already in memory, where a fresh interpreter would import torch again. The
# rows come back in the sweep's order, the same as one process gives. Workers run no torch and no BLAS, so forking
# after torch was imported is safe; below ``MIN_PER_WORKER`` configurations a worker costs more than it saves.
MIN_PER_WORKER = 200
_RUNS_PER_WORKER = 16  # runs per worker: a worker with slow runs hands over the rest
_forked: Sweep | None = None  # the sweep a forked worker inherits


def _evaluate_run(points: Sequence[Configuration]) -> tuple[list[PlanRow | None], dict[str, str]]:
    assert _forked is not None
    return [_forked.evaluate(p) for p in points], dict(_forked.why)


# Note [interrupting a sweep]: the parent alone answers Ctrl-C, and no worker outlives it.
# 1. A worker ignores SIGINT: Ctrl-C reaches the whole process group, and a worker's KeyboardInterrupt would only
#    print a traceback. The parent blocks SIGINT while it forks, so none arrives before a worker ignores it.
# 2. On an interrupt the parent kills its workers and re-raises at once: the pool's own shutdown would wait for
#    every run already queued (seconds), and Python 3.11's pool has no public way to end its processes.
# 3. A parent killed outright runs no code, so each worker watches it and exits when it is gone (the ranks' own
#    watch, Note [orphaned children] in :mod:`sim.workers`).
def _start_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    exit_with_parent()


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """End ``pool`` now: its queued runs cancelled, its processes killed (Note [interrupting a sweep])."""
    processes = list((pool._processes or {}).values())  # before shutdown drops them
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown drops it too
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()
    for process in processes:
        process.join()
    # The pool's manager thread ends once its workers are gone; the interpreter's exit would still wake it through a
    # pipe it may have half closed ("Exception ignored ... Bad file descriptor"), so it is forgotten there.
    if manager is not None:
        futures_process._threads_wakeups.pop(manager, None)
        manager.join(timeout=5.0)


# Note [bounded sweep]: a sweep asked for the fastest ``keep`` configurations of each GPU count need not evaluate the
# rest. A configuration's step is at least its floor (:meth:`Sweep.floor`: its compute spread evenly over its
# devices, as no device can be busier than the mean), so the sweep evaluates in order of floors, in waves, and
# skips a configuration whose floor is slower than the ``keep``-th fastest step its GPU count has found so far:
# it cannot enter that count's top ``keep``. The rows it returns are the full sweep's top ``keep`` per GPU count,
# exactly (tested against a full sweep); the others are counted, not evaluated. Ties keep the sweep's order, so
# configurations that share a simulation stay together (Note [reuse in a sweep]).
WAVE = 64  # configurations per worker a wave hands out: small enough to prune early, large enough to keep them busy


def evaluate_all(sweep: Sweep, points: Sequence[Configuration], workers: int = 1,
                 progress: Callable[[int], None] | None = None, keep: int | None = None
                 ) -> tuple[list[PlanRow | None], list[Configuration]]:
    """:meth:`Sweep.evaluate` of every configuration, in order, over ``workers`` processes (Note [sweep workers]);
    ``progress(n)`` is told as each run of ``n`` configurations ends. An interrupt ends the workers with it (Note
    [interrupting a sweep]).

    ``keep``: evaluate only what may be among the ``keep`` fastest rows of its GPU count (Note [bounded sweep]);
    ``None``: every configuration.

    Returns:
        A row (or ``None``, its reason in :attr:`Sweep.why`) per configuration in ``points``' order, ``None`` for
        one skipped too; and the configurations skipped.
    """
    if keep is None:
        return _evaluate(sweep, points, workers, progress), []
    floors = [sweep.floor(p) for p in points]
    order = sorted(range(len(points)), key=lambda k: floors[k])  # stable: ties in the sweep's order
    out: list[PlanRow | None] = [None] * len(points)
    steps: dict[int, list[float]] = {}  # per GPU count, the fastest ``keep`` steps found so far, ascending
    skipped: list[Configuration] = []
    at = 0
    with _Pool(sweep, workers, len(points)) as pool:
        while at < len(order):
            wave: list[int] = []
            while at < len(order) and len(wave) < WAVE * pool.workers:
                k = order[at]
                at += 1
                found = steps.get(points[k].gpus, [])
                if len(found) >= keep and floors[k] > found[keep - 1]:
                    skipped.append(points[k])
                    if progress is not None:
                        progress(1)
                    continue
                wave.append(k)
            for k, row in zip(wave, pool.evaluate([points[k] for k in wave], progress), strict=True):
                out[k] = row
                if row is not None and row.fits:
                    found = steps.setdefault(row.gpus, [])
                    found.append(row.step_seconds)
                    found.sort()
                    del found[keep:]
    return out, skipped


def _evaluate(sweep: Sweep, points: Sequence[Configuration], workers: int,
              progress: Callable[[int], None] | None) -> list[PlanRow | None]:
    with _Pool(sweep, workers, len(points)) as pool:
        return pool.evaluate(points, progress)


class _Pool:
    """Worker processes forked from this one for the life of a sweep (Note [sweep workers]), or none: then the
    configurations are evaluated here. An exit by an exception (Ctrl-C) kills the workers (Note [interrupting a
    sweep])."""

    def __init__(self, sweep: Sweep, workers: int, points: int) -> None:
        self.sweep = sweep
        self.workers = max(1, min(workers, points // MIN_PER_WORKER))
        if "fork" not in multiprocessing.get_all_start_methods():
            self.workers = 1
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Pool:
        global _forked
        if self.workers > 1:
            _forked = self.sweep
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_start_worker)
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:  # the fork context starts every worker at the first submit
                self.pool.submit(int).result()
            except BaseException:
                _kill_workers(self.pool)
                raise
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        global _forked
        _forked = None
        if self.pool is not None:
            if error is not None:
                _kill_workers(self.pool)
            else:
                self.pool.shutdown()

    def evaluate(self, points: Sequence[Configuration], progress: Callable[[int], None] | None
                 ) -> list[PlanRow | None]:
        """The rows of ``points``, in order, in contiguous runs over the workers."""
        if self.pool is None:
            out = []
            for p in points:
                out.append(self.sweep.evaluate(p))
                if progress is not None:
                    progress(1)
            return out
        size = max(1, -(-len(points) // (self.workers * _RUNS_PER_WORKER)))
        runs = [points[k:k + size] for k in range(0, len(points), size)]
        rows: list[PlanRow | None] = []
        for (part, why), run in zip(self.pool.map(_evaluate_run, runs), runs, strict=True):
            rows.extend(part)
            self.sweep.why.update(why)
            if progress is not None:
                progress(len(run))
        return rows
