"""The fused kernels, a spec's default (Note [spec defaults] in sim.planning.counting.models).

Megatron-LM's for gpt (Note [fused kernels] in sim.planning.counting.models.decoder_layers): each counted as one kernel
with the bytes it reads and writes, gradients that are the math form's, and a block with the eager one's FLOPs and saved
activations (Korthikanti et al.'s ``s·b·h·(34 + 5·a·s/h)`` in 16 bits, plus the LayerNorms' fp32 statistics, 16·s·b)
that moves fewer bytes in fewer kernels. Megatron-Core's and TransformerEngine's for llama (the same Note): RMSNorm,
SwiGLU and RoPE one kernel each way, the eager model's outputs and gradients.
And what a default block keeps, with FlashAttention, against each family's closed form (Note [saved activations] in
sim.planning.counting.models.gpt and sim.planning.counting.models.llama)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
import torch
from torch import nn

from sim.planning.counting.counts import MEMORY_BOUND, VECTOR_MATH, ModelProfile
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.counting.models.gpt import GPTConfig, gpt, gpt_sample
from sim.planning.counting.models.kernels import bias_dropout_add, bias_gelu, causal_softmax, rms_norm, rope, swiglu
from sim.planning.counting.models.llama import LlamaConfig, llama, llama_sample
from sim.planning.parallel.recompute import core_table

H, A, S, V = 256, 8, 128, 1000
SPEC = f"gpt:layers=2,hidden={H},heads={A},seq={S},vocab={V}"
EAGER, FUSED = ",kernels=eager,attention=math", ",attention=math"  # the math attention, to compare the kernels alone
LH, LA, LK, LF, LS = 128, 8, 2, 352, 64  # the small Llama's hidden, heads, key/value heads, MLP width, tokens
LLAMA = f"llama:layers=2,hidden={LH},heads={LA},kv-heads={LK},ffn={LF},seq={LS},vocab=100"


class _Op(nn.Module):
    """One fused operator as a layer; ``bias`` and ``residual`` stand in as a parameter and a second input."""

    def __init__(self, op: Callable[..., torch.Tensor], width: int = 0) -> None:
        super().__init__()
        self.op = op
        self.bias = nn.Parameter(torch.zeros(width)) if width else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self.bias) if self.bias is not None else self.op(x)


def _one_op(op: Callable[..., torch.Tensor], shape: tuple[int, ...], width: int = 0) -> ModelProfile:
    """The op counted as the second layer (after a linear, so its input needs a gradient), in 16 bits."""
    model = nn.Sequential(nn.Linear(shape[-1], shape[-1]), _Op(op, width))
    return count_layers(model, torch.empty(shape, device="meta"), dtype=torch.float16)


def test_the_causal_softmax_is_one_kernel_each_way() -> None:
    b, heads, s = 2, 4, 16
    layer = _one_op(lambda x: causal_softmax(x, 0.25), (b, heads, s, s)).layers[1]
    scores = 2 * heads * s * s  # bytes per sample of the scores in 16 bits
    assert layer.forward.kinds_or_default().tolist() == [VECTOR_MATH]
    assert layer.forward.bytes[0].tolist() == [0, 2 * scores]  # reads the scores, writes the probabilities
    assert layer.backward.kinds_or_default().tolist() == [VECTOR_MATH]
    assert layer.backward.bytes[0].tolist() == [0, 3 * scores]  # reads the output and its gradient, writes one
    assert layer.saved_bytes == (0, scores)  # its output, as the math form's softmax


def test_bias_gelu_is_one_kernel_forward_and_one_and_the_bias_sum_backward() -> None:
    b, s, f = 2, 16, 64
    layer = _one_op(bias_gelu, (b, s, f), width=f).layers[1]
    x = 2 * s * f  # bytes per sample
    assert layer.forward.kinds_or_default().tolist() == [VECTOR_MATH]
    assert layer.forward.bytes.tolist() == [[2 * f, 2 * x]]  # reads x and the bias, writes the output
    assert layer.backward.kinds_or_default().tolist()[:2] == [VECTOR_MATH, MEMORY_BOUND]  # then accumulations
    assert layer.backward.bytes[:2].tolist() == [[2 * f, 3 * x], [2 * f, x]]  # the kernel; the bias gradient's sum
    assert layer.saved_bytes == (0, x)  # GELU's input; the bias is a parameter


def test_bias_dropout_add_is_one_kernel_that_keeps_a_one_byte_mask() -> None:
    b, s, h = 2, 16, 64

    def op(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return bias_dropout_add(x, bias, x, 0.1)[0]  # the layer's input as the residual

    layer = _one_op(op, (b, s, h), width=h).layers[1]
    x = 2 * s * h
    assert layer.forward.kinds_or_default().tolist() == [MEMORY_BOUND]
    assert layer.forward.bytes.tolist() == [[2 * h, 3 * x + x // 2]]  # x, bias and residual; the sum and its mask
    assert layer.backward.bytes[:2].tolist() == [[0, 2 * x + x // 2], [2 * h, x]]  # dropout's backward; the bias's sum
    assert layer.saved_bytes == (0, x // 2)  # the mask alone


def test_gradients_are_the_math_forms() -> None:
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda y: causal_softmax(y, 0.3), (scores,))
    assert torch.autograd.gradcheck(bias_gelu, (x, bias))
    assert torch.autograd.gradcheck(lambda a, c, r: bias_dropout_add(a, c, r, 0.0)[0], (x, bias, x.detach() + 1))
    out, keep = bias_dropout_add(x, bias, x, 0.5)
    out.sum().backward()
    torch.testing.assert_close(bias.grad, (keep * 2.0).sum((0, 1)).to(torch.float64))


def test_the_fused_gpt_computes_the_math_gpt_and_trains() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=8, vocab_size=50)
    plain, fused = gpt(cfg).eval(), gpt(cfg, kernels="megatron").eval()
    fused.load_state_dict(plain.state_dict())
    ids = gpt_sample(cfg, 3, "cpu")
    torch.testing.assert_close(fused(ids), plain(ids))
    fused.train()(ids).pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fused.parameters())


@cache
def _profile(kernels: str, t: int, sequence_parallel: bool = False, spec: str = SPEC) -> ModelProfile:
    return get_model(spec + kernels).tensor_parallel(t, sequence_parallel).count(torch.float16)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_the_fused_block_has_the_math_blocks_flops(t: int) -> None:
    for eager, fused in zip(_profile(EAGER, t).at(3), _profile(FUSED, t).at(3), strict=True):
        assert (fused.forward_flops, fused.backward_flops) == (eager.forward_flops, eager.backward_flops)


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("b", [2, 3])
def test_saved_activations_are_korthikantis(t: int, b: int) -> None:
    block = _profile(FUSED, t).at(b)[1]
    formula = S * b * H * (34 + 5 * A * S / H) if t == 1 else S * b * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert block.saved_bytes == formula + 16 * S * b
    profile = _profile(FUSED, t)
    assert profile.attention_core is not None  # selective recompute finds the core and drops its 5·a·s²·b/t bytes
    assert core_table(profile.layers[1].forward, profile.attention_core).kernels == 5  # QK^T, softmax, dropout, V, @V
    assert profile.attention_core.saved_bytes * b == 5 * A * S * S * b / t


@pytest.mark.parametrize("t", [1, 2])
def test_the_fused_block_moves_fewer_bytes_in_fewer_kernels(t: int) -> None:
    """Forward: the scale and the mask no longer pass over the ``E = b·a·s²/t`` scores (4E bytes each, and the s×s
    mask), and each residual branch's dropout and add (5N + 6N bytes, ``N = b·s·h``) become one kernel (7N), its
    bias read there instead of in the GEMM. Backward: the scale's and mask's gradients go (8E + s²), and the bias-GELU
    kernel reads the bias (2F/t) that the GELU's backward did not."""
    b = 3
    eager, fused = _profile(EAGER, t).at(b)[1], _profile(FUSED, t).at(b)[1]
    e, n, f = b * A * S * S // t, b * S * H, 4 * H // t
    assert eager.forward_bytes - fused.forward_bytes == 8 * e + S * S + 8 * n
    assert eager.backward_bytes - fused.backward_bytes == 8 * e + S * S - 2 * f
    assert eager.forward_kernels - fused.forward_kernels == 4  # mul and masked_fill; two dropout-and-add pairs
    assert eager.backward_kernels - fused.backward_kernels == 2


