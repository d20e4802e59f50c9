"""A mixture-of-experts block's MLP (Note [mixture of experts] in :mod:`sim.planning.counting.models.moe_config`):
router, permutation, dispatch, grouped experts, combine and shared experts, on one rank of the expert-parallel group.

Note [routed tokens]: the layer runs the routed experts as a fixed number of slots per expert, the shape a count
needs and the one a GPU's grouped GEMM runs at::

    n     the tokens this rank routes: b·s, or b·s/t on one of t tensor-parallel ranks (each routes its own part,
          Megatron-Core's rule: with sequence parallelism the part it holds, without it a part taken here and the
          output gathered back)
    cap   ceil(n·k·imbalance / E) slots per expert for this rank's tokens
    N     ep·cap tokens for each of this rank's E/ep experts after the dispatch; etp·ep·cap with expert tensor
          parallelism, whose all-gather brings the other etp ranks' tokens

so the busiest rank's experts run ``imbalance`` times the balanced share (1.0: perfectly balanced routing). The
permutation sorts the n·k (token, expert) pairs by expert and puts each in its expert's next slot; a pair past its
expert's capacity is dropped (its output zero), so on a real device the layer is GShard's MoE with capacity factor
``imbalance`` (exact where no expert overflows), and on meta every shape is the dropless MoE's at the busiest
rank's count. The gates are the chosen scores normalised over the k (softmax or sigmoid scores: Mixtral's, Qwen3's,
DeepSeek-V3's rule; DeepSeek-V2 scales them by a constant instead, the same work). DeepSeek-V3's bias on the
sigmoid scores, which only chooses the experts and is set by its load-balancing rule, not by gradients, is a
buffer. Node-limited routing (``node_limit``) restricts which experts a token may take, not how many: it changes
where the all-to-all's bytes go, which the planner prices, and nothing counted here.

Note [unpermutation]: the k outputs of each token are gathered back into token order, multiplied by their gates and
summed over the k, which keeps for the backward what Megatron-Core's unpermutation keeps (the gathered outputs and
the gates, for the gates' gradient; its ``scatter_add`` keeps only indices). An ``index_add`` of the weighted rows
in expert order would compute the same sum but keep the weighted rows as well (its backward saves its source), one
more ``n·k x C`` tensor a block that no trainer keeps.

What is counted per MoE block: the router's GEMM C -> E, its scores and top-k (memory-bound), the sort and the
permutation (a gather of n·k rows, a scatter into the slots), the dispatch and combine all-to-alls (Note
[all-to-all] in :mod:`sim.planning.counting.expert_parallel`), the experts' three grouped GEMMs at N tokens each
(Note [grouped GEMM] in :mod:`sim.planning.counting.operators`) and SwiGLU, the unpermutation (a gather and the
weighted sum of each token's k outputs), and the shared experts as one dense SwiGLU MLP split like a dense one.

References: Lepikhin et al. (2020), "GShard" (capacity and dispatch); Fedus et al. (2021), "Switch Transformers"
(capacity factor); Jiang et al. (2024), "Mixtral of Experts"; DeepSeek-AI (2024), "DeepSeek-V3 Technical Report",
section 2.1.2 (sigmoid gates, the bias); Megatron-Core's ``moe`` package (grouped GEMM, the all-to-all dispatcher).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.counting.expert_parallel import combine, dispatch, expert_parameter
from sim.planning.counting.models.decoder import DecoderConfig
from sim.planning.counting.models.kernels import swiglu
from sim.planning.counting.modules import recompute_module
from sim.planning.counting.tensor_parallel import (
    column_parallel,
    gather_from_sequence_parallel,
    gather_tokens,
    reduce_from_tensor_parallel,
    scatter_to_sequence_parallel,
)

__all__ = ["MixtureOfExperts", "grouped_mm"]


@torch.library.custom_op("gpipe_sim::grouped_mm", mutates_args=())
def grouped_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """G independent products ``a[g] @ b[g]`` of ``a`` (G, M, K) and ``b`` (G, K, N), one kernel (Note [grouped
    GEMM] in :mod:`sim.planning.counting.operators`)."""
    return torch.bmm(a, b)


@grouped_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], a.shape[1], b.shape[2])


def _grouped_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)  # the experts' input and the weights (parameters)


def _grouped_grad(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    a, b = ctx.saved_tensors
    grad_a = grouped_mm(grad, b.transpose(1, 2)) if ctx.needs_input_grad[0] else None
    grad_b = grouped_mm(a.transpose(1, 2), grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


grouped_mm.register_autograd(_grouped_grad, setup_context=_grouped_context)


def _experts(local: int, rows: int, columns: int) -> nn.Parameter:
    """``local`` experts' weights of ``rows x columns``, initialised as ``nn.Linear``'s, marked as experts'."""
    weight = nn.Parameter(torch.empty(local, rows, columns))
    bound = 1.0 / math.sqrt(rows)
    nn.init.uniform_(weight, -bound, bound)
    return expert_parameter(weight)


