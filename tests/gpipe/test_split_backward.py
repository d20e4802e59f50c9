"""The split backward (Note [split backward] in gpipe.autograd.split_backward): B + W run each matrix multiply of one
backward once, and give the plain backward's gradients, for a stage of several layers, a first stage, a parameter-free
stage, shared weights and in-place layers, alone and in the executor."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpipe import GPipe
from gpipe.autograd.split_backward import backward_input
from gpipe.schedule import CHECKPOINT_MODES

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


class _Matmuls(TorchDispatchMode):
    """Counts the matrix multiplies run on this thread while entered."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += func in MATMULS
        return func(*args, **(kwargs or {}))


def _stage(layers: int = 4, shared: bool = False, inplace: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    modules: list[nn.Module] = []
    for _ in range(layers):
        modules += [nn.Linear(8, 8), nn.ReLU(inplace=inplace)]
    stage = nn.Sequential(*modules[:-1])
    if shared:
        stage[-1].weight = stage[0].weight
    return stage


def _plain(stage: nn.Module, x: Tensor, grad: Tensor) -> tuple[int, list[Tensor], Tensor | None]:
    """The unsplit backward: its matmuls, the parameters' gradients and the input's."""
    stage.zero_grad(set_to_none=True)
    out = stage(x)
    with _Matmuls() as count:
        out.backward(grad)
    grads = [p.grad.clone() for p in stage.parameters()]
    stage.zero_grad(set_to_none=True)
    return count.count, grads, x.grad


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_b_and_w_run_the_matmuls_of_one_backward(layers: int) -> None:
    """A stage of ``L`` Linears: the plain backward runs ``2L`` matmuls; the split runs ``L`` in B (the inputs'),
    ``L`` in W (the weights'); recomputing W from the outputs, as before, ran ``2L - 1`` in W, more from ``L = 2``."""
    stage = _stage(layers)
    x = torch.randn(4, 8, requires_grad=True)
    grad = torch.randn(4, 8)
    plain, expected, expected_x = _plain(stage, x, grad)
    assert plain == 2 * layers
    params = list(stage.parameters())
    leaf = x.detach().requires_grad_()  # the same values, a fresh leaf
    out = stage(leaf)
    with _Matmuls() as b:
        (found,), kept = backward_input([out], [grad], [leaf], params)
    with _Matmuls() as w:
        kept.accumulate()
    assert (b.count, w.count) == (layers, layers) and b.count + w.count == plain
    torch.testing.assert_close(found, expected_x)
    for p, q in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, q)
    assert kept.groups == []  # W frees what B kept

    stage.zero_grad(set_to_none=True)
    out = stage(leaf)
    with _Matmuls() as before:  # the split as it was: B from the outputs, then W from the outputs again
        torch.autograd.grad([out], [leaf], [grad], retain_graph=True)
        torch.autograd.backward([out], [grad], inputs=params)
    assert before.count == 3 * layers - 1 and (plain < before.count) == (layers > 1)


def test_collect_gives_what_accumulate_leaves_in_grad() -> None:
    stage = _stage(3)
    x, grad = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    _, expected, _ = _plain(stage, x, grad)
    _, kept = backward_input([stage(x)], [grad], [x], list(stage.parameters()))
    got = kept.collect()
    assert all(p.grad is None for p in stage.parameters())
    for g, q in zip(got, expected, strict=True):
        torch.testing.assert_close(g, q)


def test_a_first_stage_runs_its_whole_backward_in_w() -> None:
    stage = _stage(3)
    x, grad = torch.randn(4, 8), torch.randn(4, 8)
    plain, expected, _ = _plain(stage, x, grad)
    out = stage(x)
    with _Matmuls() as b:
        found, kept = backward_input([out], [grad], [], list(stage.parameters()))
    with _Matmuls() as w:
        kept.accumulate()
    assert found == [] and b.count == 0 and w.count == plain == 5
    for p, q in zip(stage.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, q)


