"""FlashAttention (``attention=flash``, a spec's default; Note [flash attention] in
sim.planning.counting.models.decoder_layers and sim.planning.counting.operators):
the math attention's output and gradients, one kernel each way with the FLOPs it executes and no ``s × s`` tensor,
and no ``s × s`` tensor kept.

The closed form, per GPT block in 16 bits: Korthikanti et al.'s ``s·b·h·(34 + 5·a·s/h)`` less its ``5·a·s²·b`` (the
probabilities, 2 bytes each, the attention dropout's mask, 1, and its output, 2), plus the logsumexp in float32,
``4·a·s·b``, and the dropout's seed, 16 bytes::

    s·b·h·34 + 4·a·s·b + 16                  whole
    s·b·h·(10 + 24/t) + 4·a·s·b/t + 16       one of t tensor-parallel ranks
    (s·b·h·34 + 4·a·s·b)/t + 16              one of t ranks with sequence parallelism

The counter sees ``16·s·b`` bytes more (``16·s·b/t`` with sequence parallelism), the LayerNorms' fp32 mean and 1/std.
A Llama block keeps the math form's less its probabilities, ``2·a·s²·b/t``, plus the logsumexp, ``4·a·s·b/t``.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.counting.counts import MATMUL, ModelProfile, OpTable
from sim.planning.counting.models import get_model
from sim.planning.counting.models.gpt import GPTConfig, gpt, gpt_sample
from sim.planning.counting.models.kernels import flash_attention
from sim.planning.counting.models.llama import LlamaConfig, llama, llama_sample
from sim.planning.plan import PlanRequest, plan

H, A, S, V = 256, 8, 128, 1000  # hidden, heads, tokens, vocabulary of the small GPT
GPT = f"gpt:layers=2,hidden={H},heads={A},seq={S},vocab={V},kernels=eager"  # each test names the attention
FUSED_GPT = f"gpt:layers=2,hidden={H},heads={A},seq={S},vocab={V}"
LH, LA, LK, LS = 128, 8, 4, 32  # the small Llama's hidden, query heads, key/value heads, tokens
LLAMA = f"llama:layers=2,hidden={LH},heads={LA},kv-heads={LK},ffn=256,seq={LS},vocab=100,kernels=eager"


def _math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None = None,
                    p: float = 0.0) -> torch.Tensor:
    """The causal math form on (B, T, heads, d) tensors, query head i reading key/value head i // (A/K); ``keep``:
    the dropout's mask on the probabilities."""
    group = q.shape[2] // k.shape[2]
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    scores = (qh @ kh.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    future = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(1)
    probs = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    return (probs @ vh).transpose(1, 2)


def _qkv(heads: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    b, t, d = 2, 6, 4
    return tuple(torch.randn(b, t, n, d, dtype=torch.float64, requires_grad=True)  # type: ignore[return-value]
                 for n in (heads, kv_heads, kv_heads))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_the_operator_is_the_math_attention_with_its_gradients(kv_heads: int) -> None:
    q, k, v = _qkv(4, kv_heads)
    out, lse, _ = flash_attention(q, k, v, 0.5, 0.0)
    torch.testing.assert_close(out, _math_attention(q, k, v))
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    scores = (q.transpose(1, 2) @ k.transpose(1, 2).repeat_interleave(4 // kv_heads, 1).transpose(-2, -1)) * 0.5
    torch.testing.assert_close(lse, torch.logsumexp(scores.masked_fill(future, float("-inf")), -1))
    assert torch.autograd.gradcheck(lambda *x: flash_attention(*x, 0.5, 0.0)[0], (q, k, v))


def test_dropout_runs_inside_from_a_seed_that_the_backward_draws_again() -> None:
    q, k, v = _qkv(4, 2)
    p = 0.5
    out, _, rng_state = flash_attention(q, k, v, 0.5, p)
    generator = torch.Generator().manual_seed(int(rng_state[0]))
    keep = torch.rand((2, 4, 6, 6), generator=generator) >= p
    expected = _math_attention(q, k, v, keep, p)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    torch.testing.assert_close(got, torch.autograd.grad(expected, (q, k, v), grad))
    assert not torch.equal(flash_attention(q, k, v, 0.5, p)[0], out)  # a new seed each call


def _same_model(math_model: nn.Module, flash_model: nn.Module, ids: torch.Tensor) -> None:
    flash_model.load_state_dict(math_model.state_dict())
    expected, got = math_model(ids), flash_model(ids)
    torch.testing.assert_close(got, expected)
    expected.pow(2).mean().backward()
    got.pow(2).mean().backward()
    for (name, a), b in zip(math_model.named_parameters(), flash_model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


@pytest.mark.parametrize("kernels", ["eager", "megatron"])
def test_a_tiny_gpt_computes_the_math_gpt_and_its_gradients(kernels: str) -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=8, vocab_size=50, dropout=0.0,
                    kernels=kernels)  # type: ignore[arg-type]
    _same_model(gpt(cfg).double(), gpt(cfg, attention="flash").double(), gpt_sample(cfg, 3, "cpu"))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_a_tiny_llama_computes_the_math_llama_and_its_gradients(kv_heads: int) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(n_layer=2, n_head=4, n_kv_head=kv_heads, d_model=32, ffn=48, seq_len=8, vocab_size=50)
    _same_model(llama(cfg).double(), llama(cfg, attention="flash").double(), llama_sample(cfg, 3, "cpu"))


def test_a_tiny_shard_with_sequence_parallelism_trains_with_dropout_on_the_cpu() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=8, vocab_size=50, tensor_parallel=2,
                    sequence_parallel=True, attention="flash")
    model = gpt(cfg)
    out = model(torch.randint(cfg.shard_vocab, (3, 8)))
    assert out.shape == (3, 8, 25)
    out.pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# -- the count -----------------------------------------------------------------------------------------------------


@cache
def _profile(spec: str, t: int = 1, sequence_parallel: bool = False) -> ModelProfile:
    return get_model(spec).tensor_parallel(t, sequence_parallel).count(torch.float16)


def _flash_rows(table: OpTable | None, b: int, s: int, d: int) -> list[tuple[float, float, tuple[float, ...]]]:
    """(FLOPs, bytes, (M, N, K)) at ``b`` of each matrix multiply with N = s keys and K = the head width d: the
    FlashAttention kernels (the math form's score products have these dims too)."""
    assert table is not None
    dims = table.dims_or_default()[:, :, 0] + table.dims_or_default()[:, :, 1] * b
    rows = np.flatnonzero((table.kinds_or_default() == MATMUL) & (dims[:, 1] == s) & (dims[:, 2] == d))
    return [(float(table.flops_at(b)[i]), float(table.bytes_at(b)[i]), tuple(dims[i].tolist())) for i in rows]


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True)])
def test_one_gpt_kernel_each_way_executes_the_causal_half_and_moves_no_square(t: int, sp: bool) -> None:
    """Forward 2·b·(a/t)·s²·d FLOPs (half of 4·b·s²·h/t), reading q, k, v and writing o, the fp32 logsumexp and the
    16-byte seed; backward 2.5 times the FLOPs, reading q, k, v, o, do and the logsumexp (and the seed, with
    dropout), writing dq, dk, dv; both a GEMM of M = b·(a/t)·s rows, N = s keys, K = d."""
    b, d, a = 3, H // A, A // t
    x, lse = 2 * b * S * H // t, 4 * b * a * S  # bytes of q (k, v, o, dq, ...) and of the logsumexp
    forward = 2 * b * a * S * S * d
    dims = (b * a * S, S, d)
    block = _profile(GPT + ",attention=flash", t, sp).layers[1]
    assert _flash_rows(block.forward, b, S, d) == [(forward, 4 * x + lse + 16, dims)]
    assert _flash_rows(block.backward, b, S, d) == [(2.5 * forward, 8 * x + lse + 16, dims)]
    assert _flash_rows(block.input_backward, b, S, d) == _flash_rows(block.backward, b, S, d)  # a split backward's B
    math_block = _profile(GPT + ",attention=math", t, sp).layers[1].at(b)
    flash = _profile(GPT + ",attention=flash", t, sp).layers[1].at(b)
    attention = 4 * b * S * S * H // t  # the math form's forward QK^T and @V, the full square
    assert math_block.forward_flops - flash.forward_flops == attention // 2
    assert math_block.backward_flops - flash.backward_flops == 2 * attention - 5 * attention // 4


