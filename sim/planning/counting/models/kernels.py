"""The decoders' kernels as custom operators the counter sees one each way: Megatron-LM's fused kernels, the fused
RMSNorm, SwiGLU and RoPE of Megatron-Core and TransformerEngine, and FlashAttention (Note [fused kernels] and Note
[flash attention] in :mod:`sim.planning.counting.models.decoder_layers`; their FLOPs, bytes and rate: Note [fused
kernels] and Note [flash attention] in :mod:`sim.planning.counting.operators`).

Each computes the real thing on a CPU, so a model built with them trains and its gradients can be checked against
the math form's; on meta its fake returns the shapes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["bias_dropout_add", "bias_gelu", "causal_softmax", "flash_attention", "rms_norm", "rope", "swiglu"]


# -- Megatron-LM's fused kernels (Note [fused kernels] in decoder_layers) ------------------------------------------


@torch.library.custom_op("gpipe_sim::causal_softmax", mutates_args=())
def causal_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(scale * x)`` over the last dimension with the upper triangle of the last two masked, one kernel."""
    future = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).triu(1)
    return F.softmax((x * scale).masked_fill(future, float("-inf")), dim=-1)


@torch.library.custom_op("gpipe_sim::causal_softmax_backward", mutates_args=())
def causal_softmax_backward(grad: torch.Tensor, probs: torch.Tensor, scale: float) -> torch.Tensor:
    """The gradient of :func:`causal_softmax`'s input from its output's gradient and its output, one kernel."""
    return scale * probs * (grad - (grad * probs).sum(-1, keepdim=True))


@torch.library.custom_op("gpipe_sim::bias_gelu", mutates_args=())
def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x + bias)``, one kernel."""
    return F.gelu(x + bias)


@torch.library.custom_op("gpipe_sim::bias_gelu_backward", mutates_args=())
def bias_gelu_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`bias_gelu`'s ``x`` (and, summed, its bias), one kernel."""
    y = x + bias
    cdf = 0.5 * (1.0 + torch.erf(y * math.sqrt(0.5)))
    return grad * (cdf + y * torch.exp(-0.5 * y * y) / math.sqrt(2 * math.pi))


@torch.library.custom_op("gpipe_sim::bias_dropout_add", mutates_args=())
def bias_dropout_add(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                     p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual + dropout(x + bias)`` (``dropout(x)`` without a bias) and the dropout's mask (one byte an element),
    one kernel."""
    keep = torch.rand(x.shape, device=x.device) >= p
    return residual + (x if bias is None else x + bias) * keep * _dropout_scale(p), keep


def _dropout_scale(p: float) -> float:
    return 1.0 / (1.0 - p) if p < 1 else 0.0


@causal_softmax.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


@causal_softmax_backward.register_fake
def _(grad: torch.Tensor, probs: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(grad)


@bias_gelu.register_fake
def _(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@bias_gelu_backward.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@bias_dropout_add.register_fake
def _(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
      p: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(residual), torch.empty_like(x, dtype=torch.bool)


def _softmax_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)  # the probabilities, 2 a s^2 b / t bytes in 16 bits (as the math form's softmax)


def _softmax_grad(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    (probs,) = ctx.saved_tensors
    return causal_softmax_backward(grad, probs, ctx.scale), None


def _gelu_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)  # GELU's input (without its bias, which is a parameter)


def _gelu_grad(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, bias = ctx.saved_tensors
    grad_x = bias_gelu_backward(grad, x, bias)
    return grad_x, grad_x.sum(tuple(range(grad_x.dim() - 1)))  # the bias gradient: a reduction, as Megatron's


def _dropout_add_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    ctx.scale = _dropout_scale(inputs[3])
    ctx.bias = inputs[1] is not None
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zero gradient made for the mask
    ctx.save_for_backward(output[1])  # the mask alone


def _dropout_add_grad(ctx: Any, grad: torch.Tensor | None, _: Any) -> tuple[torch.Tensor | None, ...]:
    if grad is None:  # the sum unused (gradients are not materialised, for the mask's sake)
        return None, None, None, None
    (keep,) = ctx.saved_tensors
    grad_x = torch.ops.aten.native_dropout_backward(grad, keep, ctx.scale)
    grad_bias = grad_x.sum(tuple(range(grad_x.dim() - 1))) if ctx.bias else None
    return grad_x, grad_bias, grad, None


causal_softmax.register_autograd(_softmax_grad, setup_context=_softmax_context)
bias_gelu.register_autograd(_gelu_grad, setup_context=_gelu_context)
bias_dropout_add.register_autograd(_dropout_add_grad, setup_context=_dropout_add_context)


# -- FlashAttention (Note [flash attention]) -----------------------------------------------------------------------


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The logsumexp's dtype: float32 for 16-bit inputs, as FlashAttention keeps it, or the inputs' if wider."""
    return torch.promote_types(dtype, torch.float32)


def _causal_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """The scaled scores (B, A, T, T) of ``q`` (B, T, A, d) against ``k`` (B, T, K, d), the future at -inf; query
    head ``i`` reads key head ``i // (A/K)``."""
    group = q.shape[2] // k.shape[2]
    keys = k.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, A, T, d)
    scores = (q.transpose(1, 2) @ keys.transpose(-2, -1)) * scale
    future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(future, float("-inf"))


