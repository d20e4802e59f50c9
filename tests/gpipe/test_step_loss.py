"""``step()``'s loss is the plain model's on the whole batch for every ``torch.nn`` loss that takes
``(input, target)`` and each option that changes its average, and for callables that sum (Note [an exact loss] in
:mod:`gpipe.loss`); the gradients with it. Micro-batches are uneven and one holds only ignored targets."""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.loss import loss_plan, reduction_of
from tests.gpipe.losses import BATCH, CASES, CHUNKS, IGNORED, data, model


def _pipe(module: nn.Sequential, schedule: str, checkpoint: str = "except_last") -> GPipe:
    balance = [2, len(module) - 2]
    if schedule in ("interleaved-1f1b", "zb-v"):
        balance = [1, 1, 1, len(module) - 3]
    return GPipe(module, balance, devices=["cpu", "cpu"], chunks=CHUNKS, checkpoint=checkpoint, schedule=schedule)


def _check(pipe: GPipe, reference: nn.Module, loss: Tensor, expected: Tensor) -> None:
    torch.testing.assert_close(loss, expected.detach(), equal_nan=True)
    want = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, want[name.split(".", 2)[2]].grad, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_step_loss_and_gradients_are_the_plain_models(name: str, schedule: str) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    module = model(case)
    reference = copy.deepcopy(module)
    x, t = data(case)
    loss_fn = case.loss()
    expected = loss_fn(reference(x), t)
    expected.backward()
    pipe = _pipe(module, schedule)
    options = {} if case.loss_reduction is None else {"loss_reduction": case.loss_reduction}
    loss = pipe.step(x, t, loss_fn, **options)
    _check(pipe, reference, loss, expected)


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"])
@pytest.mark.parametrize("checkpoint", ["always", "never"])
def test_padding_and_class_weights_are_exact_under_every_schedule(schedule: str, checkpoint: str) -> None:
    case = CASES["cross-entropy-smoothing-weight-ignore"]
    torch.manual_seed(0)
    module = model(case)
    reference = copy.deepcopy(module)
    x, t = data(case)
    expected = case.loss()(reference(x), t)
    expected.backward()
    balance = [1, 1, 1, len(module) - 3] if schedule != "zb-h1" else [2, len(module) - 2]
    pipe = GPipe(module, balance, devices=["cpu", "cpu"], chunks=CHUNKS, checkpoint=checkpoint, schedule=schedule)
    _check(pipe, reference, pipe.step(x, t, case.loss()), expected)


def test_the_issue_repro_matches_the_plain_model() -> None:
    """Padding in 4 of 16 targets, four micro-batches, 1F1B: the gradients were up to 1.9x off."""
    torch.manual_seed(0)
    mlp = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(7)), nn.Linear(8, 4))
    reference = copy.deepcopy(mlp)
    x = torch.randn(16, 8)
    t = torch.randint(0, 4, (16,))
    t[[0, 1, 2, 5]] = -100
    expected = nn.CrossEntropyLoss()(reference(x), t)
    expected.backward()
    pipe = GPipe(mlp, [4, 4], devices=["cpu"] * 2, chunks=4, schedule="1f1b")
    _check(pipe, reference, pipe.step(x, t, nn.CrossEntropyLoss()), expected)


def test_a_micro_batch_of_only_padding_adds_zero_not_nan() -> None:
    case = CASES["cross-entropy-ignore"]
    x, t = data(case)
    assert (t[:3] == -100).all()  # the whole first micro-batch
    pipe = _pipe(model(case), "1f1b")
    loss = pipe.step(x, t, case.loss())
    assert math.isfinite(float(loss))
    assert all(torch.isfinite(p.grad).all() for p in pipe.parameters() if p.grad is not None)


def test_a_batch_of_only_padding_is_nan_with_zero_gradients_as_the_plain_model() -> None:
    case = CASES["cross-entropy-ignore"]
    torch.manual_seed(0)
    module = model(case)
    reference = copy.deepcopy(module)
    x, _ = data(case)
    t = torch.full((BATCH,), -100)
    expected = nn.CrossEntropyLoss()(reference(x), t)
    expected.backward()
    assert math.isnan(float(expected))
    pipe = _pipe(module, "gpipe")
    _check(pipe, reference, pipe.step(x, t, nn.CrossEntropyLoss()), expected)


def test_a_sum_callable_without_loss_reduction_is_taken_as_a_mean() -> None:
    """The documented default for a callable: a mean over rows (each micro-batch's loss times its share)."""
    case = CASES["callable-sum"]
    torch.manual_seed(0)
    module = model(case)
    x, t = data(case)
    pipe = _pipe(module, "gpipe")
    loss = pipe.step(x, t, case.loss())
    rows = [3, 3, 2, 2]
    with torch.no_grad():
        pieces = [F.mse_loss(module(xi), ti, reduction="sum") * r / BATCH
                  for xi, ti, r in zip(x.split(rows), t.split(rows), rows, strict=True)]
    torch.testing.assert_close(loss, torch.stack(pieces).sum())


