"""The executor's switch interval (gpipe.gil, Note [switch interval]): set while two or more workers run,
restored after every phase, also when a partition fails; nested users share it; bad values are refused."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.gil import switch_interval


class Peek(nn.Module):
    """Records the interpreter's switch interval whenever it runs."""

    def __init__(self, seen: list[float], fail: bool = False) -> None:
        super().__init__()
        self.seen, self.fail = seen, fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(sys.getswitchinterval())
        if self.fail:
            raise RuntimeError("boom in a partition")
        return x * 2


@pytest.fixture(autouse=True)
def _interval() -> object:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_two_workers_run_with_the_pipeline_interval_and_the_caller_keeps_its_own() -> None:
    seen: list[float] = []
    pipe = GPipe(nn.Sequential(nn.Linear(3, 3), Peek(seen)), [1, 1], devices=["cpu", "cpu"], chunks=2,
                 switch_interval=0.0005)
    out = pipe(torch.randn(4, 3))
    assert sys.getswitchinterval() == 0.005  # between the phases: the caller's interval
    out.sum().backward()
    assert sys.getswitchinterval() == 0.005
    assert seen and all(s == pytest.approx(0.0005) for s in seen)  # forwards and recomputes


def test_one_worker_and_none_leave_the_interval_alone() -> None:
    seen: list[float] = []
    GPipe(nn.Sequential(Peek(seen), nn.Linear(3, 3)), [2], devices=["cpu"], chunks=2)(torch.randn(4, 3))
    GPipe(nn.Sequential(Peek(seen), nn.Linear(3, 3)), [1, 1], devices=["cpu", "cpu"], chunks=2,
          switch_interval=None)(torch.randn(4, 3))
    assert seen and all(s == pytest.approx(0.005) for s in seen)


def test_a_failing_partition_restores_the_interval() -> None:
    pipe = GPipe(nn.Sequential(nn.Linear(3, 3), Peek([], fail=True)), [1, 1], devices=["cpu", "cpu"], chunks=2)
    with pytest.raises(RuntimeError, match="boom in a partition"):
        pipe(torch.randn(4, 3))
    assert sys.getswitchinterval() == 0.005
    assert not any(t.name.startswith("gpipe-worker") for t in threading.enumerate())


def test_nested_users_share_the_shortest_and_the_last_restores() -> None:
    with switch_interval(0.002):
        assert sys.getswitchinterval() == pytest.approx(0.002)
        with switch_interval(0.001):
            assert sys.getswitchinterval() == pytest.approx(0.001)
        assert sys.getswitchinterval() == pytest.approx(0.002)
        with switch_interval(None):
            assert sys.getswitchinterval() == pytest.approx(0.002)
    assert sys.getswitchinterval() == 0.005


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1ms"])
def test_bad_intervals_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="switch_interval"):
        GPipe(nn.Sequential(nn.Linear(3, 3)), [1], devices=["cpu"], switch_interval=bad)  # type: ignore[arg-type]