class _SharedExperts(nn.Module):
    """The shared experts as one dense SwiGLU MLP of width ``shared_experts x expert_ffn``, split over the
    tensor-parallel ranks as a dense one: gate and up column-parallel, down row-parallel."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        c, width = cfg.d_model, cfg.shared_experts * cfg.expert_width // cfg.tensor_parallel
        self.gate, self.up = nn.Linear(c, width, bias=False), nn.Linear(c, width, bias=False)
        self.down = nn.Linear(width, c, bias=False)
        self.group, self.sequence_parallel, self.fused = cfg.tensor_parallel, cfg.sequence_parallel, \
            cfg.kernels == "megatron"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sp = self.sequence_parallel
        gate, up = column_parallel(x, [(self.gate.weight, None), (self.up.weight, None)], self.group, sp)
        hidden = swiglu(gate, up) if self.fused else F.silu(gate) * up
        return reduce_from_tensor_parallel(F.linear(hidden, self.down.weight), self.group, sp)


class MixtureOfExperts(nn.Module):
    """``residual`` plus the MoE of the block's normalised input, on one rank (Note [routed tokens])."""

    score_bias: torch.Tensor

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        c, e = cfg.d_model, cfg.experts
        self.experts, self.k, self.imbalance = e, cfg.experts_per_token, cfg.expert_imbalance
        self.ep, self.etp, self.group = cfg.expert_parallel, cfg.expert_tensor_parallel, cfg.tensor_parallel
        self.sequence_parallel, self.fused, self.sigmoid = cfg.sequence_parallel, cfg.kernels == "megatron", \
            cfg.router == "sigmoid"
        self.router = nn.Linear(c, e, bias=False)  # whole on every rank
        self.register_buffer("score_bias", torch.zeros(e), persistent=False)  # DeepSeek-V3's, for the choice only
        local, width = e // self.ep, cfg.expert_width // self.etp
        self.gate, self.up, self.down = _experts(local, c, width), _experts(local, c, width), \
            _experts(local, width, c)
        self.shared = _SharedExperts(cfg) if cfg.shared_experts else None
        self.drop = nn.Dropout(cfg.dropout)

    def _route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's k experts (n, k) and their gates (n, k), normalised over the k."""
        logits = F.linear(flat, self.router.weight)  # (n, E)
        scores = torch.sigmoid(logits) if self.sigmoid else F.softmax(logits, dim=-1)
        choice = scores + self.score_bias if self.sigmoid else scores
        chosen = torch.topk(choice, self.k, dim=-1)[1]  # (n, k)
        gates = scores.gather(1, chosen)
        return chosen, gates / gates.sum(dim=-1, keepdim=True)

    def _slots(self, chosen: torch.Tensor, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (token, expert) pairs in expert order, and each one's slot among the E·cap (E·cap: dropped)."""
        expert = chosen.reshape(-1)  # (n·k,): pair j is token j // k
        order = torch.argsort(expert, stable=True)
        ranked = expert[order]
        first = torch.searchsorted(ranked, torch.arange(self.experts, device=expert.device))  # (E,)
        position = torch.arange(expert.numel(), device=expert.device) - first[ranked]
        dropped = torch.full_like(ranked, self.experts * cap)
        return order, torch.where(position < cap, ranked * cap + position, dropped)

    def _routed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted outputs for ``tokens`` (B, T', C), the tokens this rank routes."""
        b, s, c = tokens.shape
        flat = tokens.reshape(b * s, c)
        n = b * s
        chosen, gates = self._route(flat)
        cap = math.ceil(n * self.k * self.imbalance / self.experts)
        order, slot = self._slots(chosen, cap)
        token = torch.div(order, self.k, rounding_mode="floor")  # the token of each pair, in expert order
        rows = flat.index_select(0, token)  # the permutation: (n·k, C) in expert order
        slots = flat.new_zeros(self.experts * cap + 1, c).index_put((slot,), rows)[:-1]  # the last row: dropped
        received = dispatch(slots.view(self.experts, cap, c), self.ep, n * self.k)  # (E/ep, ep·cap, C)
        received = gather_from_sequence_parallel(received, self.etp)  # (E/ep, N, C): every etp rank's tokens
        gate, up = grouped_mm(received, self.gate), grouped_mm(received, self.up)  # (E/ep, N, F_e/etp)
        with recompute_module("moe_act"):  # Note [recompute modules]
            hidden = swiglu(gate, up) if self.fused else F.silu(gate) * up
        out = reduce_from_tensor_parallel(grouped_mm(hidden, self.down), self.etp, True)  # (E/ep, ep·cap, C)
        back = combine(out, self.ep, n * self.k).reshape(self.experts * cap, c)  # this rank's slots
        back = torch.cat((back, back.new_zeros(1, c)))  # a dropped pair's output: zero
        # the unpermutation (Note [unpermutation]): each token's k outputs gathered in token order, weighted, summed
        mine = torch.empty_like(slot).scatter(0, order, slot)  # pair j's slot, pair j being token j // k's
        outputs = back.index_select(0, mine).view(n, self.k, c)
        return (outputs * gates.unsqueeze(2)).sum(dim=1).view(b, s, c)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus the experts' output for ``x`` (this rank's tokens with sequence parallelism, as
        ``residual``)."""
        t, sp = self.group, self.sequence_parallel
        mine = x if sp else scatter_to_sequence_parallel(x, t)  # the tokens this rank routes (Note [routed tokens])
        routed = self._routed(mine)
        out = routed if sp else gather_tokens(routed, t)
        if self.shared is not None:
            out = out + self.shared(x)
        return residual + self.drop(out)