def test_one_llama_kernel_each_way_reads_the_key_value_heads_once() -> None:
    b, d = 3, LH // LA
    q, kv, lse = 2 * b * LS * LH, 2 * b * LS * LK * d, 4 * b * LA * LS
    forward = 2 * b * LA * LS * LS * d
    block = _profile(LLAMA + ",attention=flash").layers[1]
    assert _flash_rows(block.forward, b, LS, d) == [(forward, 2 * q + 2 * kv + lse + 16, (b * LA * LS, LS, d))]
    assert _flash_rows(block.backward, b, LS, d) == [(2.5 * forward, 4 * q + 4 * kv + lse, (b * LA * LS, LS, d))]


@pytest.mark.parametrize("spec", [GPT, FUSED_GPT])
@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (4, False), (2, True), (4, True)])
@pytest.mark.parametrize("b", [2, 3])
def test_a_gpt_block_keeps_korthikantis_activations_less_the_square(spec: str, t: int, sp: bool, b: int) -> None:
    block = _profile(spec + ",attention=flash", t, sp).at(b)[1]
    if sp:
        formula = (S * b * H * 34 + 4 * A * S * b) / t + 16 + 16 * S * b / t
    else:
        formula = S * b * H * (10 + 24 / t) + 4 * A * S * b / t + 16 + 16 * S * b
    assert block.saved_bytes == formula
    math_block = _profile(spec + ",attention=math", t, sp).at(b)[1]
    assert math_block.saved_bytes - block.saved_bytes == 5 * A * S * S * b / t - 4 * A * S * b / t - 16


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True)])
def test_a_llama_block_keeps_the_math_forms_less_the_probabilities(t: int, sp: bool) -> None:
    b = 3
    math_block = _profile(LLAMA + ",attention=math", t, sp).at(b)[1]
    flash = _profile(LLAMA + ",attention=flash", t, sp).at(b)[1]
    assert math_block.saved_bytes - flash.saved_bytes == (2 * LA * LS * LS * b - 4 * LA * LS * b) / t