@pytest.mark.parametrize(("loss_fn", "loss_reduction", "message"), [
    (nn.MSELoss(reduction="none"), None, "reduction='none'"),
    (nn.MSELoss(), "sum", "contradicts MSELoss"),
    (F.mse_loss, "average", "loss_reduction must be one of"),
])
def test_a_loss_that_cannot_be_combined_is_refused_before_any_work(loss_fn: object, loss_reduction: str | None,
                                                                  message: str) -> None:
    case = CASES["mse"]
    pipe = _pipe(model(case), "gpipe")
    x, t = data(case)
    with pytest.raises(ValueError, match=message):
        pipe.step(x, t, loss_fn, loss_reduction=loss_reduction)  # type: ignore[arg-type]
    assert all(p.grad is None for p in pipe.parameters())


def test_a_class_index_out_of_the_weights_range_is_a_clear_error() -> None:
    case = CASES["cross-entropy-weight-ignore"]
    pipe = _pipe(model(case), "gpipe")
    x, t = data(case)
    t[4] = 9
    with pytest.raises(ValueError, match="out of range for CrossEntropyLoss's 5 class weights"):
        pipe.step(x, t, case.loss())


def test_the_plan_divides_cross_entropy_by_the_counted_class_weight() -> None:
    """The closed form behind the cases: weights 0.5, 2, 1, 3, 0.25 on the targets not ignored."""
    loss_fn = nn.CrossEntropyLoss(weight=torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25]))
    t = torch.tensor([-100, 1, 1, 3, -100, 4])
    plan = loss_plan(loss_fn, reduction_of(loss_fn), (t,), [3, 3])
    assert plan.scales == pytest.approx((1 / 7.25, 1 / 7.25))
    assert plan.fn is not loss_fn and plan.fn.reduction == "sum"  # type: ignore[attr-defined] and loss_fn.reduction == "mean"
    assert reduction_of(nn.KLDivLoss(reduction="batchmean")) == "mean"
    assert loss_plan(F.mse_loss, "mean", (t,), [4, 2]).scales == pytest.approx((4 / 6, 2 / 6))
    assert IGNORED == [0, 1, 2, 5]


def test_an_int_from_the_loss_is_named_as_an_int() -> None:
    case = CASES["mse"]
    pipe = _pipe(model(case), "gpipe")
    x, t = data(case)
    with pytest.raises(TypeError, match="got int"):
        pipe.step(x, t, lambda output, target: 3)


def _gpipe_workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpipe-worker") and t.is_alive()]


@pytest.mark.parametrize(("schedule", "checkpoint"), [("gpipe", "except_last"), ("1f1b", "always"), ("gpipe", "never")])
def test_a_detached_loss_raises_as_backward_does(schedule: str, checkpoint: str) -> None:
    """Plain torch's ``loss.backward()`` raises on a loss with no grad_fn; so does the step, and cleanly: no gradient
    written, no worker left, and the next step trains."""
    case = CASES["mse"]
    torch.manual_seed(0)
    module = model(case)
    reference = copy.deepcopy(module)
    pipe = _pipe(module, schedule, checkpoint)
    x, t = data(case)
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        F.mse_loss(reference(x), t).detach().backward()
    with pytest.raises(RuntimeError, match="loss_fn's result does not require grad"):
        pipe.step(x, t, lambda o, target: F.mse_loss(o, target).detach())
    assert all(p.grad is None for p in pipe.parameters())
    assert not _gpipe_workers()
    assert torch.isfinite(pipe.step(x, t, F.mse_loss))
    assert all(p.grad is not None for p in pipe.parameters())


def test_a_loss_under_no_grad_raises() -> None:
    case = CASES["mse"]
    pipe = _pipe(model(case), "gpipe")
    x, t = data(case)

    def loss_fn(o: Tensor, target: Tensor) -> Tensor:
        with torch.no_grad():
            return F.mse_loss(o, target)

    with pytest.raises(RuntimeError, match="loss_fn's result does not require grad"):
        pipe.step(x, t, loss_fn)
    assert all(p.grad is None for p in pipe.parameters())


def test_nothing_that_requires_grad_raises_as_the_plain_model_does() -> None:
    """A frozen model on an input that does not require grad: plain torch raises, and so does the step (before any
    work); with an input that requires grad both run and only the input gets a gradient."""
    case = CASES["mse"]
    torch.manual_seed(0)
    module = model(case).requires_grad_(False)
    reference = copy.deepcopy(module)
    pipe = _pipe(module, "gpipe")
    x, t = data(case)
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        F.mse_loss(reference(x), t).backward()
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        pipe.step(x, t, F.mse_loss)
    assert not _gpipe_workers()
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    F.mse_loss(reference(a), t).backward()
    pipe.step(b, t, F.mse_loss)
    assert b.grad is not None and a.grad is not None
    torch.testing.assert_close(b.grad, a.grad)
    assert all(p.grad is None for p in pipe.parameters())
