"""What the split backward learns about a stage's graph (Note [learnt split] in gpipe.autograd.split_backward): a static
stage is learnt once and reused, and a graph that changes (a data-dependent branch, another input shape, a frozen
parameter, a Python autograd.Function holding a weight) still gets the plain model's gradients, alone and in the
executor."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import gpipe.autograd.split_backward
import gpipe.profiling.timing
from gpipe import GPipe
from gpipe.autograd.split_backward import SplitPlans, StagePlans, backward_input
from gpipe.profiling.timing import time_recorded


def _counting_learns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    learn = gpipe.autograd.split_backward._learn

    def counted(shape: Any) -> Any:
        count[0] += 1
        return learn(shape)

    monkeypatch.setattr(gpipe.autograd.split_backward, "_learn", counted)
    return count


class Branch(nn.Module):
    """Two Linears of one shape: the sign of what reaches it picks which runs; with ``tanh`` the negative side adds
    a Tanh, without it the two graphs differ only in their parameters."""

    def __init__(self, tanh: bool = True) -> None:
        super().__init__()
        self.pos, self.neg = nn.Linear(8, 8), nn.Linear(8, 8)
        self.tanh = tanh
        self.taken = [0, 0]  # forwards through pos, through neg

    def forward(self, x: Tensor) -> Tensor:
        positive = float(x.detach().sum()) > 0
        self.taken[not positive] += 1
        if positive:
            return self.pos(x)
        return torch.tanh(self.neg(x)) if self.tanh else self.neg(x)


class Scaled(torch.autograd.Function):
    """``x * w`` with a weight, in Python: its backward node is one Python object that does not own the graph."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        return grad * w, (grad * x).reshape(-1, x.shape[-1]).sum(0)


class ScaledLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: Tensor) -> Tensor:
        return Scaled.apply(x, self.w)


def _split(stage: nn.Module, x: Tensor, grad: Tensor, plans: SplitPlans) -> tuple[Tensor | None, list[Tensor]]:
    """B then W of ``stage`` on ``x``: the input's gradient and the parameters' (zeroed before)."""
    stage.zero_grad(set_to_none=True)
    leaf = x.detach().requires_grad_()
    (found,), kept = backward_input([stage(leaf)], [grad], [leaf], plans.params, plans)
    kept.accumulate()
    return found, [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in stage.parameters()]


def _plain(stage: nn.Module, x: Tensor, grad: Tensor) -> tuple[Tensor | None, list[Tensor]]:
    stage.zero_grad(set_to_none=True)
    leaf = x.detach().requires_grad_()
    stage(leaf).backward(grad)
    return leaf.grad, [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in stage.parameters()]


def test_a_static_stage_is_learnt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    learns = _counting_learns(monkeypatch)
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    plans = SplitPlans(list(stage.parameters()))
    for _ in range(3):
        x, grad = torch.randn(4, 8), torch.randn(4, 8)
        for got, want in zip(_split(stage, x, grad, plans), _plain(stage, x, grad), strict=True):
            torch.testing.assert_close(got, want)
    assert learns[0] == 1 and len(plans.plans) == 1


def test_a_stage_keeps_a_few_parameter_sets_and_a_few_shapes_each() -> None:
    """Note [plans across steps]: the plans of a set asked for again are the same object; beyond the limits the
    least recently asked-for set, and the oldest shape of a set, are dropped."""
    stage = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    every, first, last = list(stage.parameters()), list(stage[0].parameters()), list(stage[2].parameters())
    kept = StagePlans(limit=2)
    plans = kept.get(every)
    assert kept.get(first) is not plans and kept.get(every) is plans
    kept.get(last)  # drops ``first``, asked for before ``every``
    assert len(kept.sets) == 2 and kept.get(every) is plans
    for tanhs in range(6):  # six graphs of other shapes: 0 to 5 Tanh nodes on top
        leaf = torch.randn(4, 8, requires_grad=True)
        out = stage(leaf)
        for _ in range(tanhs):
            out = torch.tanh(out)
        _, weights = backward_input([out], [torch.ones(4, 8)], [leaf], plans.params, plans)
        weights.accumulate()
    assert len(plans.plans) == plans.limit


