"""Megatron-LM's tensor-parallel collectives as operators the counter sees: an all-reduce marker and its f and g.

A transformer layer split over ``t`` ranks (Shoeybi et al., 2019) runs each GEMM at its sharded shape and joins
the partial results with all-reduces. Counted on one rank, the shard is an ordinary model plus those collectives::

    x ── f ── column-parallel GEMMs (QKV; the MLP's first) ── row-parallel GEMM (proj; the MLP's second) ── g ── y
    f: identity forward, all-reduce of the input's gradient in the backward
    g: all-reduce forward, identity in the backward

Both call :func:`all_reduce`, a custom operator (``gpipe_sim::all_reduce``) that is an identity on every device,
meta included: a marker. The counter (:mod:`sim.planning.operators`) records it as a
:data:`~sim.planning.counts.COLLECTIVE` of the message's bytes, in the forward's table for ``g`` and in the
backward's for ``f``; :mod:`sim.planning.costs_from_flops` prices it as a ring all-reduce over the tensor-parallel
link (:func:`sim.planning.replicas.allreduce_seconds`), not by the device's memory roofline.

Where this goes next: sequence parallelism replaces each all-reduce by a reduce-scatter and an all-gather of the same
volume around the LayerNorms and dropouts (a marker per collective kind, and those activations split by ``t``); and a
collective becomes a task of its own on the device's timeline (Note [collectives in the stage] in
:mod:`sim.planning.costs_from_flops` prices it inside its layer for now).

Note [group on the marker]: the marker carries the group size ``t``, so a counted profile knows the degree it was
split by (:attr:`~sim.planning.counts.ModelProfile.tensor_parallel`) and a cost model cannot price it at another.

References: Shoeybi et al. (2019), "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", section 3 (the f and g operators); Narayanan et al. (2021), section 2.3.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ALL_REDUCE", "all_reduce", "copy_to_tensor_parallel", "reduce_from_tensor_parallel"]


@torch.library.custom_op("gpipe_sim::all_reduce", mutates_args=())
def _all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.clone()  # a marker: the sum over the group, which one rank's count cannot (and need not) compute


@_all_reduce.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


#: The marker's operator overload, for the counter to recognise.
ALL_REDUCE = torch.ops.gpipe_sim.all_reduce.default


def all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    """The all-reduce of ``x`` over a tensor-parallel group of ``group`` ranks, as a marker (the module docstring)."""
    return torch.ops.gpipe_sim.all_reduce(x, group)


class _Copy(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduce(grad, ctx.group), None


class _Reduce(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int) -> torch.Tensor:
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tensor_parallel(x: torch.Tensor, group: int) -> torch.Tensor:
    """f: ``x`` unchanged; its gradient all-reduced over ``group`` ranks (nothing at all for one rank)."""
    return x if group == 1 else _Copy.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group: int) -> torch.Tensor:
    """g: ``x`` all-reduced over ``group`` ranks; its gradient unchanged (nothing at all for one rank)."""
    return x if group == 1 else _Reduce.apply(x, group)
