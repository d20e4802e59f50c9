"""A Llama-style decoder stack as an ``nn.Sequential``, with the Llama 3 model sizes.

Layers (pre-RMSNorm, no biases anywhere)::

    Embedding     token ids (B, T) -> (B, T, C); no position embedding (RoPE rotates q and k instead)
    Block x L     x + Attention(RMSNorm(x)), then x + MLP(RMSNorm(x))
                  Attention: grouped-query, A query heads share K key/value heads, RoPE on q and k
                  MLP (SwiGLU): down(silu(gate(x)) * up(x)); gate and up are C -> F, down is F -> C
    Head          RMSNorm, then a linear layer to the vocabulary: (B, T, C) -> (B, T, V); untied

Note [grouped attention]: the ``G = A / K`` query heads of a group share one key and value head. The math form
stacks a group's queries along the rows, (B, K, G·T, d) against (B, K, T, d) keys, so one matrix product per
group serves all its heads and the keys and values are never copied G times; a fused kernel keeps them once
too. The FLOPs are those of A full heads, 4·b·s²·C forward, as in :mod:`~sim.planning.models.gpt`.
``attention="sdpa"`` calls ``F.scaled_dot_product_attention(..., enable_gqa=True)``. ``attention="flash"`` (a spec's
default) runs :mod:`~sim.planning.models.gpt`'s FlashAttention operator (Note [flash attention] there) on the rotated
q (A heads) and k and on v (K heads each), without dropout: it reads and keeps the keys and values once, and keeps q,
its output and the logsumexp but no ``s × s`` probabilities (the math form's ``2·a·s²·b`` bytes less the logsumexp's
``4·a·s·b``).

Note [RMSNorm on meta]: ``nn.RMSNorm`` has no single ATen operator on meta; it runs as its decomposition (a
square, a mean, an add, a reciprocal square root and two products), so with ``kernels="eager"`` the counter sees six
memory-bound kernels, and what they save for backward, where the fused kernels run one (Note [fused kernels]).

Note [fused kernels]: ``kernels="megatron"`` (a spec's default; the config's is ``"eager"``) runs a block as
Megatron-Core does with TransformerEngine: each RMSNorm as one kernel each way (TE's fused RMSNorm, keeping its input
and each row's 1/rms in fp32), SwiGLU's ``silu(gate) * up`` as one (Megatron-Core's ``bias_swiglu``, keeping gate and
up), and RoPE on q and on k as one each (TE's fused RoPE, which keeps nothing but the position tables); the residual
adds run as they are. Each is a custom operator (``gpipe_sim::rms_norm``, ``swiglu``, ``rope`` and their backwards)
that computes the math form on the CPU, so the gradients agree; its bytes and kind: Note [fused kernels] in
:mod:`sim.planning.operators`. With FlashAttention a block keeps, in 16 bits on one of ``t`` ranks (s tokens, b
samples, h hidden, a query and K key/value heads, F the MLP's width)::

    RMSNorm x 2        input 2·s·b·h each, 1/rms in fp32 4·s·b each                  4·s·b·h + 8·s·b
    q/k/v, gate/up     their inputs, the RMSNorms' outputs                            4·s·b·h
    FlashAttention     rotated q, its output (o's input); rotated k and v; lse       4·s·b·h/t + 4·s·b·h·K/(a·t)
                                                                                      + 4·a·s·b/t
    SwiGLU, down       gate and up; down's input                                      6·s·b·F/t

that is ``s·b·h·(8 + (4 + 4·K/a)/t) + 6·s·b·F/t + 4·a·s·b/t + 8·s·b`` bytes; with sequence parallelism all of it over
``t``. Per s·b·h at t = 1 that is 12 + 4·K/a + 6·F/h, about 34 at every Llama 3 size (31.8 for 405B, 33.5 for 70B);
the eager block keeps 50.3 for 405B with FlashAttention. At t = 8 a llama:405b block keeps 10.97·s·b·h bytes, where
``kernels=eager,attention=math`` keeps 39.8 (3.97 and 22.3 with sequence parallelism).

Note [tensor parallel]: ``tensor_parallel=t`` builds one rank's shard, split as Megatron-LM splits a layer: A/t
query heads and K/t key/value heads (q: C -> C/t; k and v: C -> K·d/t; o: C/t -> C), SwiGLU's gate and up by columns
(C -> F/t) and down by rows (F/t -> C), the vocabulary of the embedding and the head (ceil(V/t) rows each).
``t`` must divide the KV heads, as Megatron-LM requires of its query groups, so every rank keeps whole groups and
no KV head is replicated (Llama 3's 8 KV heads allow up to t = 8, a node). RMSNorms are replicated. The
collectives are :mod:`sim.planning.tensor_parallel`'s markers, as in :mod:`sim.planning.models.gpt`: g after o and
after down, f before q/k/v and before gate/up, g after the embedding, f before the head. ``sequence_parallel=True``
splits the tokens between those regions over the ranks too, as in :mod:`sim.planning.models.gpt` (Note [sequence
parallel] there): the RMSNorms run on ``s/t`` tokens, and the embedding, without positions to add, reduce-scatters
its lookups.

References: Dubey et al. (2024), "The Llama 3 Herd of Models", Table 3 (sizes) and section 3.1.1 (the
architecture); Touvron et al. (2023), "LLaMA: Open and Efficient Foundation Language Models" (pre-norm RMSNorm,
SwiGLU, RoPE); Ainslie et al. (2023), "GQA"; Su et al. (2021), "RoFormer" (rotary position embeddings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.models.gpt import ATTENTIONS, check_sequence_parallel, decoder, token_ids
from sim.planning.models.kernels import flash_attention, rms_norm, rope, swiglu
from sim.planning.models.limits import check_decoder_size
from sim.planning.tensor_parallel import column_parallel, reduce_from_tensor_parallel

__all__ = ["CONFIGS", "LlamaConfig", "llama", "llama_config", "llama_sample"]


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-style decoder (the defaults are Llama 3 8B's).

    Attributes:
        n_layer: decoder blocks (L).
        n_head: query heads (A); ``d_model`` must divide by it, into heads of an even width (RoPE rotates pairs).
        n_kv_head: key/value heads (K); ``n_head`` must divide by it (see Note [grouped attention]).
        d_model: hidden size (C).
        ffn: the SwiGLU MLP's inner width (F).
        seq_len: context length in tokens; 8192, Llama 3's pre-training length.
        vocab_size: 128256, the released tokenizer's (128000 tokens, as Table 3 rounds it, and 256 special ones).
        rope_theta: RoPE's base frequency; 500000 in Llama 3.
        norm_eps: RMSNorm's epsilon; 1e-5 as in the released models.
        attention: ``"math"``, ``"sdpa"`` or ``"flash"`` (see Note [grouped attention]).
        kernels: ``"eager"``, every operator its own kernel, or ``"megatron"``, the fused kernels of Megatron-Core and
            TransformerEngine (Note [fused kernels]).
        tensor_parallel: ranks a layer is split over; the model built is one rank's shard (Note [tensor parallel]).
        sequence_parallel: split the tokens between the tensor-parallel regions over the ranks too (Note [tensor
            parallel]); needs ``tensor_parallel > 1``.
    """

    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 8
    d_model: int = 4096
    ffn: int = 14336
    seq_len: int = 8192
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    attention: Literal["math", "sdpa", "flash"] = "math"
    kernels: Literal["eager", "megatron"] = "eager"
    tensor_parallel: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_kv_head", "d_model", "ffn", "seq_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} does not divide into n_head={self.n_head} heads")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"heads of d_model/n_head={self.d_model // self.n_head} are odd; RoPE needs an even width")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} does not divide into n_kv_head={self.n_kv_head} groups")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be 'math', 'sdpa' or 'flash', got {self.attention!r}")
        if self.kernels not in ("eager", "megatron"):
            raise ValueError(f"kernels must be 'eager' or 'megatron', got {self.kernels!r}")
        t = self.tensor_parallel
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"tensor_parallel must be an integer >= 1, got {t!r}")
        if self.n_kv_head % t:
            raise ValueError(f"tensor parallel {t} does not divide the {self.n_kv_head} key/value heads "
                             f"(each rank keeps whole groups of query heads)")
        if self.ffn % t:
            raise ValueError(f"tensor parallel {t} does not divide the MLP's width {self.ffn}")
        check_sequence_parallel(self.sequence_parallel, t, self.seq_len)
        check_decoder_size(self.n_layer, self.d_model, self.ffn, self.seq_len, self.vocab_size, self.n_head,
                           self.parameters)

    @property
    def shard_vocab(self) -> int:
        """Rows of the embedding and of the head on one rank: ``ceil(V / t)`` (Note [tensor parallel])."""
        return -(-self.vocab_size // self.tensor_parallel)

    @property
    def shard_parameters(self) -> int:
        """Parameters of one rank's shard: each block's matrices over ``t``, its RMSNorms whole, and the
        vocabulary of the embedding and head over ``t`` (Note [tensor parallel])."""
        c, kv, t = self.d_model, self.n_kv_head * self.head_dim, self.tensor_parallel
        block = (2 * c * c + 2 * c * kv + 3 * c * self.ffn) // t + 2 * c
        return 2 * self.shard_vocab * c + self.n_layer * block + c

    @property
    def head_dim(self) -> int:
        """Width of one head (d = C / A)."""
        return self.d_model // self.n_head

    @property
    def block_parameters(self) -> int:
        """Parameters of one block: q and o (C² each), k and v (C·K·d each), the MLP (3·C·F), two RMSNorm gains."""
        c, kv = self.d_model, self.n_kv_head * self.head_dim
        return 2 * c * c + 2 * c * kv + 3 * c * self.ffn + 2 * c

    @property
    def parameters(self) -> int:
        """All parameters: embedding, blocks, final RMSNorm and the untied head."""
        c, v = self.d_model, self.vocab_size
        return v * c + self.n_layer * self.block_parameters + c + v * c


#: Llama 3's three sizes (Dubey et al., 2024, Table 3), at their 8192-token pre-training context.
CONFIGS: dict[str, LlamaConfig] = {
    "8b": LlamaConfig(n_layer=32, n_head=32, n_kv_head=8, d_model=4096, ffn=14336),
    "70b": LlamaConfig(n_layer=80, n_head=64, n_kv_head=8, d_model=8192, ffn=28672),
    "405b": LlamaConfig(n_layer=126, n_head=128, n_kv_head=8, d_model=16384, ffn=53248),
}


def llama_config(name: str) -> LlamaConfig:
    """The named Llama 3 size (``"8b"``, ``"70B"``, ``"405b"``).

    Raises:
        KeyError: an unknown name; the message lists the known ones.
    """
    key = name.strip().lower()
    if key not in CONFIGS:
        raise KeyError(f"unknown Llama size {name!r}; known: {', '.join(CONFIGS)}")
    return CONFIGS[key]


class Embedding(nn.Module):
    """Token ids (B, T) to hidden states (B, T, C)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.shard_vocab, cfg.d_model)  # this rank's rows (Note [tensor parallel])
        self.group = cfg.tensor_parallel
        self.sequence_parallel = cfg.sequence_parallel

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # (B, T, C), or (B, T/t, C) with sequence parallelism: every rank's rows summed
        return reduce_from_tensor_parallel(self.tokens(ids), self.group, self.sequence_parallel)


def _rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, (T, d): pair i turns at ``rope_theta ** (-2i/d)`` per position."""
    d = cfg.head_dim
    inv_freq = cfg.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)  # (d/2,)
    angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), inv_freq)  # (T, d/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, d): the two halves of a head rotate as pairs
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, heads, T, d): element i of the first half and element i of the second turn as one pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary position embeddings (see Note [grouped attention])."""

    future: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.group = t = cfg.tensor_parallel
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head // t, cfg.n_kv_head // t, cfg.head_dim  # this rank's
        width, kv = self.n_head * cfg.head_dim, self.n_kv_head * cfg.head_dim
        self.q = nn.Linear(cfg.d_model, width, bias=False)  # column-parallel
        self.k = nn.Linear(cfg.d_model, kv, bias=False)
        self.v = nn.Linear(cfg.d_model, kv, bias=False)
        self.o = nn.Linear(width, cfg.d_model, bias=False)  # row-parallel
        self.attention = cfg.attention
        self.fused = cfg.kernels == "megatron"
        self.sequence_parallel = cfg.sequence_parallel
        # Buffers, so they are model state and follow the model's device; not saved with its weights.
        cos, sin = _rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        future = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)  # what a token may not see
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, k_heads, d = self.n_head, self.n_kv_head, self.head_dim
        g, c = a // k_heads, a * d  # c: C / t
        q, k, v = column_parallel(x, [(self.q.weight, None), (self.k.weight, None), (self.v.weight, None)],
                                  self.group, self.sequence_parallel)
        b, t, _ = q.shape  # every token, with sequence parallelism too
        cos, sin = self.cos[:t], self.sin[:t]
        if self.fused:  # TransformerEngine's fused RoPE in flash_attn_func's layout, (B, T, heads, d)
            q, k = rope(q.view(b, t, a, d), cos, sin), rope(k.view(b, t, k_heads, d), cos, sin)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(b, t, k_heads, d).transpose(1, 2)  # views
        else:
            q = q.view(b, t, a, d).transpose(1, 2)  # (B, A, T, d)
            k = k.view(b, t, k_heads, d).transpose(1, 2)  # (B, K, T, d)
            v = v.view(b, t, k_heads, d).transpose(1, 2)  # (B, K, T, d)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.attention == "flash":  # in flash_attn_func's layout, (B, T, heads, d): views
            y = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 1.0 / math.sqrt(d), 0.0)[0]
            return reduce_from_tensor_parallel(self.o(y.view(b, t, c)), self.group, self.sequence_parallel)
        if self.attention == "math":
            q = q.reshape(b, k_heads, g * t, d)  # a group's query heads stacked along the rows
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, K, G·T, T)
            att = att.view(b, k_heads, g, t, t).masked_fill(self.future[:t, :t], float("-inf"))
            att = F.softmax(att, dim=-1).view(b, k_heads, g * t, t)
            y = (att @ v).view(b, a, t, d)  # (B, A, T, d): head h is group h // G
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, A, T, d)
        y = y.transpose(1, 2).reshape(b, t, c)  # (B, T, C/t)
        return reduce_from_tensor_parallel(self.o(y), self.group, self.sequence_parallel)  # (B, T, C) or (B, T/t, C)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, C -> F/t -> C with three matrices and no biases."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.group = cfg.tensor_parallel
        width = cfg.ffn // self.group
        self.gate = nn.Linear(cfg.d_model, width, bias=False)  # column-parallel
        self.up = nn.Linear(cfg.d_model, width, bias=False)
        self.down = nn.Linear(width, cfg.d_model, bias=False)  # row-parallel
        self.fused = cfg.kernels == "megatron"
        self.sequence_parallel = cfg.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sp = self.sequence_parallel
        gate, up = column_parallel(x, [(self.gate.weight, None), (self.up.weight, None)], self.group, sp)
        hidden = swiglu(gate, up) if self.fused else F.silu(gate) * up  # (B, T, F/t)
        return reduce_from_tensor_parallel(self.down(hidden), self.group, sp)


def _norm(norm: nn.RMSNorm, x: torch.Tensor, eps: float, fused: bool) -> torch.Tensor:
    """``norm(x)``, as TransformerEngine's fused kernel where ``fused`` (Note [fused kernels])."""
    return rms_norm(x, norm.weight, eps)[0] if fused else norm(x)


