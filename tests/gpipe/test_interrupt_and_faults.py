"""A fault on a worker says where it happened: the original exception, with a note naming its task."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe

# -- helpers --------------------------------------------------------------------------------------------


def _marked(m: int, rows: int = 2) -> Tensor:
    """``m`` micro-batches of ``rows`` rows each, every value the micro-batch's index."""
    return torch.arange(m, dtype=torch.float32).repeat_interleave(rows).unsqueeze(1).repeat(1, 3)


def _microbatch(x: Tensor) -> int:
    return int(x[0, 0].round().item())


def _identity_linear() -> nn.Linear:
    """A trainable layer that keeps the micro-batch marks of :func:`_marked`."""
    layer = nn.Linear(3, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(3))
        layer.bias.zero_()
    return layer


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gpipe-worker")]


def _no_workers_soon() -> bool:
    for thread in _workers():
        thread.join(timeout=10.0)
    return not _workers()


class _OnBackward(torch.autograd.Function):
    """The identity; its backward calls ``action`` first."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, action: Callable[[], None]) -> Tensor:  # type: ignore[override]
        ctx.action = action
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        ctx.action()
        return grad, None


# -- a fault on a worker names its place ----------------------------------------------------------


def raise_here(where: str) -> None:
    raise ValueError(f"bad value in the {where}")


class Fail(nn.Module):
    """Raises ValueError in the forward, or the backward, of micro-batch ``at``."""

    def __init__(self, at: int, in_backward: bool = False) -> None:
        super().__init__()
        self.at, self.in_backward = at, in_backward

    def forward(self, x: Tensor) -> Tensor:
        if threading.current_thread() is threading.main_thread() or _microbatch(x) != self.at:
            return x * 1.0
        if self.in_backward:
            return _OnBackward.apply(x, lambda: raise_here("backward"))
        raise_here("forward")
        return x


def _failing_pipe(fail: Fail, schedule: str) -> GPipe:
    model = nn.Sequential(_identity_linear(), _identity_linear(), fail, _identity_linear(), _identity_linear())
    return GPipe(model, [1, 2, 2], devices=["cpu"] * 3, chunks=4, schedule=schedule, checkpoint="never")


def _check_placed(error: BaseException, where: str, task: str) -> None:
    assert type(error) is ValueError
    assert str(error) == f"bad value in the {where}"  # the message is the original; the place is a note
    assert "raise_here" in [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    if not hasattr(error, "add_note"):  # Python 3.10: left as it was
        return
    notes = getattr(error, "__notes__", [])
    assert len(notes) == 1, notes
    for part in ("stage 1", "micro-batch 2", task, "cpu", "gpipe-worker-1"):
        assert part in notes[0], notes[0]
    assert notes[0] in "".join(traceback.format_exception(error))  # printed with the traceback


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_fault_in_a_step_names_its_place(schedule: str, where: str) -> None:
    pipe = _failing_pipe(Fail(at=2, in_backward=where == "backward"), schedule)
    with pytest.raises(ValueError) as info:
        pipe.step(_marked(4), torch.zeros(8, 3), nn.functional.mse_loss)
    _check_placed(info.value, where, "F2@1" if where == "forward" else "B2@1")
    assert _no_workers_soon()


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_fault_in_forward_then_backward_names_its_place(where: str) -> None:
    pipe = _failing_pipe(Fail(at=2, in_backward=where == "backward"), "gpipe")
    with pytest.raises(ValueError) as info:
        pipe(_marked(4)).sum().backward()
    _check_placed(info.value, where, "F2@1" if where == "forward" else "B2@1")
    assert _no_workers_soon()
