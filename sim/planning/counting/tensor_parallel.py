"""Megatron-LM's tensor-parallel collectives as operators the counter sees: markers for all-reduce, reduce-scatter and
all-gather, and the f and g around a split layer, with and without sequence parallelism.

A transformer layer split over ``t`` ranks (Shoeybi et al., 2019) runs each GEMM at its sharded shape and joins
the partial results with collectives. Counted on one rank, the shard is an ordinary model plus those collectives::

    x ── f ── column-parallel GEMMs (QKV; the MLP's first) ── row-parallel GEMM (proj; the MLP's second) ── g ── y
    f: identity forward, all-reduce of the input's gradient in the backward
    g: all-reduce forward, identity in the backward

With sequence parallelism (Korthikanti et al., 2022) the tokens outside those regions are split over the ranks too,
so the LayerNorms, dropouts and residual adds run on ``s / t`` tokens::

    f: all-gather of the tokens forward, reduce-scatter of the input's gradient backward
    g: reduce-scatter of the tokens forward, all-gather of the gradient backward

Each collective is a custom operator (``gpipe_sim::all_reduce``, ``reduce_scatter``, ``all_gather``), a marker
that stands in for the communication on every device, meta included: one rank's count cannot (and need not) compute
the other ranks' part. The counter (:mod:`sim.planning.counting.operators`) records each as a
:data:`~sim.planning.counting.counts.COLLECTIVE` of its whole message, with its kind
(:data:`~sim.planning.counting.counts.ALL_REDUCE`, ``REDUCE_SCATTER``, ``ALL_GATHER``);
:mod:`sim.planning.costs.from_flops` prices it on the tensor-parallel link, not by the device's memory roofline.

Note [group on the marker]: the marker carries the group size ``t``, so a counted profile knows the degree it was
split by (:attr:`~sim.planning.counting.counts.ModelProfile.tensor_parallel`) and a cost model cannot price it at
another.

Note [gather again in the backward]: with sequence parallelism a column-parallel GEMM's input is the gathered
``(b, s, h)`` tensor, but what it keeps for its weight gradient is this rank's ``s / t`` tokens, gathered again in
the backward (as Megatron-LM's linear layers do): so a layer keeps ``s·b·h·(34 + 5·a·s/h) / t`` bytes, the
shard's ``2·s·b·h / t`` per such GEMM rather than the gathered ``2·s·b·h``, for one all-gather more per GEMM in the
backward. Megatron-LM overlaps that all-gather with the input gradient's GEMM; it is priced inside the backward, as
every collective here (Note [collectives in the stage] in :mod:`sim.planning.costs.from_flops`), an upper bound.
A backward that takes the input's gradient alone (a split backward's ``B``) skips it, as it skips the weights.

Note [weights apart]: a split backward (``B`` the input's gradient, ``W`` the weights'; Note [split backward] in
:mod:`sim.planning.counting.flops`) counts only the autograd nodes on the input's path, and a custom ``Function``
computes every gradient its inputs require. So with sequence parallelism the GEMMs' gradients are two nodes: one that
takes the input's gradient (its weights detached), and one on the weights' path alone, fed by stand-ins of the outputs'
shapes (free to make, never read) whose gradients are the outputs' gradients; only a backward that wants the
weights runs the second, with its all-gather.

References: Shoeybi et al. (2019), "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", section 3 (the f and g operators); Narayanan et al. (2021), section 2.3; Korthikanti et al. (2022),
"Reducing Activation Recomputation in Large Transformer Models", section 4.2.2 (sequence parallelism).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from sim.planning.counting.counts import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER

__all__ = ["MARKERS", "SEQUENCE_DIM", "all_gather", "all_reduce", "column_parallel", "copy_to_tensor_parallel",
           "gather_from_sequence_parallel", "gather_tokens", "reduce_from_tensor_parallel", "reduce_scatter",
           "scatter_to_sequence_parallel"]

#: The dimension the tokens of a ``(B, T, C)`` activation run along, which sequence parallelism splits.
SEQUENCE_DIM = 1


@torch.library.custom_op("gpipe_sim::all_reduce", mutates_args=())
def _all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.clone()  # a marker: the sum over the group


@_all_reduce.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("gpipe_sim::reduce_scatter", mutates_args=())
def _reduce_scatter(x: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    return x.narrow(dim, 0, x.shape[dim] // group).clone()  # a marker: this rank's part of the sum


@_reduce_scatter.register_fake
def _(x: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] //= group
    return x.new_empty(shape)


@torch.library.custom_op("gpipe_sim::all_gather", mutates_args=())
def _all_gather(x: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    return torch.cat([x] * group, dim)  # a marker: every rank's part, side by side


@_all_gather.register_fake
def _(x: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= group
    return x.new_empty(shape)


#: The markers' operator overloads, each with the collective it stands for, for the counter to recognise.
MARKERS = {torch.ops.gpipe_sim.all_reduce.default: ALL_REDUCE,
           torch.ops.gpipe_sim.reduce_scatter.default: REDUCE_SCATTER,
           torch.ops.gpipe_sim.all_gather.default: ALL_GATHER}


def all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    """The all-reduce of ``x`` over a tensor-parallel group of ``group`` ranks, as a marker (the module docstring)."""
    return torch.ops.gpipe_sim.all_reduce(x, group)


def reduce_scatter(x: torch.Tensor, group: int) -> torch.Tensor:
    """The reduce-scatter of ``x`` along the tokens (:data:`SEQUENCE_DIM`) over ``group`` ranks, as a marker."""
    return torch.ops.gpipe_sim.reduce_scatter(x, group, SEQUENCE_DIM)


def all_gather(x: torch.Tensor, group: int) -> torch.Tensor:
    """The all-gather of ``x`` along the tokens (:data:`SEQUENCE_DIM`) over ``group`` ranks, as a marker."""
    return torch.ops.gpipe_sim.all_gather(x, group, SEQUENCE_DIM)


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


class _ReduceScatter(torch.autograd.Function):
    """g with sequence parallelism: reduce-scatter of the tokens forward, all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int) -> torch.Tensor:
        ctx.group = group
        return reduce_scatter(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_gather(grad, ctx.group), None


class _Scatter(torch.autograd.Function):
    """This rank's tokens of a tensor every rank holds whole: a view forward, all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int) -> torch.Tensor:
        ctx.group = group
        return x.narrow(SEQUENCE_DIM, 0, x.shape[SEQUENCE_DIM] // group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_gather(grad, ctx.group), None


class _Gather(torch.autograd.Function):
    """f with sequence parallelism: all-gather of the tokens forward, reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int) -> torch.Tensor:
        ctx.group = group
        return all_gather(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return reduce_scatter(grad, ctx.group), None


class _GatherSplit(torch.autograd.Function):
    """Every rank's tokens of a tensor each rank holds its part of, for a region every rank computes whole: an
    all-gather forward, this rank's part of the gradient (the same on every rank) backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int) -> torch.Tensor:
        ctx.group = group
        return all_gather(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.narrow(SEQUENCE_DIM, 0, grad.shape[SEQUENCE_DIM] // ctx.group), None


class _Linears(torch.autograd.Function):
    """``total @ w.T + b`` for each weight; the input's gradient here, each output's gradient passed on whole to a
    stand-in that takes the weights' gradients (Note [weights apart])."""

    @staticmethod
    def forward(ctx: Any, total: torch.Tensor, count: int, *args: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        weights, biases = args[:count], args[count:2 * count]
        ctx.save_for_backward(*weights)  # parameters: nothing of the activations
        return tuple(F.linear(total, w, b) for w, b in zip(weights, biases, strict=True) if w is not None)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weights = ctx.saved_tensors
        total = None
        for g, w in zip(grads, weights, strict=True):
            part = g.reshape(-1, g.shape[-1]) @ w  # (B·T, C)
            total = part if total is None else total + part
        assert total is not None
        count = len(weights)
        return (total.view(*grads[0].shape[:-1], -1), None, *([None] * 2 * count), *grads)


class _WeightGradients(torch.autograd.Function):
    """Stand-ins of the outputs' shapes whose gradients are the outputs' (Note [weights apart]): from them and this
    rank's tokens, gathered again, the weights' and biases' gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int, count: int, *params: torch.Tensor | None
                ) -> tuple[torch.Tensor, ...]:
        weights, biases = params[:count], params[count:]
        ctx.group, ctx.has_bias = group, [b is not None for b in biases]
        ctx.save_for_backward(x)  # this rank's tokens (Note [gather again in the backward])
        rows = (x.shape[0], x.shape[SEQUENCE_DIM] * group)
        return tuple(x.new_empty(*rows, w.shape[0]) for w in weights if w is not None)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        total = all_gather(x, ctx.group)
        total = total.reshape(-1, total.shape[-1])  # (B·T, C)
        flat = [g.reshape(-1, g.shape[-1]) for g in grads]  # (B·T, N) each
        grad_w = [g.t() @ total for g in flat]
        grad_b = [g.sum(0) if has else None for g, has in zip(flat, ctx.has_bias, strict=True)]
        return (None, None, None, *grad_w, *grad_b)


def copy_to_tensor_parallel(x: torch.Tensor, group: int) -> torch.Tensor:
    """f: ``x`` unchanged; its gradient all-reduced over ``group`` ranks (nothing at all for one rank)."""
    return x if group == 1 else _Copy.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group: int, sequence_parallel: bool = False) -> torch.Tensor:
    """g: ``x`` all-reduced over ``group`` ranks, its gradient unchanged; with ``sequence_parallel``, reduce-scattered
    along the tokens, its gradient all-gathered (nothing at all for one rank)."""
    if group == 1:
        return x
    return _ReduceScatter.apply(x, group) if sequence_parallel else _Reduce.apply(x, group)


def scatter_to_sequence_parallel(x: torch.Tensor, group: int) -> torch.Tensor:
    """This rank's ``1 / group`` of the tokens of ``x``, which every rank holds whole (a view); the gradient
    all-gathered (nothing at all for one rank)."""
    return x if group == 1 else _Scatter.apply(x, group)


def gather_from_sequence_parallel(x: torch.Tensor, group: int) -> torch.Tensor:
    """f with sequence parallelism on its own: every rank's tokens of ``x`` gathered, the gradient reduce-scattered
    (nothing at all for one rank)."""
    return x if group == 1 else _Gather.apply(x, group)


def gather_tokens(x: torch.Tensor, group: int) -> torch.Tensor:
    """Every rank's tokens of ``x`` gathered for a region each rank then computes whole; the gradient's part of this
    rank's tokens backward, no collective (Megatron-LM's gather without ``tensor_parallel_output_grad``; nothing at
    all for one rank)."""
    return x if group == 1 else _GatherSplit.apply(x, group)


def column_parallel(x: torch.Tensor, params: Sequence[tuple[torch.Tensor, torch.Tensor | None]], group: int,
                    sequence_parallel: bool = False) -> tuple[torch.Tensor, ...]:
    """f, then ``x @ w.T + b`` for each ``(w, b)`` of ``params`` (column-parallel GEMMs sharing one input).

    With ``sequence_parallel`` ``x`` holds this rank's tokens: f is an all-gather, and the GEMMs keep those tokens
    for their weight gradients, gathering them again in the backward (Note [gather again in the backward]).
    """
    if not sequence_parallel or group == 1:
        x = copy_to_tensor_parallel(x, group)
        return tuple(F.linear(x, w, b) for w, b in params)
    weights, biases = [w for w, _ in params], [b for _, b in params]
    stand_ins = _WeightGradients.apply(x.detach(), group, len(params), *weights, *biases)
    frozen = [None if t is None else t.detach() for t in (*weights, *biases)]
    return tuple(_Linears.apply(_Gather.apply(x, group), len(params), *frozen, *stand_ins))
