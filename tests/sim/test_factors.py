"""sim.factors: each stage run alone in the executor, against the profiler's runs of the same work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sim.calibrate import partitions_of
from sim.cost import CostModel, StageCost
from sim.experiment import Setup, _stage_inputs, run
from sim.factors import measure_executor_factors


def _model() -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU()), torch.randn(8, 8)


@pytest.mark.parametrize(("chunks", "checkpoint"), [(1, "never"), (2, "always"), (4, "except_last")])
def test_factors_are_measured_for_the_kinds_the_schedule_runs(chunks: int, checkpoint: str) -> None:
    model, batch = _model()
    parts = partitions_of(model, (2, 2))
    cost = CostModel(stages=(StageCost(1e-4, 1e-4), StageCost(1e-4, 1e-4)))
    before = [p.detach().clone() for p in model.parameters()]
    factors = measure_executor_factors(cost, parts, _stage_inputs(parts, batch, ["cpu", "cpu"]), chunks,
                                       checkpoint, steps=2, warmup_steps=1)  # type: ignore[arg-type]
    assert len(factors) == 2
    for forward, nograd, backward in factors:
        assert forward > 0 and backward > 0
        assert (nograd == 1.0) is (checkpoint == "never")  # no checkpointed forward: no sample
    assert all(p.grad is None for p in model.parameters())  # the probe leaves no gradients behind
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_factors_reject_mismatched_inputs() -> None:
    model, batch = _model()
    parts = partitions_of(model, (2, 2))
    cost = CostModel(stages=(StageCost(1e-4, 1e-4), StageCost(1e-4, 1e-4)))
    with pytest.raises(ValueError, match="2 partitions, 1 inputs"):
        measure_executor_factors(cost, parts, [batch], 1, "never")


def test_experiment_with_executor_factors_puts_them_in_the_cost_model() -> None:
    model, batch = _model()
    outcome = run(model, batch, Setup(chunks=2, checkpoint="never", balance=(2, 2), devices=("cpu", "cpu"),
                                      steps=2, warmup_steps=1, pair_rounds=1, warmup=0, repeats=1,
                                      executor_factors=True))
    assert all(s.factor_forward != 1.0 and s.factor_backward != 1.0 for s in outcome.cost.stages)
    assert all(s.factor_nograd == 1.0 for s in outcome.cost.stages)