def test_a_branch_an_input_shape_and_a_python_function_are_learnt_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each graph gets its own plan, and each plan the plain gradients: the two branches differ in their parameters
    alone, a 3-d input runs the Linear as a matmul, and the Python function's node is an entry."""
    learns = _counting_learns(monkeypatch)
    torch.manual_seed(0)
    branch = Branch(tanh=False)
    stage = nn.Sequential(branch, ScaledLayer(), nn.ReLU(), nn.Linear(8, 8))
    plans = SplitPlans(list(stage.parameters()))
    for x in [torch.ones(4, 8), -torch.ones(4, 8), torch.ones(2, 3, 8), -torch.ones(4, 8), torch.ones(4, 8)]:
        grad = torch.randn(*x.shape[:-1], 8)
        for got, want in zip(_split(stage, x, grad, plans), _plain(stage, x, grad), strict=True):
            torch.testing.assert_close(got, want)
    assert branch.taken == [6, 4]  # three positive inputs and two negative, each run split and plain
    assert learns[0] == len(plans.plans) == 3  # the last two repeat the second's graph and the first's


def test_w_keeps_a_python_entry_alive_after_the_outputs_are_gone() -> None:
    """The stage's last node is the Python function's: only the output held it, and W still runs it."""
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 8), ScaledLayer())
    x, grad = torch.randn(4, 8), torch.randn(4, 8)
    _, expected = _plain(stage, x, grad)
    stage.zero_grad(set_to_none=True)
    plans = SplitPlans(list(stage.parameters()))
    leaf = x.detach().requires_grad_()
    _, kept = backward_input([stage(leaf)], [grad], [leaf], plans.params, plans)  # the output dies here
    kept.accumulate()
    for p, q in zip(stage.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, q)


def _reference_step(model: nn.Module, x: Tensor, y: Tensor, chunks: int) -> None:
    """The plain model on GPipe.step's micro-batches, each loss weighed by its rows (Note [an exact loss] in
    gpipe.loss): the branch decides per micro-batch, as in the pipeline."""
    for a, b in zip(torch.tensor_split(x, chunks), torch.tensor_split(y, chunks), strict=True):
        (nn.functional.mse_loss(model(a), b) * (len(a) / len(x))).backward()


def _branchy() -> nn.Sequential:
    """Stage 0 passes its input on (identity Linears), so the sign of each micro-batch picks the branch."""
    torch.manual_seed(0)
    front = [nn.Linear(8, 8) for _ in range(4)]
    for layer in front:
        nn.init.eye_(layer.weight)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*front, Branch(), nn.ReLU(), ScaledLayer(), nn.Linear(8, 8))


def _signed(*shape: int) -> Tensor:
    """A batch of four micro-batches whose sums are positive, negative, positive, negative."""
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0]).repeat_interleave(shape[0] // 4)
    return 0.1 * torch.randn(*shape) + signs.reshape(-1, *[1] * (len(shape) - 1))


@pytest.mark.parametrize(("schedule", "devices"), [("zb-h1", 2), ("zb-v", 2), ("dualpipe-v", 2)])
def test_the_executor_follows_a_graph_that_changes_between_steps(schedule: str, devices: int) -> None:
    """Steps whose micro-batches take different branches, a step with 3-d inputs, and a step with a frozen weight:
    each gives the plain model's gradients (the plans one step learnt serve the next only where its graphs match)."""
    model = _branchy()
    reference = copy.deepcopy(model)
    balance = [3, 3, 1, 1] if schedule != "zb-h1" else [4, 4]  # the branch in stage 1, which has inputs
    pipe = GPipe(model, balance, devices=["cpu"] * devices, chunks=4, checkpoint="never", schedule=schedule)
    torch.manual_seed(1)
    steps = [_signed(8, 8), _signed(8, 8).abs(), _signed(4, 2, 8), -_signed(8, 8)]
    for k, x in enumerate(steps):
        frozen = k == 3
        for m in (model, reference):
            m[2].weight.requires_grad_(not frozen)
        y = torch.randn(*x.shape[:-1], 8)
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        _reference_step(reference, x, y, 4)
        pipe.step(x, y, nn.functional.mse_loss)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None)
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad)
    assert all(model[4].taken) and model[4].taken == reference[4].taken  # both branches ran, alike


