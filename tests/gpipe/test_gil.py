"""The executor's switch interval (gpipe.interpreter.gil, Note [switch interval]): set while two or more workers run,
restored after every phase and on every way out (a failing task, an exception in the caller between the phases,
an interrupt, a forward or a pipeline dropped without backward); nested and concurrent users share it; bad values
are refused. No timing: each test reads ``sys.getswitchinterval()`` afterwards."""

from __future__ import annotations

import _thread
import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.interpreter.gil import switch_interval


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


# -- every path restores the interval (Note [switch interval], Note [parked workers] in gpipe.interpreter.parking) --


def _no_workers_soon() -> bool:
    """Whether every gpipe worker thread ends within a few seconds (parked ones leave when told)."""
    for thread in threading.enumerate():
        if thread.name.startswith("gpipe-worker"):
            thread.join(timeout=5.0)
    return not any(t.name.startswith("gpipe-worker") for t in threading.enumerate())


def _pipe(*extra: nn.Module, interval: float | None = 0.001, chunks: int = 2) -> GPipe:
    return GPipe(nn.Sequential(nn.Linear(3, 3), *extra, nn.Linear(3, 3)), [1, 1 + len(extra)], devices=["cpu", "cpu"],
                 chunks=chunks, switch_interval=interval)


class InBackward(nn.Module):
    """The identity forward; its backward calls ``action`` first (to raise, or to interrupt the main thread)."""

    def __init__(self, action: Callable[[], None]) -> None:
        super().__init__()
        self.action = action

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _InBackward.apply(x, self.action)


class _InBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, action: Callable[[], None]) -> torch.Tensor:  # type: ignore[override]
        ctx.action = action
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.action()
        return grad, None


def _boom() -> None:
    raise RuntimeError("boom in a backward")


def _interrupt() -> None:
    _thread.interrupt_main()
    time.sleep(0.3)


class Interrupt(nn.Module):
    """Sends the main thread a KeyboardInterrupt from a worker, then keeps the worker busy for a while."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread() is not threading.main_thread():
            _thread.interrupt_main()
            time.sleep(0.3)  # the main thread is waiting for this worker when the interrupt arrives
        return x


def test_a_failing_backward_restores_the_interval() -> None:
    pipe = _pipe(InBackward(_boom))
    out = pipe(torch.randn(4, 3))
    with pytest.raises(RuntimeError, match="boom in a backward"):
        out.sum().backward()
    assert sys.getswitchinterval() == 0.005
    assert _no_workers_soon()


def test_an_exception_in_the_caller_between_the_phases_restores_it_and_sends_the_workers_away() -> None:
    pipe = _pipe()

    def train() -> None:
        out = pipe(torch.randn(4, 3))
        assert sys.getswitchinterval() == 0.005  # the loss runs with the caller's interval
        raise ValueError(f"the caller's loss failed on {tuple(out.shape)}")  # backward never runs

    with pytest.raises(ValueError, match="the caller's loss failed"):
        train()
    gc.collect()
    assert sys.getswitchinterval() == 0.005
    assert _no_workers_soon()
    pipe(torch.randn(4, 3)).sum().backward()  # and the pipeline trains afterwards
    assert sys.getswitchinterval() == 0.005


def test_a_forward_dropped_without_backward_and_a_pipeline_collected_restore_it() -> None:
    pipe = _pipe()
    out = pipe(torch.randn(4, 3))
    del out  # its backward never runs: the parked workers leave
    assert sys.getswitchinterval() == 0.005
    assert _no_workers_soon()
    out = pipe(torch.randn(4, 3))
    del pipe  # the pipeline and its last forward go together
    del out
    gc.collect()
    assert sys.getswitchinterval() == 0.005
    assert _no_workers_soon()


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_keyboard_interrupt_while_waiting_restores_it(phase: str) -> None:
    pipe = _pipe(Interrupt() if phase == "forward" else nn.Identity())
    if phase == "backward":  # the interrupt comes from a backward task, while backward() waits
        pipe = _pipe(InBackward(_interrupt))
    with pytest.raises(KeyboardInterrupt):
        pipe(torch.randn(4, 3)).sum().backward()
    assert sys.getswitchinterval() == 0.005
    assert _no_workers_soon()


def test_concurrent_pipelines_share_the_shortest_and_the_last_one_out_restores() -> None:
    seen: list[float] = []
    pipes = [_pipe(Peek(seen), interval=0.002), _pipe(Peek(seen), interval=0.0005)]
    errors: list[BaseException] = []
    x = torch.randn(4, 3)  # drawn before: a draw on another thread while a task runs is refused (gpipe.autograd.rng)

    def train(pipe: GPipe) -> None:
        try:
            for _ in range(5):
                pipe(x).sum().backward()
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            errors.append(error)

    callers = [threading.Thread(target=train, args=(p,)) for p in pipes]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert not errors
    assert sys.getswitchinterval() == 0.005
    assert seen and all(s <= 0.002 + 1e-9 for s in seen)


def test_a_pipeline_inside_another_keeps_the_outer_interval_until_the_outer_ends() -> None:
    seen: list[float] = []
    inner = _pipe(interval=0.0005)

    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                y = inner(x.detach())
            seen.append(sys.getswitchinterval())  # the inner one left: the outer's again
            return x + y

    outer = _pipe(Inner(), interval=0.002)
    outer(torch.randn(4, 3)).sum().backward()
    assert seen and all(s == pytest.approx(0.002) for s in seen)
    assert sys.getswitchinterval() == 0.005