@pytest.mark.parametrize(("spec", "canonical"), [
    (f"gpt:kernels=megatron,vocab={V},seq={S},heads={A},hidden={H},layers=2", SPEC),  # the default, left out
    (SPEC + ",kernels=eager", SPEC + ",kernels=eager"),
    ("gpt:175b", "gpt:175b"),
    ("gpt:175b,attention=math,kernels=eager", "gpt:175b,kernels=eager,attention=math"),
    ("gpt:175b,kernels=megatron,attention=flash", "gpt:175b"),
    ("llama:405b,kernels=megatron", "llama:405b"),
    ("llama:405b,attention=math,kernels=eager", "llama:405b,kernels=eager,attention=math"),
    (LLAMA + ",kernels=eager", LLAMA + ",kernels=eager"),
])
def test_the_spec_names_the_kernels(spec: str, canonical: str) -> None:
    entry = get_model(spec)
    assert entry.name == canonical and get_model(entry.name).description == entry.description
    assert ("fused kernels" in entry.description) == ("eager" not in canonical)


@pytest.mark.parametrize("family", [SPEC, LLAMA, "llama:8b"])
def test_an_unknown_kernels_value_is_refused(family: str) -> None:
    with pytest.raises(KeyError, match="kernels='fast' is not one of megatron, eager"):
        get_model(family + ",kernels=fast")
    with pytest.raises(ValueError, match="kernels must be 'eager' or 'megatron'"):
        GPTConfig(kernels="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kernels must be 'eager' or 'megatron'"):
        LlamaConfig(kernels="fast")  # type: ignore[arg-type]


