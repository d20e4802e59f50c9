"""Tensor parallelism in the planner: a rank's shard counted at its sharded shapes, its all-reduces, its memory.

The closed forms are Korthikanti et al. (2022)'s activations per layer in 16 bits with the math attention,
``s·b·h·(34 + 5·a·s/h)`` bytes whole and ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` on one of ``t`` ranks; the counter
sees 16·s·b bytes more, the fp32 mean and 1/std of the block's two LayerNorms.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch

from sim.cli import main
from sim.core.link import LinkSpec
from sim.core.rings import allreduce_seconds
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import COLLECTIVE, MATMUL, ModelProfile, OpTable
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.counting.models.gpt import GPTConfig, gpt, gpt_sample
from sim.planning.counting.models.llama import LlamaConfig, llama, llama_sample
from sim.planning.hardware.catalog import get_device
from sim.planning.hardware.roofline import shape_factor
from sim.planning.plan import PlanRequest, check_tensor_parallel, plan

H, A, S, V = 256, 8, 128, 1000  # hidden, heads, tokens, vocabulary of the small GPT
SMALL = f"gpt:layers=2,hidden={H},heads={A},seq={S},vocab={V}"


def _config(t: int, layers: int = 2) -> GPTConfig:
    return GPTConfig(n_layer=layers, n_head=A, d_model=H, seq_len=S, vocab_size=V, tensor_parallel=t)


@cache
def _profile(t: int) -> ModelProfile:
    cfg = _config(t)
    with torch.device("meta"):
        model = gpt(cfg)
    return count_layers(model, gpt_sample(cfg, 2), dtype=torch.float16)


def _collectives(table: OpTable, batch: int) -> list[float]:
    return [float(x) for x in table.bytes_at(batch)[table.kinds_or_default() == COLLECTIVE]]


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("b", [2, 3])
def test_saved_activations_per_layer_are_korthikantis(t: int, b: int) -> None:
    block = _profile(t).at(b)[1]
    if t == 1:
        formula = S * b * H * (34 + 5 * A * S / H)
    else:
        formula = S * b * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert block.saved_bytes == formula + 16 * S * b


@pytest.mark.parametrize("t", [2, 4])
def test_two_all_reduces_of_b_s_h_per_layer_in_each_pass(t: int) -> None:
    profile = _profile(t)
    assert profile.tensor_parallel == t
    b = 3
    message = 2 * b * S * H  # bytes: b·s·h elements in 16 bits
    embedding, block, _, head = profile.layers
    assert _collectives(block.forward, b) == [message, message]  # g after attention's projection, after the MLP
    assert _collectives(block.backward, b) == [message, message]  # f before the MLP, before QKV
    assert _collectives(embedding.forward, b) == [message]  # the vocabulary-parallel lookup's partial sums
    assert _collectives(head.backward, b) == [message]  # the gradient of the head's input
    assert not _collectives(embedding.backward, b) and not _collectives(head.forward, b)


def test_a_whole_model_has_no_collectives() -> None:
    profile = _profile(1)
    assert profile.tensor_parallel == 1
    assert not any(_collectives(layer.forward, 2) + _collectives(layer.backward, 2) for layer in profile.layers)


def test_the_shards_parameters_are_the_layer_matrices_over_t_and_the_norms_whole() -> None:
    f = 4 * H
    whole, half = _profile(1).layers[1], _profile(2).layers[1]
    matrices, split_biases, replicated = 4 * H * H + 2 * H * f, 3 * H + f, 4 * H + 2 * H  # LayerNorms, row biases
    assert whole.parameters == matrices + split_biases + replicated
    assert half.parameters == (matrices + split_biases) // 2 + replicated
    assert _profile(2).parameters == _config(2).shard_parameters


def test_a_llama_shard_splits_query_and_key_value_heads() -> None:
    cfg = LlamaConfig(n_layer=1, n_head=8, n_kv_head=2, d_model=128, ffn=256, seq_len=16, vocab_size=100,
                      tensor_parallel=2)
    with torch.device("meta"):
        model = llama(cfg)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert [shapes[f"block0.attn.{x}.weight"] for x in "qkvo"] == [(64, 128), (16, 128), (16, 128), (128, 64)]
    assert [shapes[f"block0.mlp.{x}.weight"] for x in ("gate", "up", "down")] == [(128, 128), (128, 128), (128, 128)]
    assert shapes["embedding.tokens.weight"] == shapes["head.out.weight"] == (50, 128)
    profile = count_layers(model, llama_sample(cfg, 2), dtype=torch.float16)
    assert profile.parameters == cfg.shard_parameters
    message = 2 * 2 * 16 * 128
    assert _collectives(profile.layers[1].forward, 2) == _collectives(profile.layers[1].backward, 2) == [message] * 2


def test_the_all_reduces_are_priced_as_a_ring_on_the_tensor_parallel_link() -> None:
    t, b = 4, 2
    device = get_device("a100-80gb")
    slow, instant = LinkSpec("slow", 1e-3, 1e9), LinkSpec("instant", 0.0, 1e30)
    fwd_slow, bwd_slow = FlopCosts(_profile(t), device, "fp16-adam", tensor_link=slow).layer_seconds(b)
    fwd_fast, bwd_fast = FlopCosts(_profile(t), device, "fp16-adam", tensor_link=instant).layer_seconds(b)
    ring = 2 * (t - 1) / t * (2 * b * S * H) / 1e9 + 2 * (t - 1) * 1e-3
    assert ring == pytest.approx(allreduce_seconds(2 * b * S * H, t, slow))
    assert fwd_slow[1] - fwd_fast[1] == pytest.approx(2 * ring)
    assert bwd_slow[1] - bwd_fast[1] == pytest.approx(2 * ring)
    with pytest.raises(ValueError, match="tensor_link"):
        FlopCosts(_profile(t), device, "fp16-adam")


def test_a_narrower_gemm_runs_at_a_lower_fraction_of_peak() -> None:
    """The shard's QKV GEMM (N = 3h/t) reaches less of the peak than the whole layer's (N = 3h)."""
    roofline = get_device("a100-80gb").roofline
    assert roofline is not None

    def qkv(t: int) -> np.ndarray:
        table = _profile(t).layers[1].forward
        first = int(np.flatnonzero(table.kinds_or_default() == MATMUL)[0])
        return table.dims_or_default()[first, :, 0] + table.dims_or_default()[first, :, 1] * 2  # M, N, K at b = 2

    whole, shard = qkv(1), qkv(4)
    assert shard[1] * 4 == whole[1] == 3 * H
    assert shape_factor(shard[None], roofline.half_dim)[0] < shape_factor(whole[None], roofline.half_dim)[0]


def test_a_tensor_parallel_plan_runs_each_rank_on_its_shard() -> None:
    profiles = {1: _profile(1), 2: _profile(2)}
    result = plan(PlanRequest(profile=profiles, batch=8, device="a100-80gb", gpus=[4], link="nvlink3",
                              training="fp16-adam", chunks=[2], checkpoints=["never"], schedules=["1f1b"],
                              tensor_parallel=(1, 2)))
    by_t = {(r.tensor_parallel, r.stages, r.replicas) for r in result.rows}
    assert by_t == {(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1)}
    row = next(r for r in result.rows if (r.tensor_parallel, r.stages) == (2, 1))
    assert row.gpus == 4 and row.parameters == _config(2).shard_parameters
    assert row.model_state_bytes == (16 * _config(2).shard_parameters,)
    assert row.to_dict()["tensor_parallel"] == 2
    alone = plan(PlanRequest(profile=profiles[1], batch=8, device="a100-80gb", gpus=[4], link="nvlink3",
                             training="fp16-adam", chunks=[2], checkpoints=["never"], schedules=["1f1b"]))
    assert alone.rows == tuple(r for r in result.rows if r.tensor_parallel == 1)  # t = 1: today's rows


@pytest.mark.parametrize(("degrees", "gpus", "message"), [
    ((16,), [16], "tensor parallel 16 spans more than a node of 8 GPUs"),
    ((4,), [6], "tensor parallel 4 does not divide 6 GPUs"),
    ((0,), [4], "integers >= 1"),
])
def test_check_tensor_parallel_refuses(degrees: tuple[int, ...], gpus: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_tensor_parallel(degrees, gpus)


def test_heads_a_degree_does_not_divide_are_refused() -> None:
    with pytest.raises(ValueError, match="does not divide the 8 attention heads"):
        _config(3)
    with pytest.raises(ValueError, match="does not divide the 2 key/value heads"):
        LlamaConfig(n_head=8, n_kv_head=2, d_model=128, ffn=256, tensor_parallel=4)
    with pytest.raises(ValueError, match="has no tensor-parallel split"):
        get_model("resnet101").tensor_parallel(2)


@pytest.mark.parametrize(("extra", "needle"), [
    (["--gpus", "16", "--tensor-parallel", "16"], "spans more than a node of 8 GPUs"),
    (["--gpus", "8", "--tensor-parallel", "4", "--gpus-per-node", "2"], "spans more than a node of 2 GPUs"),
    (["--gpus", "6", "--tensor-parallel", "4"], "does not divide 6 GPUs"),
    (["--gpus", "6", "--tensor-parallel", "3"], "does not divide the 8 attention heads"),
    (["--gpus", "2", "--tensor-parallel", "2", "--model", "resnet101"], "no tensor-parallel split"),
])
def test_the_cli_refuses_a_bad_degree_in_one_line_before_counting(extra: list[str], needle: str,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def count(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was counted")

    monkeypatch.setattr("sim.cli.plan.count_layers", count)
    assert main(["plan", "--model", SMALL, "--batch", "8", "--hardware", "a100-80gb", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpipe-sim plan: error: ") and needle in lines[0], lines


def test_the_cli_plans_with_tensor_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", SMALL, "--batch", "8", "--gpus", "4", "--hardware", "a100-80gb",
                 "--link", "nvlink", "--tensor-parallel", "2", "--stages", "2", "--chunks", "2",
                 "--checkpoint", "never", "--schedule", "1f1b", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "tp x pp x dp" in out  # sequence parallelism comes with it by default (Note [today's defaults])
    assert "best: 4 GPUs as tensor parallel 2 with sequence parallelism x 2 stages x 1 replicas" in out
