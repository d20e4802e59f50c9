"""The decoder's layers (:mod:`sim.planning.counting.models.decoder`): embedding, attention, MLP, block and head, each
in its math form or as the kernels Megatron runs, and one rank's shard of a tensor-parallel split.

Note [attention]: ``attention="math"`` writes attention out as Megatron-LM did in Korthikanti et al. (2022): QK^T,
scale, causal mask, softmax, dropout, times V; it keeps their ``s·b·h·(34 + 5·a·s/h)`` bytes per layer in 16 bits
(GPT's block, eager). ``attention="sdpa"`` calls ``F.scaled_dot_product_attention`` (the fused kernel on a GPU; on
meta the math form's FLOPs and bytes, Note [attention on meta] in :mod:`sim.planning.counting.operators`).
``attention="flash"`` is FlashAttention (Note [flash attention]).

Note [grouped attention]: the ``G = A / K`` query heads of a group share one key and value head. The math form stacks
a group's queries along the rows, (B, K, G·T, d) against (B, K, T, d) keys, so one matrix product per group serves
all its heads and the keys and values are never copied G times; a fused kernel keeps them once too. The FLOPs are
those of A full heads, 4·b·s²·C forward. ``attention="sdpa"`` passes ``enable_gqa`` where K < A.

Note [flash attention]: ``attention="flash"`` runs attention as FlashAttention (Dao et al., 2022; Dao, 2023) does,
one custom operator each way (``gpipe_sim::flash_attention`` and its backward) that the counter sees as one kernel
(:mod:`sim.planning.counting.operators`, Note [flash attention] there, for its FLOPs, bytes and rate). It takes q, k and
v in the (B, T, heads, d) layout of ``flash_attn_func`` and keeps for backward only q, k, v, its output (which is also
the output projection's input, so one copy) and each row's logsumexp in float32: the backward computes the scores and
probabilities again, so no ``s × s`` tensor is kept. Dropout on the probabilities runs inside the kernel from a seed
it returns (two int64s, kept where there is dropout), so no mask is kept either. Without RoPE, q, k and v are views of
the fused QKV projection's output, kept once. With RoPE, q and k are the rotation's outputs, and a v that is a view of
that output is copied to its own buffer first, as TransformerEngine does for a layout its kernels do not take, so the
whole projection's output is not kept for v's sake. With no ``s × s`` core there is nothing for selective recompute
to drop.

Note [fused kernels]: ``kernels="megatron"`` runs a block with the fused kernels of Megatron-LM (Narayanan et al.,
2021, section 4.2) and of Megatron-Core with TransformerEngine, each a custom operator (``gpipe_sim::``,
:mod:`sim.planning.counting.models.kernels`) that the counter sees as one kernel each way (Note [fused kernels] in
:mod:`sim.planning.counting.operators`), computing the math form on the CPU so the gradients agree:

    math attention   scale, causal mask and softmax in one (``scaled_upper_triang_masked_softmax``), keeping its output
    gelu with bias   the MLP's bias and GELU in one (``bias_gelu``), keeping GELU's input; the GEMM skips its bias
    residual adds    a branch with a bias or dropout adds its bias, drops out and adds the residual in one
                     (``bias_dropout_add``), keeping the one-byte mask; a bare residual add runs as it is
    rmsnorm          TransformerEngine's fused RMSNorm, keeping its input and each row's 1/rms in fp32
    swiglu           ``silu(gate) * up`` in one (Megatron-Core's ``bias_swiglu``), keeping gate and up
    rope             TransformerEngine's fused RoPE on q and on k, keeping nothing but the position tables

LayerNorm is ATen's, one kernel each way already, and squared ReLU is ``torch.pow(F.relu(x), 2)`` as Megatron-Core
runs it (no fused kernel there either). Megatron-Core fuses GELU only with a bias; a GELU without one runs as it is.
FLOPs are the eager form's. GELU is the exact one (Megatron's kernel uses the tanh approximation), so both settings
compute the same function; activations stay (B, T, C), so the math form copies q, k and v to contiguous heads where
Megatron's (T, B, C) layout lets the batched GEMMs read them in place.

Note [RMSNorm on meta]: ``nn.RMSNorm`` has no single ATen operator on meta; it runs as its decomposition (a square, a
mean, an add, a reciprocal square root and two products), so with ``kernels="eager"`` the counter sees six
memory-bound kernels, and what they save for backward, where the fused kernel runs one.

Note [saved activations]: a block of a spec's default (``attention="flash"``, ``kernels="megatron"``) keeps for
backward, in 16 bits on one of ``t`` tensor-parallel ranks (s tokens, b samples, h hidden, a query and K key/value
heads, F the MLP's width)::

    norms x 2            inputs 2·s·b·h each; LayerNorm's mean and 1/std in fp32     4·s·b·h + 16·s·b (LayerNorm)
                         8·s·b each, or RMSNorm's 1/rms 4·s·b each                   4·s·b·h + 8·s·b (RMSNorm)
    QKV and MLP GEMMs    their inputs, the norms' outputs                            4·s·b·h
    FlashAttention       q, k, v, its output (o's input), logsumexp in fp32          (4·s·b·h·(1 + K/a) + 4·a·s·b)/t
                         and, with dropout, the seed                                 + 16
    bias_dropout_add x 2 the one-byte mask, where a branch has a bias or dropout     2·s·b·h
    MLP                  gelu, relu2: the activation's input and the last GEMM's      4·s·b·F/t
                         input; swiglu: gate, up and down's input                     6·s·b·F/t

With sequence parallelism every term but the seed is over ``t``. GPT's, Llama's and Nemotron-4's are this form with
their options (Note [saved activations] in each preset's module).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.counting.models.decoder import DecoderConfig
from sim.planning.counting.models.decoder_parts import Branch, make_norm, normalise, rope_tables, rotate
from sim.planning.counting.models.decoder_parts import rope_tables as _rope_tables  # noqa: F401 (the tests' name)
from sim.planning.counting.models.decoder_parts import rotate as _rotate  # noqa: F401 (the tests' name)
from sim.planning.counting.models.kernels import (
    bias_gelu,
    causal_softmax,
    flash_attention,
    rope,
    swiglu,
)
from sim.planning.counting.models.mla import LatentAttention
from sim.planning.counting.models.moe_config import is_moe_block
from sim.planning.counting.models.moe_layers import MixtureOfExperts
from sim.planning.counting.tensor_parallel import (
    column_parallel,
    reduce_from_tensor_parallel,
    scatter_to_sequence_parallel,
)

__all__ = ["MLP", "Attention", "Block", "Embedding", "Head", "MultiTokenPrediction", "decoder", "decoder_blocks",
           "decoder_groups", "token_ids"]


class Embedding(nn.Module):
    """Token ids (B, T) to hidden states (B, T, C): the tokens, plus learned positions where the config has them;
    with MTP modules, the hidden states and the ids, which the blocks pass on to them (Note [multi-token
    prediction] in :mod:`sim.planning.counting.models.moe_config`)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.shard_vocab, cfg.d_model)  # this rank's rows (Note [tensor parallel])
        self.positions = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.position == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.group = cfg.tensor_parallel
        self.sequence_parallel = cfg.sequence_parallel
        self.carry = cfg.mtp_layers > 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return (self.lookup(ids), ids) if self.carry else self.lookup(ids)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The hidden states of ``ids`` (B, T): (B, T, C), or this rank's (B, T/t, C) with sequence parallelism."""
        if self.positions is None:  # (B, T, C), or (B, T/t, C): every rank's rows summed
            return self.drop(reduce_from_tensor_parallel(self.tokens(ids), self.group, self.sequence_parallel))
        pos = torch.arange(ids.shape[1], device=ids.device)
        tokens = reduce_from_tensor_parallel(self.tokens(ids), self.group)  # every rank's rows summed
        x = tokens + self.positions(pos)  # (B, T, C)
        if self.sequence_parallel:  # this rank's tokens (Note [sequence parallel])
            x = scatter_to_sequence_parallel(x, self.group)  # (B, T/t, C)
        return self.drop(x)


