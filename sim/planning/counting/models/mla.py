"""DeepSeek's multi-head latent attention (MLA) as a decoder's attention (``attention_kind="mla"`` of
:class:`~sim.planning.counting.models.decoder.DecoderConfig`).

Note [multi-head latent attention]: MLA (DeepSeek-V2, section 2.1) compresses the keys and values of every head into
one latent vector per token, and the queries into another, with RoPE on a few decoupled dimensions apart. For A
heads, hidden C, query rank r_q, key/value rank r_kv, RoPE width d_r, the other query/key width d_n and value width
d_v (DeepSeek-V3: 128 heads, 7168, 1536, 512, 64, 128, 128)::

    q    C -> r_q (down), RMSNorm, r_q -> A·(d_n + d_r) (up)           q_i = [q_i^n ; RoPE(q_i^r)]
    kv   C -> r_kv + d_r (down: the latent and ONE RoPE key shared by every head), RMSNorm on the latent,
         r_kv -> A·(d_n + d_v) (up)                                     k_i = [k_i^n ; RoPE(k^r)], v_i
    o    A·d_v -> C

Attention then runs over heads of query/key width d_n + d_r (192) and value width d_v (128), scaled by
``1/sqrt(d_n + d_r)``; FlashAttention's FLOPs count the two widths apart (Note [flash attention] in
:mod:`sim.planning.counting.operators`). With ``q_lora_rank=None`` q is one projection ``C -> A·(d_n + d_r)``.

A tensor-parallel shard (Megatron-Core's MLA) keeps the down-projections and their norms whole on every rank and
splits the up-projections by heads (column-parallel) and o by rows; the f before the down-projections all-reduces
their input's gradient. The whole down-projections' weight gradients are partial on each rank, and their all-reduce
(about ``C·(r_q + r_kv + d_r)`` elements a block, 0.3% of DeepSeek-V3's) is left out of the count.
``attention="flash"`` runs FlashAttention; ``"math"`` and ``"sdpa"`` run ``F.scaled_dot_product_attention``
(its math form on meta, Note [attention on meta] in :mod:`sim.planning.counting.operators`).

References: DeepSeek-AI (2024), "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
Model" (arXiv 2405.04434), section 2.1; "DeepSeek-V3 Technical Report" (arXiv 2412.19437), section 2.1.1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.counting.models.decoder import DecoderConfig
from sim.planning.counting.models.decoder_parts import Branch, make_norm, normalise, rope_tables, rotate
from sim.planning.counting.models.kernels import flash_attention, rope
from sim.planning.counting.modules import recompute_module
from sim.planning.counting.tensor_parallel import column_parallel

__all__ = ["LatentAttention"]


class LatentAttention(Branch):
    """Causal multi-head latent attention over this rank's heads (Note [multi-head latent attention])."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        c, heads = cfg.d_model, cfg.n_head // cfg.tensor_parallel  # this rank's heads
        self.heads, self.nope, self.rope_dim, self.v_dim = heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, \
            cfg.v_head_dim
        self.latent = cfg.kv_lora_rank
        qk = self.nope + self.rope_dim
        if cfg.q_lora_rank is None:
            self.q_down, self.q_norm = None, None
            self.q_up = nn.Linear(c, heads * qk, bias=False)  # column-parallel, from the hidden state
        else:
            self.q_down = nn.Linear(c, cfg.q_lora_rank, bias=False)  # whole on every rank
            self.q_norm = make_norm(cfg, cfg.q_lora_rank)
            self.q_up = nn.Linear(cfg.q_lora_rank, heads * qk, bias=False)  # column-parallel
        self.kv_down = nn.Linear(c, self.latent + self.rope_dim, bias=False)  # whole: the latent and the RoPE key
        self.kv_norm = make_norm(cfg, self.latent)
        self.kv_up = nn.Linear(self.latent, heads * (self.nope + self.v_dim), bias=False)  # column-parallel
        self.o = nn.Linear(heads * self.v_dim, c, bias=False)  # row-parallel
        self.scale = 1.0 / math.sqrt(qk)
        self.flash = cfg.attention == "flash"
        cos, sin = rope_tables(cfg, self.rope_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _turn(self, x: torch.Tensor) -> torch.Tensor:
        """RoPE on ``x`` (B, T, heads, d_r): TransformerEngine's fused kernel, or the eager rotation."""
        t = x.shape[1]
        if self.fused:
            return rope(x, self.cos[:t], self.sin[:t])
        return rotate(x.transpose(1, 2), self.cos[:t], self.sin[:t]).transpose(1, 2)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus the attention of ``x`` (the block's normalised input; this rank's tokens with sequence
        parallelism, as ``residual``)."""
        first = self.q_up if self.q_down is None else self.q_down
        q, kv = column_parallel(x, [(first.weight, None), (self.kv_down.weight, None)], self.group,
                                self.sequence_parallel)  # every token: (B, T, r_q or A·(d_n + d_r)), (B, T, r_kv + d_r)
        b, t = q.shape[:2]
        with recompute_module("mla_up_proj"):  # the latents' norms, the up-projections and RoPE: Note [recompute
            if self.q_norm is not None:  # modules]; the query's latent, normalised and projected up
                q = F.linear(normalise(self.q_norm, q, self.fused), self.q_up.weight)
            latent, k_rope = kv.split((self.latent, self.rope_dim), dim=-1)
            kv = F.linear(normalise(self.kv_norm, latent, self.fused), self.kv_up.weight)
            k_nope, v = kv.view(b, t, self.heads, self.nope + self.v_dim).split((self.nope, self.v_dim), dim=-1)
            q_nope, q_rope = q.view(b, t, self.heads, self.nope + self.rope_dim).split((self.nope, self.rope_dim), -1)
            k_rope = self._turn(k_rope.reshape(b, t, 1, self.rope_dim)).expand(b, t, self.heads, self.rope_dim)
            q = torch.cat((q_nope, self._turn(q_rope)), dim=-1)  # (B, T, A/t, d_n + d_r)
            k = torch.cat((k_nope, k_rope), dim=-1)
            v = v.contiguous() if self.flash else v
        p = self.p if self.training else 0.0
        if self.flash:  # Note [flash attention] in decoder_layers
            y = flash_attention(q, k, v, self.scale, p)[0]
        else:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=p,
                                               is_causal=True, scale=self.scale).transpose(1, 2)
        return self._end(self.o, y.reshape(b, t, self.heads * self.v_dim), residual)  # o's input (B, T, A·d_v/t)
