"""Random draws under checkpointing: every route a model draws by gives the same gradient under every policy.

Note [random state] in :mod:`gpipe.autograd.rng`. Each case trains one step with ``torch.manual_seed(1)`` under the
three checkpoint policies and both schedules, twice; all twelve gradients must be equal, and must differ from a step
with another seed (so the draws are real and reach the gradient).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.autograd.rng import UnseededDraw
from gpipe.schedule import CHECKPOINT_MODES
from tests.gpipe.models import RandomScale

SCHEDULES = ("gpipe", "1f1b")


class Functional(nn.Module):
    def __init__(self, p: float = 0.4) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)


class RandLike(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x + torch.rand_like(x)


class Bernoulli(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * torch.bernoulli(torch.full_like(x, 0.7))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 2, dropout=0.3, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.attention(x, x, x, need_weights=False)[0]


class CustomOp(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return RandomScale.apply(x)


def _reproduction() -> nn.Sequential:
    """The issue's model: a transformer layer with dropout in the first of two partitions."""
    return nn.Sequential(nn.Linear(16, 16),
                         nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True),
                         nn.Linear(16, 16), nn.Linear(16, 16))


def _around(layer: Callable[[], nn.Module]) -> Callable[[], nn.Sequential]:
    return lambda: nn.Sequential(nn.Linear(16, 16), layer(), nn.Linear(16, 16), layer(), nn.Linear(16, 16))


CASES: dict[str, Callable[[], nn.Sequential]] = {
    "transformer": _reproduction,
    "functional_dropout": _around(Functional),
    "rand_like": _around(RandLike),
    "bernoulli": _around(Bernoulli),
    "multihead_attention": _around(Attention),
    "custom_function": _around(CustomOp),
}
BALANCE = {"transformer": [2, 2]}


