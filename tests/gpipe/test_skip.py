"""Skip connections: the declaration API, namespaces, verification, and portals inside the pipeline."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.skip import Namespace, pop, skippable, stash, verify_skippables
from tests.gpipe.models import AddBack, Keep


def test_skippable_works_in_a_plain_sequential() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Keep(), nn.Tanh(), AddBack())
    x = torch.randn(3, 6)
    torch.testing.assert_close(model(x), torch.tanh(model[0].linear(x)) + 2 * x)
    assert list(model.state_dict()) == ["0.linear.weight", "0.linear.bias"]
    assert type(model[0]).__name__ == "Keep"


def test_namespaces_keep_equal_names_apart() -> None:
    torch.manual_seed(0)
    ns1, ns2 = Namespace(), Namespace()
    model = nn.Sequential(Keep().isolate(ns1), Keep().isolate(ns2), AddBack().isolate(ns2), nn.Tanh(),
                          AddBack().isolate(ns1))
    verify_skippables(model)
    reference = copy.deepcopy(model)
    pipe = GPipe(model, [1, 2, 2], chunks=2, checkpoint="always")
    x = torch.randn(4, 6)
    torch.testing.assert_close(pipe(x), reference(x))
    with pytest.raises(RuntimeError, match="stashes 'identity' again before it was popped"):
        verify_skippables(nn.Sequential(Keep(), Keep(), AddBack(), AddBack()))


@pytest.mark.parametrize(("layers", "message"), [
    (lambda: [AddBack(), Keep()], "has no stash before it"),
    (lambda: [Keep(), nn.ReLU()], "no later layer pops it"),
    (lambda: [Keep(), AddBack(), AddBack()], "is popped twice"),
])
def test_verify_skippables_names_the_fix(layers, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError, match=message):
        verify_skippables(nn.Sequential(*layers()))
    with pytest.raises(RuntimeError, match=message):
        GPipe(nn.Sequential(*layers()), [1] * len(layers()))


def test_isolate_unknown_name() -> None:
    with pytest.raises(ValueError, match="declares no skip named"):
        Keep().isolate(Namespace(), only=["other"])


def test_undeclared_and_missing_commands_are_refused() -> None:
    @skippable(stash=["a"])
    class Wrong(nn.Module):
        def forward(self, x: Tensor):  # type: ignore[no-untyped-def]
            yield stash("b", x)
            return x

    @skippable(stash=["a"])
    class Lazy(nn.Module):
        def forward(self, x: Tensor):  # type: ignore[no-untyped-def]
            if False:
                yield
            return x

    @skippable(pop=["a"])
    class Early(nn.Module):
        def forward(self, x: Tensor):  # type: ignore[no-untyped-def]
            value = yield pop("a")
            return x + value

    with pytest.raises(RuntimeError, match="declares stash="):
        Wrong()(torch.ones(1))
    with pytest.raises(RuntimeError, match="did not stash/pop"):
        Lazy()(torch.ones(1))
    with pytest.raises(RuntimeError, match="before any stash"):
        Early()(torch.ones(1))
    with pytest.raises(TypeError, match="decorates an nn.Module class"):
        skippable(stash=["x"])(object)  # type: ignore[arg-type]


def test_portal_carries_the_tensor_straight_and_its_gradient_back() -> None:
    """The stash in partition 0 reaches the pop in partition 3 without the partitions in between."""
    torch.manual_seed(0)
    model = nn.Sequential(Keep(), nn.Tanh(), nn.Identity(), AddBack())
    reference = copy.deepcopy(model)
    pipe = GPipe(model, [1, 1, 1, 1], chunks=3, checkpoint="except_last", record=True)
    x = torch.randn(6, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    pipe(x).sum().backward()
    reference(x_ref).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)  # includes the gradient that came back through the portal
    torch.testing.assert_close(model[0].linear.weight.grad, reference[0].linear.weight.grad)
    assert pipe.timeline is not None