class Attention(Branch):
    """Causal self-attention of A query heads over K key/value heads, with RoPE where the config has it (Note
    [attention], Note [grouped attention])."""

    future: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        t = cfg.tensor_parallel
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head // t, cfg.kv_heads // t, cfg.head_dim  # this rank's
        self.widths = (self.n_head * cfg.head_dim, self.n_kv_head * cfg.head_dim, self.n_kv_head * cfg.head_dim)
        c, bias = cfg.d_model, cfg.bias
        self.fused_qkv = cfg.qkv == "fused"
        if self.fused_qkv:  # column-parallel, q, k and v side by side
            self.qkv = nn.Linear(c, sum(self.widths), bias=bias)
        else:
            self.q, self.k, self.v = (nn.Linear(c, width, bias=bias) for width in self.widths)
        self.o = nn.Linear(self.widths[0], c, bias=bias)  # row-parallel
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.attention = cfg.attention
        self.rope = cfg.position == "rope"
        # Buffers, so they are model state and follow the model's device; not saved with its weights.
        if self.rope:
            cos, sin = rope_tables(cfg)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
        future = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)  # what a token may not see
        self.register_buffer("future", future, persistent=False)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None  # Qwen3's, per head
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None

    def _project(self, x: torch.Tensor) -> list[torch.Tensor]:
        """q, k and v of ``x``, each (B, T, heads, d): every token, with sequence parallelism too."""
        sp = self.sequence_parallel
        if self.fused_qkv:
            (qkv,) = column_parallel(x, [(self.qkv.weight, self.qkv.bias)], self.group, sp)
            projections = qkv.split(self.widths, dim=2)  # views
        else:
            linears = (self.q, self.k, self.v)
            projections = tuple(column_parallel(x, [(z.weight, z.bias) for z in linears], self.group, sp))
        b, t, _ = projections[0].shape
        heads = (self.n_head, self.n_kv_head, self.n_kv_head)
        return [z.view(b, t, h, self.head_dim) for z, h in zip(projections, heads, strict=True)]

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus the attention of ``x`` (the block's normalised input; this rank's tokens with sequence
        parallelism, as ``residual``)."""
        q, k, v = self._project(x)
        b, t, _, d = q.shape
        if self.q_norm is not None and self.k_norm is not None:  # over each head's width, before RoPE
            q, k = normalise(self.q_norm, q, self.fused), normalise(self.k_norm, k, self.fused)
        if self.rope and self.fused:  # TransformerEngine's fused RoPE in its (B, T, heads, d) layout
            q, k = rope(q, self.cos[:t], self.sin[:t]), rope(k, self.cos[:t], self.sin[:t])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, d): views
        if self.rope and not self.fused:
            q, k = rotate(q, self.cos[:t], self.sin[:t]), rotate(k, self.cos[:t], self.sin[:t])
        p = self.p if self.training else 0.0
        if self.attention == "flash":  # in flash_attn_func's layout, (B, T, heads, d); Note [flash attention]
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if self.rope and self.fused_qkv:
                v = v.contiguous()  # its own buffer, not a view that keeps the whole projection's output
            y = flash_attention(q, k, v, 1.0 / math.sqrt(d), p)[0].view(b, t, self.widths[0])
            return self._end(self.o, y, residual)
        if self.attention == "math":
            y = self._math(q, k, v, p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                               enable_gqa=self.n_kv_head != self.n_head)  # (B, A, T, d)
        return self._end(self.o, y.transpose(1, 2).reshape(b, t, self.widths[0]), residual)  # o's input (B, T, C/t)

    def _math(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
        """The math form (Note [grouped attention]): q (B, A, T, d) over k and v (B, K, T, d) -> (B, A, T, d)."""
        b, a, t, d = q.shape
        kv, g = self.n_kv_head, a // self.n_kv_head
        scores = (q.reshape(b, kv, g * t, d) @ k.transpose(-2, -1)).view(b, kv, g, t, t)  # a group's rows stacked
        if self.fused:  # Note [fused kernels]
            probs = causal_softmax(scores, 1.0 / math.sqrt(d))
        else:
            probs = F.softmax((scores * (1.0 / math.sqrt(d))).masked_fill(self.future[:t, :t], float("-inf")), dim=-1)
        probs = self.attn_drop(probs).view(b, kv, g * t, t)
        return (probs @ v).view(b, a, t, d)  # head h is group h // G


class MLP(Branch):
    """C -> F/t -> C on one rank (Note [tensor parallel]): GELU or squared ReLU between two matrices, or SwiGLU's
    ``down(silu(gate(x)) * up(x))``; then the residual branch's end."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        width, c, bias = cfg.d_ff // self.group, cfg.d_model, cfg.bias
        self.kind = cfg.mlp
        if cfg.mlp == "swiglu":
            self.gate = nn.Linear(c, width, bias=bias)  # column-parallel
            self.up = nn.Linear(c, width, bias=bias)
            self.down = nn.Linear(width, c, bias=bias)  # row-parallel
        else:
            self.fc = nn.Linear(c, width, bias=bias)  # column-parallel
            self.proj = nn.Linear(width, c, bias=bias)  # row-parallel

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus the MLP of ``x`` (the block's normalised input; this rank's tokens with sequence
        parallelism, as ``residual``)."""
        sp = self.sequence_parallel
        if self.kind == "swiglu":
            pairs = [(self.gate.weight, self.gate.bias), (self.up.weight, self.up.bias)]
            gate, up = column_parallel(x, pairs, self.group, sp)
            return self._end(self.down, swiglu(gate, up) if self.fused else F.silu(gate) * up, residual)  # F/t wide
        fuse_gelu = self.fused and self.kind == "gelu" and self.fc.bias is not None  # Note [fused kernels]
        (h,) = column_parallel(x, [(self.fc.weight, None if fuse_gelu else self.fc.bias)], self.group, sp)
        if fuse_gelu:
            h = bias_gelu(h, self.fc.bias)
        elif self.kind == "gelu":
            h = F.gelu(h)
        else:
            h = torch.pow(F.relu(h), 2)  # Megatron-Core's squared_relu
        return self._end(self.proj, h, residual)  # h: (B, T, F/t)


class Block(nn.Module):
    """One pre-norm decoder block: attention (or MLA) and MLP (or, where ``moe``, a mixture of experts), each inside
    a residual connection. A tuple's first tensor is the hidden states, the rest passed on (Note [multi-token
    prediction] in :mod:`sim.planning.counting.models.moe_config`)."""

    def __init__(self, cfg: DecoderConfig, moe: bool = False) -> None:
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = LatentAttention(cfg) if cfg.attention_kind == "mla" else Attention(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp = MixtureOfExperts(cfg) if moe else MLP(cfg)
        self.fused = cfg.kernels == "megatron"

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return (self.step(x[0]), *x[1:]) if isinstance(x, tuple) else self.step(x)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """The block on hidden states ``x`` alone."""
        x = self.attn(normalise(self.norm1, x, self.fused), x)
        return self.mlp(normalise(self.norm2, x, self.fused), x)


class MultiTokenPrediction(nn.Module):
    """DeepSeek-V3's MTP module of depth ``depth`` (Note [multi-token prediction] in
    :mod:`sim.planning.counting.models.moe_config`): from ``(h, ids, n_1 .. n_{d-1}, h_{d-1})`` (the main hidden
    states, the ids, the earlier modules' normalised outputs and the last one's hidden states; ``h`` itself for the
    first), the embedding of the tokens ``depth`` ahead and the two RMSNormed, concatenated, projected 2C -> C, one
    block; its output normalised for the shared head. The last module passes on ``(h, n_1 .. n_D)``, the head's
    input. The ids of the last ``depth`` positions wrap around (their loss is masked in training)."""

    def __init__(self, cfg: DecoderConfig, embedding: Embedding, depth: int, last: bool) -> None:
        super().__init__()
        self.embedding = embedding  # shared: counted at the embedding
        self.depth, self.last = depth, last
        self.hidden_norm, self.token_norm, self.norm = make_norm(cfg), make_norm(cfg), make_norm(cfg)
        self.project = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)  # whole on every rank
        self.block = Block(cfg, is_moe_block(cfg, cfg.n_layer - 1))
        self.fused = cfg.kernels == "megatron"

    def forward(self, x: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        main, ids, *outputs = x
        before = outputs.pop() if outputs else main
        ahead = torch.cat((ids[:, self.depth:], ids[:, :self.depth]), dim=1)  # the tokens depth ahead
        joined = torch.cat((normalise(self.hidden_norm, before, self.fused),
                            normalise(self.token_norm, self.embedding.lookup(ahead), self.fused)), dim=-1)
        h = self.block.step(F.linear(joined, self.project.weight))  # (B, T or T/t, C)
        normed = normalise(self.norm, h, self.fused)
        return (main, *outputs, normed) if self.last else (main, ids, *outputs, normed, h)


class Head(nn.Module):
    """Final norm and the projection to vocabulary logits: (B, T, C) -> (B, T, V)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.out = nn.Linear(cfg.d_model, cfg.shard_vocab, bias=False)  # this rank's logits: (B, T, V/t)
        self.group = cfg.tensor_parallel
        self.sequence_parallel = cfg.sequence_parallel
        self.fused = cfg.kernels == "megatron"

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The logits of ``x``; of a tuple, the main hidden states' and each MTP module's (already normalised)."""
        main, *extra = x if isinstance(x, tuple) else (x,)
        logits = [self._logits(normalise(self.norm, main, self.fused)), *map(self._logits, extra)]
        return logits[0] if len(logits) == 1 else tuple(logits)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel(x, [(self.out.weight, None)], self.group, self.sequence_parallel)[0]


def decoder(cfg: DecoderConfig, **overrides: object) -> nn.Sequential:
    """The decoder of ``cfg`` as ``nn.Sequential(embedding, block0 .. block{L-1}, head)``, one layer per child as the
    planner counts it. Build it under ``with torch.device("meta"):`` to count a large size without allocating.

    Args:
        cfg: the config.
        overrides: fields of the config to replace (``seq_len=512``, ``attention="sdpa"``).

    Raises:
        ValueError: an invalid config.
    """
    if overrides:
        cfg = replace(cfg, **overrides)  # type: ignore[arg-type]
    embedding, head = Embedding(cfg), Head(cfg)
    if cfg.tied:  # Note [tied embeddings]
        head.out.weight = embedding.tokens.weight
    layers: OrderedDict[str, nn.Module] = OrderedDict(embedding=embedding)
    layers.update((f"block{i}", Block(cfg, is_moe_block(cfg, i))) for i in range(cfg.n_layer))
    depths = range(1, cfg.mtp_layers + 1)
    layers.update((f"mtp{d}", MultiTokenPrediction(cfg, embedding, d, d == cfg.mtp_layers)) for d in depths)
    layers["head"] = head
    return nn.Sequential(layers)


def decoder_blocks(n_layer: int) -> range:
    """The indices :func:`decoder` puts its ``n_layer`` blocks at: the layers a count may treat as identical
    (:func:`sim.planning.counting.flops.count_layers`, Note [identical layers] in
    :mod:`sim.planning.counting.reuse`) in a dense decoder."""
    return range(1, n_layer + 1)


def decoder_groups(cfg: DecoderConfig) -> tuple[range, ...]:
    """The groups of identical blocks :func:`decoder` builds for ``cfg``: the dense ones, then the MoE ones
    (Note [identical layers] in :mod:`sim.planning.counting.reuse`)."""
    dense = cfg.dense_layers if cfg.experts else cfg.n_layer
    return tuple(group for group in (range(1, dense + 1), range(dense + 1, cfg.n_layer + 1)) if group)


def token_ids(batch: int, seq_len: int, vocab_size: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (shapes only on meta, random on a real device)."""
    if str(device) == "meta":
        return torch.empty(batch, seq_len, dtype=torch.long, device="meta")
    return torch.randint(vocab_size, (batch, seq_len), device=device)