# -- Megatron-Core's and TransformerEngine's kernels of a Llama block ----------------------------------------------


def test_rms_norm_is_one_kernel_each_way_that_keeps_its_input_and_fp32_statistics() -> None:
    b, s, h = 2, 16, 64
    layer = _one_op(lambda x, w: rms_norm(x, w, 1e-5)[0], (b, s, h), width=h).layers[1]
    x, rows = 2 * s * h, 4 * s  # bytes per sample: the input; each row's 1/rms in fp32
    assert layer.forward.kinds_or_default().tolist() == [VECTOR_MATH]
    assert layer.forward.bytes.tolist() == [[2 * h, 2 * x + rows]]  # reads x and the weight, writes y and 1/rms
    assert layer.backward.kinds_or_default().tolist()[0] == VECTOR_MATH
    assert layer.backward.bytes[0].tolist() == [4 * h, 3 * x + rows]  # and writes the weight's gradient
    assert layer.saved_bytes == (0, x + rows)


def test_swiglu_is_one_kernel_each_way_that_keeps_gate_and_up() -> None:
    b, s, f = 2, 16, 64

    def op(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return swiglu(gate, up)

    layer = _one_op(op, (b, s, 2 * f)).layers[1]
    x = 2 * s * f  # bytes per sample of gate (and of up)
    assert layer.forward.kinds_or_default().tolist() == [VECTOR_MATH]
    assert layer.forward.bytes.tolist() == [[0, 3 * x]]
    assert layer.backward.kinds_or_default().tolist()[0] == VECTOR_MATH
    assert layer.backward.bytes[0].tolist() == [0, 5 * x]  # reads the gradient, gate and up; writes two
    assert layer.saved_bytes == (0, 2 * x)


def test_rope_is_one_kernel_each_way_that_keeps_no_activation() -> None:
    b, s, heads, d = 2, 16, 4, 8
    tables = 2 * 2 * s * d  # cos and sin, (T, d) each in 16 bits

    class _Rope(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cos", torch.ones(s, d))
            self.register_buffer("sin", torch.zeros(s, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return rope(x.view(x.shape[0], s, heads, d), self.cos, self.sin)

    model = nn.Sequential(nn.Linear(heads * d, heads * d), _Rope())
    layer = count_layers(model, torch.empty(b, s, heads * d, device="meta"), dtype=torch.float16).layers[1]
    x = 2 * s * heads * d
    assert layer.forward.kinds_or_default().tolist() == [MEMORY_BOUND]
    assert layer.forward.bytes.tolist() == [[tables, 2 * x]]
    assert layer.backward.bytes.tolist() == [[tables, 2 * x]]
    assert layer.saved_bytes == (0, 0)  # the tables are buffers


def test_the_llama_kernels_gradients_are_the_math_forms() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    up = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    cos, sin = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, g: rms_norm(a, g, 1e-5)[0], (x, w))
    torch.testing.assert_close(rms_norm(x, w, 1e-5)[0], nn.functional.rms_norm(x, (4,), w, 1e-5))
    assert torch.autograd.gradcheck(swiglu, (x, up))
    assert torch.autograd.gradcheck(lambda a: rope(a, cos, sin), (x,))


@pytest.mark.parametrize("attention", ["math", "flash"])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_the_fused_llama_computes_the_eager_llama_and_its_gradients(attention: str, kv_heads: int) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(n_layer=2, n_head=4, n_kv_head=kv_heads, d_model=32, ffn=48, seq_len=8, vocab_size=50,
                      attention=attention)  # type: ignore[arg-type]
    eager, fused = llama(cfg).double(), llama(cfg, kernels="megatron").double()
    fused.load_state_dict(eager.state_dict())
    ids = llama_sample(cfg, 3, "cpu")
    expected, got = eager(ids), fused(ids)
    torch.testing.assert_close(got, expected)
    expected.pow(2).mean().backward()
    got.pow(2).mean().backward()
    for (name, a), b in zip(eager.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


@pytest.mark.parametrize("t", [1, 2])
def test_the_fused_llama_block_has_the_eager_blocks_flops_in_fewer_kernels(t: int) -> None:
    eager, fused = (_profile(k, t, spec=LLAMA).at(3)[1] for k in (",kernels=eager", ""))
    assert (fused.forward_flops, fused.backward_flops) == (eager.forward_flops, eager.backward_flops)
    assert fused.forward_kernels < eager.forward_kernels and fused.backward_kernels < eager.backward_kernels
    assert fused.forward_bytes < eager.forward_bytes and fused.saved_bytes < eager.saved_bytes


# -- what a default block keeps ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (4, False), (2, True), (4, True)])
@pytest.mark.parametrize("b", [2, 3])
def test_a_default_gpt_block_keeps_the_closed_form(t: int, sp: bool, b: int) -> None:
    """Note [saved activations] in sim.planning.counting.models.gpt: ``s·b·h·(10 + 24/t) + 4·a·s·b/t + 16·s·b + 16``,
    every term but the seed over ``t`` with sequence parallelism."""
    block = _profile("", t, sp).at(b)[1]
    if sp:
        formula = (S * b * H * 34 + 4 * A * S * b + 16 * S * b) / t + 16
    else:
        formula = S * b * H * (10 + 24 / t) + 4 * A * S * b / t + 16 * S * b + 16
    assert block.saved_bytes == formula


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("b", [2, 3])
def test_a_default_llama_block_keeps_the_closed_form(t: int, sp: bool, b: int) -> None:
    """Note [saved activations] in sim.planning.counting.models.llama: ``s·b·h·(8 + (4 + 4·K/a)/t) + 6·s·b·F/t +
    4·a·s·b/t + 8·s·b``, all of it over ``t`` with sequence parallelism; the K and V heads a fraction K/a of the
    queries."""
    block = _profile("", t, sp, LLAMA).at(b)[1]
    s, h = LS * b, LH  # s·b and h
    if sp:
        formula = (s * h * (12 + 4 * LK / LA) + 6 * s * LF + 4 * LA * s + 8 * s) / t
    else:
        formula = s * h * (8 + (4 + 4 * LK / LA) / t) + 6 * s * LF / t + 4 * LA * s / t + 8 * s
    assert block.saved_bytes == formula
