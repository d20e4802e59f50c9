"""FP8 training (Note [fp8 training] in sim.planning.counting.fp8): model state, which kernels run in FP8, the casts,
refusal."""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest
import torch
from torch import nn

from sim.cli import main
from sim.core.cost import StageCost
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import MATMUL, MEMORY_BOUND, ModelProfile
from sim.planning.counting.flops import count_layers
from sim.planning.counting.fp8 import CAST_BYTES_PER_ELEMENT, fp8_tables
from sim.planning.counting.training import training_policy
from sim.planning.hardware.catalog import get_device
from sim.planning.parallel.zero import sharded_state

WIDTH, TOKENS = 2048, 256  # a Linear of WIDTH x WIDTH over (batch, TOKENS, WIDTH)


@cache
def _linears(layers: int = 4) -> ModelProfile:
    """A GEMM-heavy sequential of Linears, counted in BF16."""
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    return count_layers(model, torch.empty(2, TOKENS, WIDTH), dtype=torch.bfloat16)


class _Attention(nn.Module):
    """A Linear, then the batched products of attention (bmm) over 4 heads."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 3 * 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, 4, 16).transpose(1, 2) for z in self.qkv(x).split(64, dim=2))
        return ((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2).reshape(b, t, 64)


@pytest.mark.parametrize(("name", "gradient"), [("fp8-adam", 2), ("fp8-adam-fp32grad", 4)])
def test_model_state_per_parameter_is_bf16s_plus_the_fp8_weight_and_its_transpose(name: str, gradient: int) -> None:
    policy = training_policy(name)
    # bf16 weight + fp32 master + FP8 weight + FP8 transpose, gradients, Adam's two fp32 moments
    assert policy.weight_bytes == 2 + 4 + 1 + 1
    assert policy.model_state_bytes_per_parameter == 2 + 4 + 1 + 1 + gradient + 4 + 4
    bf16 = training_policy(name.replace("fp8", "bf16"))
    assert policy.model_state_bytes_per_parameter == bf16.model_state_bytes_per_parameter + 2
    assert policy.update_bytes == bf16.update_bytes + 2 + 2  # the step's weight cast: BF16 read, FP8 copy + transpose
    assert (policy.compute, policy.other_compute, policy.torch_dtype) == ("fp8", "bf16", torch.bfloat16)


def test_zero_shards_the_master_but_keeps_the_fp8_copies_whole() -> None:
    policy, p, d = training_policy("fp8-adam"), 1_000, 4
    stage = StageCost(forward=1.0, backward=1.0, parameter_bytes=p * policy.weight_bytes,
                      gradient_bytes=p * policy.gradient_bytes, optimizer_bytes=p * policy.optimizer_bytes)
    state = sharded_state(stage, p, policy, zero=1, replicas=d)
    assert state.parameters == 2 * p + 4 * p // d + 2 * p  # bf16 copy, master's shard, FP8 copies
    assert state.total == 2 * p + 4 * p // d + 2 * p + 2 * p + 8 * p // d


def test_only_linear_products_of_the_inner_layers_run_in_fp8() -> None:
    model = nn.Sequential(nn.Linear(64, 64), _Attention(), nn.Linear(64, 64))
    profile = count_layers(model, torch.empty(2, 8, 64), dtype=torch.bfloat16)
    first, middle, last = fp8_tables([layer.forward for layer in profile.layers])
    assert not first[1].any() and not last[1].any()  # the first and last layers keep BF16
    table, fp8 = middle
    products = table.kinds_or_default() == MATMUL
    assert products.sum() == 3 and fp8.sum() == 1  # the Linear in FP8; Q K^T and @ V (bmm) in BF16
    assert fp8.tolist() == (products & table.linear_or_default()).tolist()


def test_a_cast_feeds_each_fp8_product_whose_rows_grow_with_the_batch() -> None:
    layer = _linears().layers[1]
    per_sample = TOKENS * WIDTH  # elements of x[M, K] (forward) or dy[M, K] (input gradient) per sample
    (forward, fp8), = fp8_tables([layer.forward, layer.forward, layer.forward])[1:2]
    assert forward.kernels == layer.forward.kernels + 1
    cast = int(np.flatnonzero(fp8)[0]) - 1  # just before its product
    assert forward.kinds_or_default()[cast] == MEMORY_BOUND and not forward.flops[cast].any()
    assert forward.bytes[cast].tolist() == [0.0, CAST_BYTES_PER_ELEMENT * per_sample]
    backward, fp8 = fp8_tables([layer.backward, layer.backward, layer.backward])[1]
    assert fp8.sum() == 2  # input and weight gradients, both FP8
    assert backward.kernels == layer.backward.kernels + 1  # dy's cast; the weight gradient reads the transposes
    extra = backward.bytes.sum(axis=0) - layer.backward.bytes.sum(axis=0)
    assert extra.tolist() == [0.0, CAST_BYTES_PER_ELEMENT * per_sample]


def test_a_gemm_heavy_layer_runs_faster_in_fp8_but_not_twice_as_fast() -> None:
    h100 = get_device("h100-sxm")
    assert h100.peak_flops["fp8"] == 2 * h100.peak_flops["bf16"]
    seconds = {}
    for policy in ("bf16-adam", "fp8-adam"):
        forward, backward = FlopCosts(_linears(), h100, policy).layer_seconds(8)
        seconds[policy] = forward + backward
    speedup = seconds["bf16-adam"] / seconds["fp8-adam"]
    assert speedup[[0, -1]].tolist() == [1.0, 1.0]  # first and last layers: BF16
    roofline = h100.roofline
    assert roofline is not None
    products = roofline.matmul["fp8"] * h100.peak_flops["fp8"] / (roofline.matmul["bf16"] * h100.peak_flops["bf16"])
    assert products < 2.0  # 1.71: the roofline's fp8 fraction is below its bf16 one
    assert (1.0 < speedup[1:-1]).all() and (speedup[1:-1] < products).all()  # casts and fixed costs stay


def test_a_device_without_fp8_refuses_the_policy() -> None:
    with pytest.raises(KeyError, match="a100-80gb has no FP8 peak"):
        FlopCosts(_linears(), get_device("a100-80gb"), "fp8-adam")


def test_the_cli_refuses_fp8_on_an_a100_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "gpt:1.3b", "--batch", "64", "--gpus", "8", "--hardware", "a100-80gb",
                 "--training", "fp8-adam"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a100-80gb has no FP8" in err


def test_fp8_plans_a_higher_throughput_than_bf16_on_an_h100(capsys: pytest.CaptureFixture[str]) -> None:
    throughput = {}
    for policy in ("bf16-adam", "fp8-adam"):
        assert main(["plan", "--model", "gpt:1.3b", "--batch", "64", "--gpus", "8", "--hardware", "h100-sxm",
                     "--link", "nvlink", "--training", policy, "--no-progress", "--stages", "2",
                     "--tensor-parallel", "1", "--chunks", "8", "--schedule", "1f1b", "--checkpoint", "never",
                     "--top", "1", "--json"]) == 0
        best = json.loads(capsys.readouterr().out)["best"]
        assert (best["stages"], best["replicas"], best["chunks"]) == (2, 4, 8)
        throughput[policy] = best["throughput"]
    assert throughput["bf16-adam"] < throughput["fp8-adam"] < 2 * throughput["bf16-adam"]