class Block(nn.Module):
    """One pre-RMSNorm decoder block: attention and MLP, each inside a residual connection."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.eps, self.fused = cfg.norm_eps, cfg.kernels == "megatron"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(_norm(self.norm1, x, self.eps, self.fused))  # the residual adds as they are
        return x + self.mlp(_norm(self.norm2, x, self.eps, self.fused))


class Head(nn.Module):
    """Final RMSNorm and the projection to vocabulary logits: (B, T, C) -> (B, T, V)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.out = nn.Linear(cfg.d_model, cfg.shard_vocab, bias=False)  # this rank's logits: (B, T, V/t)
        self.group = cfg.tensor_parallel
        self.sequence_parallel = cfg.sequence_parallel
        self.eps, self.fused = cfg.norm_eps, cfg.kernels == "megatron"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _norm(self.norm, x, self.eps, self.fused)
        return column_parallel(x, [(self.out.weight, None)], self.group, self.sequence_parallel)[0]


def llama(cfg: LlamaConfig | str = "8b", **overrides: object) -> nn.Sequential:
    """A Llama-style decoder as ``nn.Sequential(embedding, block_0 .. block_{L-1}, head)``.

    Build it under ``with torch.device("meta"):`` to count a large size without allocating.

    Args:
        cfg: a :class:`LlamaConfig` or the name of one of :data:`CONFIGS`.
        overrides: fields of the config to replace (``seq_len=4096``, ``attention="sdpa"``).

    Raises:
        KeyError: an unknown size name.
        ValueError: an invalid config.
    """
    config = llama_config(cfg) if isinstance(cfg, str) else cfg
    if overrides:
        config = replace(config, **overrides)  # type: ignore[arg-type]
    return decoder(Embedding(config), [Block(config) for _ in range(config.n_layer)], Head(config))


def llama_sample(cfg: LlamaConfig, batch: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (shapes only on meta, random on a real device)."""
    return token_ids(batch, cfg.seq_len, cfg.vocab_size, device)