def _dropout_keep(rng_state: torch.Tensor | None, shape: torch.Size, p: float, device: torch.device
                  ) -> torch.Tensor | None:
    """The dropout's keep-mask, drawn again from its seed (``rng_state[0]``); ``None`` without dropout."""
    if rng_state is None or p <= 0:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(int(rng_state[0]))
    return torch.rand(shape, generator=generator, device=device) >= p


@torch.library.custom_op("gpipe_sim::flash_attention", mutates_args=())
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal attention of ``q`` (B, T, A, d) over ``k`` and ``v`` (B, T, K, d), K dividing A, one kernel.

    Returns the output (B, T, A, d), each query row's logsumexp of its scaled scores (B, A, T; float32 for 16-bit
    inputs) and the seed and offset of the dropout applied to the probabilities (two int64s, FlashAttention's
    ``rng_state``; offset 0 here).
    """
    rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    if dropout_p > 0:
        rng_state[0] = torch.randint(2**62, (), device=q.device)
    scores = _causal_scores(q, k, scale)
    lse = torch.logsumexp(scores.to(_lse_dtype(q.dtype)), dim=-1)  # (B, A, T)
    probs = torch.exp(scores.to(lse.dtype) - lse.unsqueeze(-1)).to(q.dtype)
    keep = _dropout_keep(rng_state, probs.shape, dropout_p, q.device)
    if keep is not None:
        probs = probs * keep * _dropout_scale(dropout_p)
    values = v.transpose(1, 2).repeat_interleave(q.shape[2] // k.shape[2], dim=1)  # (B, A, T, d)
    return (probs @ values).transpose(1, 2).contiguous(), lse, rng_state


@torch.library.custom_op("gpipe_sim::flash_attention_backward", mutates_args=())
def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, grad: torch.Tensor, rng_state: torch.Tensor | None, scale: float,
                             dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`flash_attention`'s ``q``, ``k`` and ``v`` from its output's gradient, one kernel that
    computes the probabilities again from the scores and ``lse`` (and the dropout's mask from its seed)."""
    b, t, a, d = q.shape
    heads = k.shape[2]
    group = a // heads
    probs = torch.exp(_causal_scores(q, k, scale).to(lse.dtype) - lse.unsqueeze(-1)).to(q.dtype)  # (B, A, T, T)
    keep = _dropout_keep(rng_state, probs.shape, dropout_p, q.device)
    kept = probs if keep is None else probs * keep * _dropout_scale(dropout_p)
    grad_h = grad.transpose(1, 2)  # (B, A, T, d)
    values = v.transpose(1, 2).repeat_interleave(group, dim=1)
    grad_probs = grad_h @ values.transpose(-2, -1)  # (B, A, T, T)
    if keep is not None:
        grad_probs = grad_probs * keep * _dropout_scale(dropout_p)
    rowsum = (grad_h * out.transpose(1, 2)).sum(-1, keepdim=True)  # = sum_j P_ij dP_ij, from o (FlashAttention-2)
    grad_scores = probs * (grad_probs - rowsum) * scale
    keys = k.transpose(1, 2).repeat_interleave(group, dim=1)
    grad_q = grad_scores @ keys  # (B, A, T, d)
    grad_k = (grad_scores.transpose(-2, -1) @ q.transpose(1, 2)).view(b, heads, group, t, d).sum(2)  # (B, K, T, d)
    grad_v = (kept.transpose(-2, -1) @ grad_h).view(b, heads, group, t, v.shape[-1]).sum(2)
    return (grad_q.transpose(1, 2).contiguous(), grad_k.transpose(1, 2).contiguous(),
            grad_v.transpose(1, 2).contiguous())


@flash_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
      dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t, a, _ = q.shape
    return (q.new_empty(b, t, a, v.shape[-1]), q.new_empty(b, a, t, dtype=_lse_dtype(q.dtype)),
            q.new_empty(2, dtype=torch.int64))


@flash_attention_backward.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor,
      rng_state: torch.Tensor | None, scale: float, dropout_p: float
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _flash_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    q, k, v, ctx.scale, ctx.p = inputs
    out, lse, rng_state = output
    ctx.mark_non_differentiable(lse, rng_state)
    ctx.set_materialize_grads(False)  # no zero gradients made for lse and the seed
    ctx.save_for_backward(q, k, v, out, lse, *((rng_state,) if ctx.p > 0 else ()))  # no s x s tensor


