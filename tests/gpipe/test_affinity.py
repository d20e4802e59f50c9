"""Pinned workers: each partition's worker thread runs on the cores it was given, and bad core sets are refused."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.interpreter.affinity import available_cores, check_affinity, pinned, supported
from gpipe.profiling.profile import profile_blocks

needs_affinity = pytest.mark.skipif(not supported(), reason="threads can be pinned on Linux only")


class Where(nn.Module):
    """Records the cores of the thread that runs it."""

    def __init__(self, seen: list[tuple[str, frozenset[int]]]) -> None:
        super().__init__()
        self.seen = seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((threading.current_thread().name, frozenset(os.sched_getaffinity(0))))
        return x * 1.0


@needs_affinity
def test_each_worker_runs_on_its_cores_and_the_caller_keeps_its_own() -> None:
    torch.manual_seed(0)
    first, last = available_cores()[0], available_cores()[-1]
    seen: list[tuple[str, frozenset[int]]] = []
    model = nn.Sequential(nn.Linear(4, 4), Where(seen), nn.Linear(4, 4), Where(seen))
    before = os.sched_getaffinity(0)
    pipe = GPipe(model, [2, 2], devices=["cpu", "cpu"], chunks=2, checkpoint="always", cpu_affinity=[{first}, {last}])
    pipe(torch.randn(4, 4)).sum().backward()
    assert seen and {name for name, _ in seen} == {"gpipe-worker-0", "gpipe-worker-1"}
    for name, cores in seen:  # forwards and recomputes alike
        assert cores == ({first} if name.endswith("0") else {last})
    assert os.sched_getaffinity(0) == before


@needs_affinity
def test_unpinned_partitions_keep_the_callers_cores() -> None:
    seen: list[tuple[str, frozenset[int]]] = []
    model = nn.Sequential(Where(seen), Where(seen))
    pipe = GPipe(model, [1, 1], devices=["cpu", "cpu"], chunks=1, cpu_affinity=[{available_cores()[0]}, None])
    pipe(torch.randn(2, 3))
    assert dict(seen) == {"gpipe-worker-0": {available_cores()[0]},
                          "gpipe-worker-1": frozenset(os.sched_getaffinity(0))}


@needs_affinity
def test_pinned_restores_the_threads_cores_even_on_error() -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(KeyError), pinned({available_cores()[0]}):
        assert os.sched_getaffinity(0) == {available_cores()[0]}
        raise KeyError("inside")
    assert os.sched_getaffinity(0) == before
    with pinned(None):
        assert os.sched_getaffinity(0) == before


@needs_affinity
def test_the_profiler_runs_each_block_on_its_cores() -> None:
    seen: list[tuple[str, frozenset[int]]] = []
    first, last = available_cores()[0], available_cores()[-1]
    before = os.sched_getaffinity(0)
    profile_blocks([Where(seen), Where(seen)], torch.randn(2, 3), warmup=0, repeats=1, affinity=[{first}, {last}])
    sizes, timed = seen[:2], seen[2:]  # one untimed forward each for the bytes, then the pass
    assert [cores for _, cores in sizes] == [before, before]
    assert [cores for _, cores in timed] == [{first}, {last}] * 2  # grad-enabled forwards, then no-grad ones
    assert os.sched_getaffinity(0) == before


def test_bad_core_sets_are_refused_with_the_fix() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(ValueError, match="one set of cores"):
        GPipe(model, [1, 1], cpu_affinity=[{0}])
    with pytest.raises(TypeError, match="one set of cores per partition"):
        GPipe(model, [1, 1], cpu_affinity=0)  # type: ignore[arg-type]
    if supported():
        with pytest.raises(ValueError, match="non-empty"):
            GPipe(model, [1, 1], cpu_affinity=[set(), None])
        with pytest.raises(ValueError, match="cannot use"):
            GPipe(model, [1, 1], cpu_affinity=[{max(available_cores()) + 1000}, None])
        with pytest.raises(TypeError, match="set of core numbers"):
            check_affinity([7, None], 2)  # type: ignore[list-item]
    assert check_affinity(None, 3) is None
    assert check_affinity([None, None], 2) == [None, None]
