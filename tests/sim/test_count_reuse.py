"""Counting a decoder's identical blocks once (Note [identical layers] in sim.planning.counting.reuse): the profile is
the full count's, every table and byte equal, and only the layers whose inputs differ are run."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from sim.planning.counting import flops
from sim.planning.counting.counts import ModelProfile, OpTable
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model

GPT = "gpt:layers=4,hidden=128,heads=4,seq=32,vocab=100"
LLAMA = "llama:layers=3,hidden=128,heads=8,kv-heads=2,ffn=256,seq=16,vocab=100"
MATH = ",attention=math"  # with an attention core, which the reused count must carry


def assert_same_profile(a: ModelProfile, b: ModelProfile) -> None:
    """Every field of both profiles equal, tables element by element."""
    assert (a.dtype, a.tensor_parallel, a.sequence_parallel, a.attention_core, len(a)) == \
        (b.dtype, b.tensor_parallel, b.sequence_parallel, b.attention_core, len(b))
    for x, y in zip(a.layers, b.layers, strict=True):
        for field in fields(x):
            u, v = getattr(x, field.name), getattr(y, field.name)
            if isinstance(u, OpTable):
                assert isinstance(v, OpTable)
                for array in ("flops", "bytes", "kinds", "dims", "collectives"):
                    assert np.array_equal(getattr(u, array), getattr(v, array)), (x.name, field.name, array)
            else:
                assert u == v, (x.name, field.name)


def _runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the layers the counter runs (rather than reuses)."""
    runs: list[int] = []
    real = flops._run_layer

    def run(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(flops, "_run_layer", run)
    return runs


@pytest.mark.parametrize("spec", [GPT + ",kernels=eager" + MATH, LLAMA + ",kernels=eager" + MATH, GPT + MATH,
                                  LLAMA + MATH, GPT, LLAMA])
@pytest.mark.parametrize(("t", "sequence_parallel"), [(1, False), (2, False), (2, True)])
def test_a_decoder_counted_with_its_blocks_reused_is_the_full_count(spec: str, t: int, sequence_parallel: bool) -> None:
    shard = get_model(spec).tensor_parallel(t, sequence_parallel)
    full = count_layers(shard.module(), shard.sample(2), dtype=torch.float16)
    reused = shard.count(torch.float16)
    assert (reused.attention_core is not None) == spec.endswith(MATH)
    assert_same_profile(replace(full, attention_core=reused.attention_core), reused)
    assert_same_profile(full, count_layers(shard.module(), shard.sample(2), dtype=torch.float16,
                                           identical=shard.identical))


def test_175b_runs_the_embedding_one_block_and_the_head(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs(monkeypatch)
    profile = get_model("gpt:175b").tensor_parallel(8).count(torch.bfloat16)
    assert len(profile) == 98 and len(runs) == 2 * 3  # two passes (Note [affine in the batch])
    assert profile.layers[1].forward is profile.layers[96].forward  # a repeat shares its source's tables


class _ExpScale(nn.Module):
    """``exp(x * w)``: saves its input (for the product) and its output (for exp's backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x * self.w)


def test_a_repeat_whose_input_was_saved_before_is_counted_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first repeat's input is the linear's output, which nothing saved; the second's was saved by the first, so
    it saves less that is new; the third and fourth take the second's count."""
    model = nn.Sequential(nn.Linear(4, 8), *(_ExpScale() for _ in range(4)))
    sample = torch.randn(2, 4)
    full = count_layers(model, sample)
    runs = _runs(monkeypatch)
    reused = count_layers(model, sample, identical=[range(1, 5)])
    assert len(runs) == 2 * 3
    assert_same_profile(full, reused)
    assert full.layers[1].input_saved_bytes == (0, 0) and full.layers[2].input_saved_bytes == (0, 32)


def test_nothing_is_reused_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    shard = get_model(GPT)
    runs = _runs(monkeypatch)
    count_layers(shard.module(), shard.sample(2))
    assert len(runs) == 2 * len(shard.module())


@pytest.mark.parametrize(("identical", "says"), [([[0, 9]], "layers 0 to 2"), ([[1], [1, 2]], "in two groups")])
def test_identical_names_real_layers_once(identical: list[list[int]], says: str) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(ValueError, match=says):
        count_layers(model, torch.randn(2, 4), identical=identical)
