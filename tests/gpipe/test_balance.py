"""Balancing: the block-partition solver is exact and deterministic; balance_by_time/size on CPU."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from gpipe.balance import balance_by_size, balance_by_time
from gpipe.balance.blockpartition import bottleneck, solve


def _all_balances(n: int, k: int) -> list[list[int]]:
    """Every way to cut n layers into k non-empty contiguous blocks."""
    out = []
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = [0, *cuts, n]
        out.append([b - a for a, b in itertools.pairwise(bounds)])
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=9).flatmap(
    lambda costs: st.tuples(st.just(costs), st.integers(1, len(costs)))))
def test_solver_matches_brute_force(case: tuple[list[int], int]) -> None:
    costs, k = case
    balance = solve(costs, k)
    assert len(balance) == k and sum(balance) == len(costs) and min(balance) >= 1
    candidates = _all_balances(len(costs), k)
    best = min(bottleneck(costs, b) for b in candidates)
    assert bottleneck(costs, balance) == best
    # Ties: the earliest blocks as long as possible (lexicographically largest optimal balance).
    assert balance == max(b for b in candidates if bottleneck(costs, b) == best)


@settings(max_examples=300, deadline=None)
@given((st.lists(st.floats(0, 1e3) | st.floats(0, 1e-300) | st.integers(0, 9), min_size=1, max_size=8)
        | st.lists(st.integers(2**53, 2**62), min_size=1, max_size=8))
       .flatmap(lambda costs: st.tuples(st.just(costs), st.integers(1, len(costs)))))
def test_solver_is_exact_for_floats_and_huge_integers(case: tuple[list[float], int]) -> None:
    """Note [exact]: sums as differences of prefix sums, floats of any size and integers past 2**53 alike."""
    costs, k = case
    prefix = [0, *itertools.accumulate(costs)]

    def largest(balance: list[int]) -> float:
        return max(prefix[b] - prefix[a] for a, b in itertools.pairwise([0, *itertools.accumulate(balance)]))

    candidates = _all_balances(len(costs), k)
    best = min(map(largest, candidates))
    assert solve(costs, k) == max(b for b in candidates if largest(b) == best)


@pytest.mark.parametrize(("costs", "k", "expected"), [
    ([3, 1, 1, 2, 2, 1, 4], 3, [3, 3, 1]),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [5, 2, 2]),  # sums 15 13 17
    ([1, 1, 1, 1], 3, [2, 1, 1]),  # tie: the first block takes the extra layer
    ([1, 100, 1], 2, [2, 1]),
    ([1, 1, 1, 1, 100, 1], 3, [4, 1, 1]),  # the heavy layer alone
    ([0, 0, 0], 2, [2, 1]),
    ([5], 1, [1]),
    ([2, 2, 2, 2], 4, [1, 1, 1, 1]),
    ([0.1, 0.2, 0.3, 0.4], 2, [3, 1]),  # floats: 0.6 vs 0.4
])
def test_solver_known_examples(costs: list[float], k: int, expected: list[int]) -> None:
    assert solve(costs, k) == expected


@pytest.mark.parametrize(("costs", "k", "match"), [
    ([1, 2], 3, "at most one partition per layer"),
    ([1, 2], 0, "positive integer"),
    ([], 1, "at most one partition per layer"),
    ([1, -1], 1, "non-negative"),
    ([1, float("nan")], 1, "non-negative finite"),
])
def test_solver_errors(costs: list[float], k: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        solve(costs, k)


class Heavy(nn.Module):
    """A layer much slower than its neighbours, but of the same width: repeated matmuls."""

    def __init__(self, width: int, times: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.times = times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.times):
            x = torch.tanh(self.linear(x))
        return x


def test_balance_by_time_puts_the_heavy_layer_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), Heavy(64, 200), nn.Linear(64, 64), nn.ReLU())
    weight = model[0].weight.detach().clone()
    balance = balance_by_time(3, model, torch.randn(32, 64), timeout=0.5, device="cpu")
    assert balance == [2, 1, 2]
    assert torch.equal(model[0].weight, weight) and model[0].weight.grad is None


def test_balance_by_size_puts_the_heavy_layer_alone() -> None:
    # Each ReLU keeps 8 x 64 floats (2 KiB); the Linear as much plus 2 x 65 KiB of parameters.
    model = nn.Sequential(nn.ReLU(), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.ReLU())
    x = torch.randn(16, 64, requires_grad=True)
    assert balance_by_size(3, model, x, chunks=2, device="cpu") == [2, 1, 2]


def test_balance_by_size_counts_saved_bytes_and_params() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Linear(4, 4, bias=False), nn.ReLU(), nn.ReLU())
    x = torch.randn(4, 4, requires_grad=True)
    # Per micro-batch of 2 rows x 4 floats: each ReLU saves its 32-byte output, the Linear its 32-byte
    # input and holds 64 parameter bytes. Without the parameters all four layers cost the same...
    assert balance_by_size(3, model, x, chunks=2, param_scale=0.0, device="cpu") == [2, 1, 1]
    # ...with them (x10: 32 + 640 bytes), the Linear outweighs the rest and stays alone.
    assert balance_by_size(3, model, x, chunks=2, param_scale=10.0, device="cpu") == [1, 1, 2]


def test_balance_accepts_tuple_inputs() -> None:
    class Add(nn.Module):
        def forward(self, xs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return xs[0] + xs[1]

    model = nn.Sequential(Add(), nn.Linear(4, 4), nn.ReLU())
    sample = (torch.randn(4, 4), torch.randn(4, 4))
    assert sum(balance_by_size(2, model, sample, chunks=2, device="cpu")) == 3
    assert sum(balance_by_time(2, model, sample, timeout=0.0, device="cpu")) == 3


def test_balance_errors() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    x = torch.randn(2, 2)
    with pytest.raises(ValueError, match="between 1 and the 2 layers"):
        balance_by_time(3, model, x, device="cpu")
    with pytest.raises(ValueError, match="between 1 and the 2 layers"):
        balance_by_size(0, model, x, device="cpu")
    with pytest.raises(TypeError, match="nn.Sequential"):
        balance_by_time(1, nn.Linear(2, 2), x, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunks"):
        balance_by_size(1, model, x, chunks=0, device="cpu")
    with pytest.raises(ValueError, match="timeout"):
        balance_by_time(1, model, x, timeout=-1.0, device="cpu")