def test_a_parameter_free_stage_frees_its_graph_in_b() -> None:
    stage = nn.Sequential(nn.Tanh(), nn.ReLU())
    x, grad = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    out = stage(x)
    (found,), kept = backward_input([out], [grad], [x], [])
    torch.testing.assert_close(found, grad * (1 - torch.tanh(x) ** 2) * (x > 0))
    assert kept.groups == []
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward(grad)


@pytest.mark.parametrize(("shared", "inplace"), [(True, False), (False, True), (True, True)])
def test_shared_weights_and_in_place_layers_give_the_plain_gradients(shared: bool, inplace: bool) -> None:
    """A weight used by two layers: its entries run in one W call; the input side between them runs again there
    (Note [split backward]), and each counts once. In-place ReLUs change nothing."""
    stage = _stage(3, shared=shared, inplace=inplace)
    x, grad = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    plain, expected, expected_x = _plain(stage, x, grad)
    leaf = x.detach().requires_grad_()
    out = stage(leaf)
    with _Matmuls() as b:
        (found,), kept = backward_input([out], [grad], [leaf], list(stage.parameters()))
    with _Matmuls() as w:
        kept.accumulate()
    torch.testing.assert_close(found, expected_x)
    for p, q in zip(stage.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, q)
    # shared: the input side from the last layer down to the first runs again, 2 more matmuls than one backward
    assert b.count + w.count == plain + (2 if shared else 0)


class _Heads(nn.Module):
    """Two Linears side by side on one input, summed (as a layer's q, k and v read one input)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        return self.a(x) + self.b(x)


def test_side_by_side_weights_share_one_call_of_w() -> None:
    """The heads' entries reach no parameter of each other, so W runs them in one engine call (Note [one call per
    group]); the Linear below them, which both reach, gets its own. B + W still run one backward's matmuls."""
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), _Heads())
    x, grad = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    plain, expected, expected_x = _plain(stage, x, grad)
    leaf = x.detach().requires_grad_()
    out = stage(leaf)
    with _Matmuls() as b:
        (found,), kept = backward_input([out], [grad], [leaf], list(stage.parameters()))
    assert len(kept.groups) == 2
    with _Matmuls() as w:
        kept.accumulate()
    assert (b.count, w.count) == (3, 3) and plain == 6
    torch.testing.assert_close(found, expected_x)
    for p, q in zip(stage.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, q)


def _counting(model: nn.Module) -> list[int]:
    """Count, on any thread, the matmuls each Linear's backward node computes: its input's and its weight's."""
    count = [0]

    def on_node(grad_inputs: tuple[Tensor | None, ...], _: Any) -> None:
        count[0] += sum(g is not None for g in grad_inputs[1:])  # addmm's (bias, input, weight)

    def on_forward(_: nn.Module, __: Any, out: Tensor) -> None:
        if out.grad_fn is not None:
            out.grad_fn.register_hook(on_node)

    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(on_forward)
    return count


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("schedule", "devices"), [("gpipe", 4), ("zb-h1", 4), ("zb-v", 2)])
def test_the_executor_runs_the_matmuls_of_one_backward(checkpoint: str, schedule: str, devices: int) -> None:
    """Four stages of two Linears, four micro-batches: every micro-batch runs each Linear's two backward matmuls
    once (the first Linear's input needs none), split or not, and the gradients are the plain model's."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(8)])
    model[6].weight = model[7].weight  # a weight shared inside the last stage
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    nn.functional.mse_loss(reference(x), y).backward()
    count = _counting(model)
    pipe = GPipe(model, [2, 2, 2, 2], devices=["cpu"] * devices, chunks=4, checkpoint=checkpoint, schedule=schedule)
    pipe.step(x, y, nn.functional.mse_loss)
    shared = 0 if schedule == "gpipe" else 4  # per micro-batch, the last Linear's input matmul again in W
    assert count[0] == 4 * (2 * 8 - 1) + shared
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