def _flash_grad(ctx: Any, grad: torch.Tensor | None, _: Any, __: Any) -> tuple[torch.Tensor | None, ...]:
    if grad is None:  # the output unused
        return None, None, None, None, None
    q, k, v, out, lse, *rng_state = ctx.saved_tensors
    seed = rng_state[0] if rng_state else None
    return (*flash_attention_backward(q, k, v, out, lse, grad, seed, ctx.scale, ctx.p), None, None)


flash_attention.register_autograd(_flash_grad, setup_context=_flash_context)


# -- Megatron-Core's and TransformerEngine's kernels (Note [fused kernels] in decoder_layers) ----------------------


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """A normalisation's statistics' dtype: float32 for 16-bit inputs, as the fused kernels keep them."""
    return torch.promote_types(dtype, torch.float32)


@torch.library.custom_op("gpipe_sim::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight * x / sqrt(mean(x²) + eps)`` over the last dimension and each row's ``1/rms`` (float32 for 16-bit
    inputs), one kernel (TransformerEngine's fused RMSNorm)."""
    rstd = torch.rsqrt(x.to(_stats_dtype(x.dtype)).pow(2).mean(-1) + eps)  # (...,)
    return (x * rstd.unsqueeze(-1)).to(x.dtype) * weight, rstd


@torch.library.custom_op("gpipe_sim::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of :func:`rms_norm`'s ``x`` and ``weight`` from its output's gradient, one kernel."""
    r = rstd.unsqueeze(-1)
    normed = x.to(r.dtype) * r
    scaled = grad.to(r.dtype) * weight.to(r.dtype)  # the gradient of the normalised x
    grad_x = r * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
    grad_w = (grad.to(r.dtype) * normed).sum(tuple(range(x.dim() - 1)))
    return grad_x.to(x.dtype), grad_w.to(weight.dtype)


@torch.library.custom_op("gpipe_sim::swiglu", mutates_args=())
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, one kernel (Megatron-Core's ``bias_swiglu`` without a bias)."""
    return F.silu(gate) * up


@torch.library.custom_op("gpipe_sim::swiglu_backward", mutates_args=())
def swiglu_backward(grad: torch.Tensor, gate: torch.Tensor,
                    up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of :func:`swiglu`'s ``gate`` and ``up``, one kernel."""
    sig = torch.sigmoid(gate)
    return grad * up * sig * (1 + gate * (1 - sig)), grad * gate * sig


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's partner of each element: (-second half, first half) of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@torch.library.custom_op("gpipe_sim::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x`` (B, T, heads, d) from the position tables ``cos`` and ``sin`` (T, d), one kernel
    (TransformerEngine's fused RoPE in its ``bshd`` layout)."""
    return (x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)).to(x.dtype)


@torch.library.custom_op("gpipe_sim::rope_backward", mutates_args=())
def rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`rope`'s ``x``: the rotation back, one kernel that needs only the tables."""
    turned = grad * sin.unsqueeze(1)
    g1, g2 = turned.chunk(2, dim=-1)
    return (grad * cos.unsqueeze(1) + torch.cat((g2, -g1), dim=-1)).to(grad.dtype)  # the transpose of the turn


@rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=_stats_dtype(x.dtype))


@rms_norm_backward.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
      rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


@swiglu.register_fake
def _(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(gate)


@swiglu_backward.register_fake
def _(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(gate), torch.empty_like(up)


@rope.register_fake
def _(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@rope_backward.register_fake
def _(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(grad, memory_format=torch.contiguous_format)


def _rms_norm_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs[0], inputs[1], output[1])  # x, the weight (a parameter) and 1/rms: no output


def _rms_norm_grad(ctx: Any, grad: torch.Tensor | None, _: Any) -> tuple[torch.Tensor | None, ...]:
    if grad is None:
        return None, None, None
    x, weight, rstd = ctx.saved_tensors
    return (*rms_norm_backward(grad, x, weight, rstd), None)


def _swiglu_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)  # gate and up, the GEMMs' outputs; not the product


def _swiglu_grad(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = ctx.saved_tensors
    return swiglu_backward(grad, gate, up)


def _rope_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[1], inputs[2])  # the tables alone (buffers): no activation kept


def _rope_grad(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    cos, sin = ctx.saved_tensors
    return rope_backward(grad, cos, sin), None, None


rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_context)
swiglu.register_autograd(_swiglu_grad, setup_context=_swiglu_context)
rope.register_autograd(_rope_grad, setup_context=_rope_context)