def _step(build: Callable[[], nn.Sequential], name: str, checkpoint: str, schedule: str, seed: int = 1) -> Tensor:
    torch.manual_seed(0)
    model = build()
    balance = BALANCE.get(name, [2, 3])
    pipe = GPipe(model, balance, devices=["cpu"] * len(balance), chunks=4, checkpoint=checkpoint, schedule=schedule)
    x = torch.randn(8, 5, 16, generator=torch.Generator().manual_seed(2))
    y = torch.randn(8, 5, 16, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(seed)
    pipe.step(x, y, nn.MSELoss())
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("name", CASES)
def test_draws_equal_under_every_policy_schedule_and_repeat(name: str) -> None:
    build = CASES[name]
    reference = _step(build, name, "never", "gpipe")
    for schedule in SCHEDULES:
        for checkpoint in CHECKPOINT_MODES:
            for _ in range(2):
                torch.testing.assert_close(_step(build, name, checkpoint, schedule), reference, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, c=checkpoint, s=schedule: f"{s}/{c}: {m}")
    assert not torch.allclose(_step(build, name, "never", "gpipe", seed=2), reference)


def test_forward_then_backward_equals_step() -> None:
    def grads(checkpoint: str, via_step: bool) -> Tensor:
        torch.manual_seed(0)
        model = _reproduction()
        pipe = GPipe(model, [2, 2], chunks=4, checkpoint=checkpoint)
        x = torch.randn(8, 5, 16, generator=torch.Generator().manual_seed(2))
        y = torch.randn(8, 5, 16, generator=torch.Generator().manual_seed(3))
        torch.manual_seed(1)
        if via_step:
            pipe.step(x, y, nn.MSELoss())
        else:
            nn.MSELoss()(pipe(x), y).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    reference = grads("never", True)
    for checkpoint in CHECKPOINT_MODES:
        torch.testing.assert_close(grads(checkpoint, False), reference, rtol=1e-5, atol=1e-6)


class Slow(nn.Module):
    """Sleeps before drawing, so the workers' draws interleave differently from run to run."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: Tensor) -> Tensor:
        time.sleep(self.seconds)
        return F.dropout(x, 0.5, self.training)


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_reproducible_whatever_the_interleaving(checkpoint: str) -> None:
    def grads(delays: tuple[float, ...]) -> Tensor:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for delay in delays:
            layers += [nn.Linear(8, 8), Slow(delay)]
        model = nn.Sequential(*layers)
        pipe = GPipe(model, [2] * len(delays), chunks=4, checkpoint=checkpoint)
        torch.manual_seed(1)
        pipe(torch.ones(8, 8)).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    torch.testing.assert_close(grads((0.0, 0.003, 0.0)), grads((0.003, 0.0, 0.002)))


def test_draws_leave_the_default_generator_as_one_seed_draw_does() -> None:
    """A step that draws consumes one number (its seed) from the default generator, as a plain model's draw would."""
    torch.manual_seed(0)
    pipe = GPipe(_around(Functional)(), [2, 3], chunks=2)
    torch.manual_seed(3)
    pipe(torch.randn(4, 16)).sum().backward()
    after = torch.rand(3)
    torch.manual_seed(3)
    torch.randn(4, 16)
    torch.randint(0, 2**62, ())
    torch.testing.assert_close(after, torch.rand(3))


class Sometimes(nn.Module):
    """Draws only when switched on: a draw the first steps could not see."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x: Tensor) -> Tensor:
        return x + torch.rand_like(x) if self.on else x


def test_a_draw_that_appears_later_stops_the_step_before_a_wrong_gradient_and_is_then_seeded() -> None:
    torch.manual_seed(0)
    sometimes = Sometimes()
    model = nn.Sequential(nn.Linear(4, 4), sometimes, nn.Linear(4, 4))
    pipe = GPipe(model, [2, 1], chunks=2, checkpoint="always")
    x = torch.randn(4, 4)
    pipe(x).sum().backward()  # learns that partition 0 draws nothing
    sometimes.on = True
    model.zero_grad()
    with pytest.raises(UnseededDraw, match="gpipe_stochastic"):
        pipe(x).sum().backward()
    grads = []
    for _ in range(2):  # learnt again: seeded, and equal under the same seed
        model.zero_grad()
        torch.manual_seed(5)
        pipe(x).sum().backward()
        grads.append(model[0].weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_a_marked_layer_is_seeded_from_the_first_step() -> None:
    torch.manual_seed(0)
    sometimes = Sometimes()
    sometimes.gpipe_stochastic = True
    model = nn.Sequential(nn.Linear(4, 4), sometimes, nn.Linear(4, 4))
    pipe = GPipe(model, [2, 1], chunks=2, checkpoint="always")
    x = torch.randn(4, 4)
    pipe(x).sum().backward()
    sometimes.on = True
    pipe(x).sum().backward()  # no error: the partition was never run bare


def test_eval_then_train_learns_the_dropout_again() -> None:
    torch.manual_seed(0)
    model = _around(Functional)()
    pipe = GPipe(model, [2, 3], chunks=2)
    x = torch.randn(4, 16)
    pipe.eval()
    with torch.no_grad():
        pipe(x)  # no draws in eval mode
    pipe.train()
    grads = []
    for checkpoint in ("never", "always"):
        pipe.checkpoint = checkpoint
        model.zero_grad()
        torch.manual_seed(1)
        pipe(x).sum().backward()
        grads.append(model[0].weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


class PythonRandom(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * random.random()


class NumpyRandom(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * float(np.random.rand())


@pytest.mark.parametrize("layer", [PythonRandom, NumpyRandom])
def test_draws_outside_torch_are_refused_when_checkpointing(layer: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), layer(), nn.Linear(4, 4))
    x = torch.randn(4, 4)
    with pytest.raises(UnseededDraw, match="Python's random module or NumPy"):
        GPipe(model, [2, 1], chunks=2, checkpoint="always")(x).sum().backward()
    GPipe(model, [2, 1], chunks=2, checkpoint="never")(x).sum().backward()  # nothing to recompute: allowed


def test_only_the_layers_that_drew_stay_under_the_dispatch_mode() -> None:
    """Note [learning which layers draw]: the first step learns, per partition, which of its layers draw."""
    torch.manual_seed(0)
    pipe = GPipe(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.ReLU(), nn.Linear(4, 4)), [3, 1], chunks=2)
    assert pipe.pipeline.draws.plan() == [None, None]  # nothing known yet: every layer is learnt
    pipe.step(torch.randn(4, 4), torch.randn(4, 4), nn.MSELoss())
    assert pipe.pipeline.draws.plan() == [frozenset({1}), frozenset()]
    pipe.eval()
    assert pipe.pipeline.draws.plan() == [None, None]  # other training flags: learnt again