@pytest.mark.parametrize(("schedule", "devices"), [("zb-h1", 2), ("zb-v", 2), ("dualpipe-v", 2)])
def test_plans_last_across_steps_until_the_graph_changes(monkeypatch: pytest.MonkeyPatch, schedule: str,
                                                        devices: int) -> None:
    """Note [plans across steps]: two equal steps learn each stage's graph in the first alone; a third whose
    micro-batches take the other branch learns that graph, and every step gives the plain model's gradients."""
    learns = _counting_learns(monkeypatch)
    model = _branchy()
    reference = copy.deepcopy(model)
    balance = [3, 3, 1, 1] if schedule != "zb-h1" else [4, 4]
    pipe = GPipe(model, balance, devices=["cpu"] * devices, chunks=4, checkpoint="never", schedule=schedule)
    torch.manual_seed(1)
    x = _signed(8, 8).abs()  # every micro-batch positive
    counts = []
    for k in range(3):
        step = x if k < 2 else -x
        y = torch.randn(8, 8)
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        _reference_step(reference, step, y, 4)
        pipe.step(step, y, nn.functional.mse_loss)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
        counts.append(learns[0])
    # step 1 learns each stage with inputs (twice: its first micro-batch copies its input, Note [entering a
    # partition] in gpipe.interpreter.worker), step 2 nothing, step 3 the branch's stage alone
    assert counts[0] == 2 * (len(balance) - 1) and counts[1:] == [counts[0], counts[0] + 1]
    assert model[4].taken == [8, 4]


def test_the_profiler_times_b_with_its_plan_learnt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [split runs] in gpipe.profiling.timing: each block with an input to differentiate learns its plan once, in
    its first B, outside the clock; every timed B finds it, as the executor's do after a stage's first step."""
    learns = _counting_learns(monkeypatch)
    clocked: list[int] = []
    clock = gpipe.profiling.timing._clock

    def counting_clock(dev: torch.device) -> Any:
        inner = clock(dev)

        def timed(fn: Any) -> Any:
            before = learns[0]
            result = inner(fn)
            clocked.append(learns[0] - before)
            return result
        return timed

    monkeypatch.setattr(gpipe.profiling.timing, "_clock", counting_clock)
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh())]
    time_recorded(blocks, torch.randn(4, 8), warmup=0, repeats=3, streak=2, split=True)
    assert learns[0] == 2 and clocked and not any(clocked)  # the ReLU's and the last block's, none while timed


class _Hooked(nn.Module):
    """A Linear whose output's gradient a tensor hook doubles (as a user's gradient scaling would)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        out = self.linear(x)
        if out.requires_grad:
            out.register_hook(lambda grad: 2 * grad)
        return out


def test_a_hook_on_an_entry_s_output_applies_once_to_each_half() -> None:
    """B captures the gradient that reaches the entry before its hooks, and W, running the entry, applies them:
    the weight's gradient is doubled once, as in the plain backward."""
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), _Hooked(), nn.Tanh())
    x, grad = torch.randn(4, 8), torch.randn(4, 8)
    for got, want in zip(_split(stage, x, grad, SplitPlans(list(stage.parameters()))), _plain(stage, x, grad),
                         strict=True):
        torch.testing.assert_close(got, want)
