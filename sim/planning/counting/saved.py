"""What a layer's forward keeps for its backward, told apart by who keeps it: the Linear products' inputs (kept in FP8
under FP8 training) and the tensors marked modules produced (dropped by selective recompute of those modules).

Note [fp8 saved]: TransformerEngine's FP8 ``Linear`` keeps, for its weight gradient, its input as the FP8 copy it
cast for the forward's GEMM (the transpose the weight-gradient GEMM reads; ``saved_inputmat_t`` in
``transformer_engine/pytorch/module/linear.py``, the column-wise FP8 data in later releases), not the BF16 tensor;
DeepSeek-V3 does the same ("cache activations in FP8 format for the backward pass of the Linear operator", arXiv
2412.19437, section 3.3.3). So under an FP8 policy a saved storage that only Linear products keep costs one byte an
element, one copy for all the Linears that read it (Megatron-Core fuses the projections that share an input into
one TE module: q, k and v in ``linear_qkv``, gate and up in ``linear_fc1``), and one that other operators keep too
(attention's output, kept by FlashAttention and by the output projection) costs its BF16 bytes plus that copy. The
copies' scales (one FP32 per tensor, or per 128 elements with DeepSeek's tiles: 3%) are left out. Which operator
keeps what is read from the autograd graph right after the forward: the activation operand of every ``mm`` or
``addmm`` (and of the experts' grouped GEMM) is a Linear's input; any other saved tensor is kept by another
operator. The first and last layers of a sequential stay BF16 (Note [fp8 training] in
:mod:`sim.planning.counting.fp8`), so their bytes are BF16's whatever the policy.
"""

from __future__ import annotations

from typing import Any

import torch

from sim.planning.counting.counts import Held

__all__ = ["FP8_BYTES", "held", "kept"]

#: Bytes of one element of an FP8 copy (E4M3 or E5M2).
FP8_BYTES = 1

#: Autograd nodes of a Linear's product, with the saved operand that is its input (the other is the weight).
_LINEAR_INPUT = {"MmBackward0": "_saved_self", "AddmmBackward0": "_saved_mat1"}
#: Custom operators' nodes whose first saved tensor is a Linear's input (the experts' grouped GEMM).
_LINEAR_CUSTOM = ("grouped_mm",)


def _saved(node: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors ``node`` keeps for its backward, each with the name it keeps it under."""
    out: list[tuple[str, torch.Tensor]] = []
    if hasattr(node, "saved_tensors"):  # a Python autograd function (a custom operator's)
        try:
            out.extend((f"saved_tensors[{i}]", t) for i, t in enumerate(node.saved_tensors)
                       if isinstance(t, torch.Tensor))
        except RuntimeError:  # freed, or none saved
            pass
    for name in dir(node):
        if name.startswith("_saved_"):
            value = getattr(node, name)
            values = value if isinstance(value, (tuple, list)) else (value,)
            out.extend((name, t) for t in values if isinstance(t, torch.Tensor))
    return out


def _linear_input(node: Any) -> str | None:
    """The name ``node`` keeps a Linear's input under, or ``None``: not a Linear's product."""
    name = node.name()
    if name in _LINEAR_INPUT:
        return _LINEAR_INPUT[name]
    if any(op in name for op in _LINEAR_CUSTOM):
        return "saved_tensors[0]"
    return None


def kept(roots: list[torch.Tensor], new: dict[int, int], produced: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Bytes the storages of ``new`` (storage key -> bytes: those this layer saves first) cost, by the bits of the
    modules that produced them (``produced``; 0: none), each as ``(BF16, FP8)``: as the layer keeps them, and under FP8
    training (Note [fp8 saved]). ``roots``: the forward's outputs that need a gradient, whose graph is read."""
    copies: dict[int, int] = {}
    others: set[int] = set()
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    visited: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.extend(n for n, _ in node.next_functions if n is not None)
        linear = _linear_input(node)
        for name, t in _saved(node):
            key = int(t.untyped_storage()._cdata)
            if key not in new:
                continue
            if name == linear:
                copies[key] = max(copies.get(key, 0), t.numel() * FP8_BYTES)
            else:
                others.add(key)
    out: dict[int, tuple[int, int]] = {}
    for key, nbytes in new.items():
        fp8 = (nbytes if key in others or key not in copies else 0) + copies.get(key, 0)
        bits = produced.get(key, 0)
        bf16_sum, fp8_sum = out.get(bits, (0, 0))
        out[bits] = (bf16_sum + nbytes, fp8_sum + fp8)
    return out


def held(m1: dict[int, tuple[int, int]], m2: dict[int, tuple[int, int]], b: int) -> tuple[Held, ...]:
    """A layer's saved bytes by the modules that produced them, from :func:`kept` at batches ``b`` and ``2 b``, as
    ``fixed + per_sample * batch`` (Note [affine in the batch] in :mod:`sim.planning.counting.flops`)."""
    def affine(q1: int, q2: int) -> tuple[float, float]:
        slope = (q2 - q1) / b
        return q1 - slope * b, slope

    out = []
    for bits in sorted(set(m1) | set(m2)):
        (bf16_1, fp8_1), (bf16_2, fp8_2) = m1.get(bits, (0, 0)), m2.get(bits, (0, 0))
        out.append(Held(bits, affine(bf16_1, bf16_2), affine(fp8_1, fp8_2)))
    return tuple(out)
