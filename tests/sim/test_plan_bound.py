"""What bounds a configuration's step: the part of it (compute, tensor-parallel traffic, bubble, data-parallel
traffic left exposed, optimizer) that takes longest, named on its row."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch

from sim.core.link import LinkSpec
from sim.core.rings import allreduce_seconds
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_device
from sim.planning.plan import PlanRequest, plan

SMALL = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"
FAST = LinkSpec("fast", 1e-7, 1e13)
SLOW = LinkSpec("slow", 1e-4, 1e8)


@cache
def _profile(t: int) -> ModelProfile:
    return get_model(SMALL).tensor_parallel(t).count(torch.float16)


def test_collective_seconds_are_the_tensor_parallel_all_reduces() -> None:
    assert not FlopCosts(_profile(1), get_device("a100-80gb"), "fp16-adam").collective_seconds(2)[0].any()
    costs = FlopCosts(_profile(4), get_device("a100-80gb"), "fp16-adam", tensor_link=SLOW)
    fwd, bwd = costs.collective_seconds(2)
    one = allreduce_seconds(2 * 128 * 256 * 2, 4, SLOW)  # b s h elements of 2 bytes, over 4 ranks
    assert fwd[1] == pytest.approx(2 * one) and bwd[1] == pytest.approx(2 * one)  # a block: attention and MLP
    whole_fwd, whole_bwd = costs.layer_seconds(2)
    assert np.all(fwd <= whole_fwd) and np.all(bwd <= whole_bwd)


@pytest.mark.parametrize(("link", "bound"), [(SLOW, "tensor-parallel"), (FAST, "compute")])
def test_a_slow_tensor_parallel_link_bounds_the_step(link: LinkSpec, bound: str) -> None:
    result = plan(PlanRequest(profile={4: _profile(4)}, batch=8, device="a100-80gb", gpus=[4], link=link,
                              training="fp16-adam", chunks=[1], checkpoints=["never"], schedules=["gpipe"],
                              tensor_parallel=[4]))
    (row,) = result.rows
    assert row.bound == bound


def test_a_deep_pipeline_of_one_micro_batch_is_bound_by_its_bubble() -> None:
    result = plan(PlanRequest(profile=_profile(1), batch=4, device="a100-80gb", gpus=[4], link=FAST,
                              training="fp16-adam", chunks=[1], checkpoints=["never"], schedules=["gpipe"], stages=[4]))
    (row,) = result.rows
    assert row.bound == "bubble" and row.bubble_fraction > 0.5


def test_workers_give_the_rows_of_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [sweep workers]: the sweep split over forked processes returns the same rows, in the same order."""
    monkeypatch.setattr("sim.planning.sweep_workers.MIN_PER_WORKER", 4)
    kwargs = dict(training="fp16-adam", chunks=[1, 2, 4], checkpoints=["never", "always"], zero=[0, 1],
                  tokens_per_sample=128)
    one = plan(PlanRequest(profile=_profile(1), batch=16, device="a100-80gb", gpus=[1, 2, 4], link=FAST,
                           **kwargs), workers=1)  # type: ignore[arg-type]
    two = plan(PlanRequest(profile=_profile(1), batch=16, device="a100-80gb", gpus=[1, 2, 4], link=FAST,
                           **kwargs), workers=2)  # type: ignore[arg-type]
    assert len(one.rows) > 8 and one == two