@pytest.mark.parametrize("spec", [GPT, LLAMA])
def test_sequence_parallelism_leaves_the_flops_the_shards(spec: str) -> None:
    split, whole = _profile(spec + ",attention=flash", 2, True), _profile(spec + ",attention=flash", 2)
    for a, b in zip(split.layers, whole.layers, strict=True):
        assert (a.forward.flops_at(3).sum(), a.backward.flops_at(3).sum()) == \
            (b.forward.flops_at(3).sum(), b.backward.flops_at(3).sum())


# -- the spec and the planner --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "canonical"), [
    ("llama:70b,attention=math", "llama:70b,attention=math"),
    ("LLAMA:70B, attention = math", "llama:70b,attention=math"),
    ("llama:8b,attention=flash", "llama:8b"),  # the default, left out
    ("llama:8b", "llama:8b"),
    ("gpt:175b,attention=math,kernels=megatron", "gpt:175b,attention=math"),
    ("gpt:175b,attention=flash,kernels=eager", "gpt:175b,kernels=eager"),
    (f"gpt:attention=math,kernels=eager,vocab={V},seq={S},heads={A},hidden={H},layers=2", GPT + ",attention=math"),
    (LLAMA + ",attention=math", LLAMA + ",attention=math"),
    (LLAMA + ",attention=flash", LLAMA),
])
def test_the_spec_names_the_attention(spec: str, canonical: str) -> None:
    entry = get_model(spec)
    assert entry.name == canonical and get_model(entry.name).description == entry.description
    assert ("FlashAttention" in entry.description) == ("math" not in canonical)
    assert (entry.attention_core is None) == ("math" not in canonical)  # no core for selective recompute


@pytest.mark.parametrize(("spec", "message"), [
    ("llama:70b,attention=fast", "attention='fast' is not one of flash, math"),
    (GPT + ",attention=sdpa", "attention='sdpa' is not one of flash, math"),
    ("gpt:175b,layers=3", "a size takes only kernels, attention after it, not 'layers'"),
    ("llama:70b,kv-heads=4", "a size takes only kernels, attention after it, not 'kv-heads'"),
    ("llama:70b,attention=flash,attention=flash", "attention given twice"),
])
def test_a_bad_option_is_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(KeyError, match=message) as info:
        get_model(spec)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="attention must be 'math', 'sdpa' or 'flash'"):
        LlamaConfig(attention="fast")  # type: ignore[arg-type]


def test_selective_recompute_is_refused() -> None:
    with pytest.raises(ValueError, match="checkpoint selective recomputes the attention core, which this model has "
                                         "not"):
        plan(PlanRequest(profile=_profile(FUSED_GPT), batch=8, device="a100-80gb", gpus=[2],
                         link="nvlink3", training="fp16-adam", checkpoints=["selective"]))
