"""Expert parallelism's all-to-all as an operator the counter sees: the dispatch of the routed tokens to the ranks
that hold their experts, and the combine that brings the experts' outputs back.

One rank of an expert-parallel group of ``ep`` ranks holds ``E/ep`` of a block's ``E`` routed experts. Each token
goes to its ``k`` experts wherever they live, so an MoE block runs (GShard; Megatron-Core's all-to-all dispatcher)::

    tokens ── router, permute ── dispatch ── E/ep experts ── combine ── unpermute, weigh, sum ── tokens
    dispatch: the rows this rank routes, sent to their experts' ranks; backward: the combine of their gradients
    combine:  the experts' outputs, sent back to the tokens' ranks;   backward: the dispatch of their gradients

Note [all-to-all]: the marker ``gpipe_sim::all_to_all`` stands in for the exchange on every device, meta included,
as :mod:`sim.planning.counting.tensor_parallel`'s markers do: in one process it lays this rank's slots out as the
experts' (exact for ``ep = 1``, a stand-in of the shapes otherwise). The counter records it as a
:data:`~sim.planning.counting.counts.COLLECTIVE` of kind :data:`~sim.planning.counting.counts.ALL_TO_ALL` whose
bytes are the whole message one rank sends::

    bytes = (tokens this rank routes) x k x hidden x bytes per element

the same for the combine, and for each of their gradients in the backward: 2 all-to-alls a MoE block forward,
2 backward. The marker carries the rows routed (tokens x k), so the message is the routed tokens' and not the
capacity the slots are padded to; the imbalance shows in the experts' GEMMs, which run at the busiest rank's
token count. It carries the group size ``ep`` too (as Note [group on the marker] of the tensor-parallel markers),
so a counted profile knows the degree it was counted at
(:attr:`~sim.planning.counting.counts.ModelProfile.expert_parallel`). What part of the message crosses nodes
(all of it but the ``1/ep`` kept, or DeepSeek's node-limited share) is the planner's to price: the count is the
volume.

References: Lepikhin et al. (2020), "GShard", section 3.2 (dispatch and combine); DeepSeek-AI (2024), "DeepSeek-V3
Technical Report", section 3.2.2 (the all-to-all of DualPipe).
"""

from __future__ import annotations

from typing import Any

import torch

from sim.planning.counting.counts import ALL_TO_ALL

__all__ = ["EXPERT_MARKERS", "combine", "dispatch", "expert_parameter", "is_expert"]

_EXPERT = "gpipe_sim_expert"  # the attribute that marks a routed expert's parameter


def expert_parameter(p: torch.nn.Parameter) -> torch.nn.Parameter:
    """``p`` marked as a routed expert's, for the counter's
    :attr:`~sim.planning.counting.counts.LayerProfile.expert_parameters` (as Megatron-Core marks its experts'
    parameters ``allreduce = False``: they are reduced over the expert-data-parallel group)."""
    setattr(p, _EXPERT, True)
    return p


def is_expert(p: torch.Tensor) -> bool:
    """Whether ``p`` is a routed expert's parameter (:func:`expert_parameter`)."""
    return bool(getattr(p, _EXPERT, False))


@torch.library.custom_op("gpipe_sim::all_to_all", mutates_args=())
def _all_to_all(x: torch.Tensor, group: int, rows: int, shape: list[int]) -> torch.Tensor:
    return x.reshape(shape).clone()  # a marker: the group's exchange, as this rank's slots laid out as the experts'


@_all_to_all.register_fake
def _(x: torch.Tensor, group: int, rows: int, shape: list[int]) -> torch.Tensor:
    return x.new_empty(shape)


#: The marker's operator overload, with the collective it stands for, for the counter to recognise.
EXPERT_MARKERS = {torch.ops.gpipe_sim.all_to_all.default: ALL_TO_ALL}


def _exchange(x: torch.Tensor, group: int, rows: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.ops.gpipe_sim.all_to_all(x, group, rows, list(shape))


class _AllToAll(torch.autograd.Function):
    """An all-to-all forward and the reverse all-to-all of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int, rows: int, shape: tuple[int, ...]) -> torch.Tensor:
        ctx.group, ctx.rows, ctx.shape = group, rows, tuple(x.shape)
        return _exchange(x, group, rows, shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _exchange(grad, ctx.group, ctx.rows, ctx.shape), None, None, None


def dispatch(slots: torch.Tensor, group: int, rows: int) -> torch.Tensor:
    """The dispatch: this rank's slots ``(E, cap, C)``, ``rows`` of them filled, to its ``E/group`` experts, each
    with ``cap`` slots from each of the ``group`` ranks: ``(E/group, group·cap, C)`` (Note [all-to-all])."""
    e, cap, c = slots.shape
    return _AllToAll.apply(slots, group, rows, (e // group, group * cap, c))


def combine(outputs: torch.Tensor, group: int, rows: int) -> torch.Tensor:
    """The combine: the experts' outputs ``(E/group, group·cap, C)`` back to the ranks whose tokens they are, this
    rank's as ``(E, cap, C)`` (Note [all-to-all])."""
    local, slots, c = outputs.shape
    return _AllToAll.apply(outputs, group, rows, (local * group, slots // group, c))
