"""A GPT-style decoder stack as an ``nn.Sequential``, with the GPT-3 paper's model sizes.

Layers (pre-LayerNorm, as GPT-2 and GPT-3)::

    Embedding     token ids (B, T) -> (B, T, C): token + position embedding, dropout
    Block x L     x + Attention(LN(x)), then x + MLP(LN(x)); MLP is C -> F -> GELU -> C (F = 4C by default)
    Head          LN, then a linear layer to the vocabulary: (B, T, C) -> (B, T, V)

Note [attention]: ``attention="math"`` (the config's default; a spec's is flash, Note [spec defaults] in
:mod:`sim.planning.models`) writes attention out as Megatron-LM did in
Korthikanti et al. (2022): QK^T, scale, causal mask, softmax, dropout, times V. What it keeps for
backward is their ``s·b·h·(34 + 5·a·s/h)`` bytes per layer in 16-bit precision. ``attention="sdpa"``
calls ``F.scaled_dot_product_attention`` (the fused kernel on a GPU); both count the same FLOPs, and on meta the same
bytes (Note [attention on meta] in :mod:`sim.planning.operators`). ``attention="flash"`` is FlashAttention.

Note [flash attention]: ``attention="flash"`` runs attention as FlashAttention (Dao et al., 2022; Dao, 2023) does,
one custom operator each way (``gpipe_sim::flash_attention`` and its backward) that the counter sees as one kernel
(:mod:`sim.planning.operators`, Note [flash attention] there, for its FLOPs, bytes and rate). It takes q, k and v in
the (B, T, heads, d) layout of ``flash_attn_func``, views of the QKV projection's output, and keeps for backward only
q, k, v, its output (which is also the output projection's input, so one copy) and each row's logsumexp in float32:
the backward computes the scores and probabilities again, so no ``s × s`` tensor is kept. Dropout on the
probabilities runs inside the kernel from a seed it returns (FlashAttention's ``rng_state``, two int64s kept for the
backward when there is dropout), so no mask is kept either. A block then keeps ``s·b·h·34 + 4·a·s·b`` bytes in 16 bits
(``s·b·h·(10 + 24/t) + 4·a·s·b/t`` on one of t ranks, ``(34·s·b·h + 4·a·s·b)/t`` with sequence parallelism), plus
16 bytes of seed: Korthikanti et al.'s form less its ``5·a·s²·b``, the probabilities (2 bytes each), the dropout's
mask (1) and its output (2), plus the logsumexp. With no ``s × s`` core there is nothing for selective recompute to
drop (the model has no attention core). With ``kernels="megatron"`` attention is this kernel and the other fusions
are unchanged. On the CPU the operator computes exactly what the math form does, so the gradients agree.

Note [Megatron's kernels]: ``kernels="megatron"`` runs the block as Megatron-LM (2021) did by default, with its fused
kernels: the scale, causal mask and softmax of the scores in one kernel (its ``scaled_upper_triang_masked_softmax``),
the MLP's bias and GELU in one (``bias_gelu``), and each residual branch's bias, dropout and residual add in one
(``bias_dropout_add``), the linear layers before them skipping their bias. Each is a custom operator (``gpipe_sim::``)
that the counter sees as one kernel forward and one backward, moving the bytes such a kernel reads and writes
(:mod:`sim.planning.operators`, Note [fused kernels]). FLOPs are the default's, and so is what is saved for backward
(the softmax's output, GELU's input, the dropouts' one-byte masks): Korthikanti et al.'s accounting is of these
kernels. Two differences from Megatron's code that cost nothing here: GELU is the exact one (Megatron's kernel uses
the tanh approximation), so both settings compute the same function; and activations stay (B, T, C), so q, k and v
are copied to contiguous heads where Megatron's (T, B, C) layout lets the batched GEMMs read them in place.
A split backward's ``B`` (the input's gradient alone) runs their bias gradients' sums too, one small reduction
each: a custom operator computes every gradient its inputs require. ``kernels="eager"`` (the config's default; a
spec's is megatron) runs every operator as its own kernel, as PyTorch's eager mode runs the math form.

Note [saved activations]: a block of a spec's default (``attention="flash"``, ``kernels="megatron"``) keeps for
backward, in 16 bits on one of ``t`` tensor-parallel ranks (s tokens, b samples, h hidden, a heads, F = 4h)::

    LayerNorm x 2         input 2·s·b·h each, mean and 1/std in fp32 8·s·b each      4·s·b·h + 16·s·b
    QKV and fc GEMMs      their inputs, the LayerNorms' outputs                       4·s·b·h
    FlashAttention        q, k, v; its output (the projection's input); logsumexp   8·s·b·h/t + 4·a·s·b/t
                          in fp32; the dropout's seed                                 + 16
    bias_dropout_add x 2  the dropout's one-byte mask                                 2·s·b·h
    bias_gelu, proj       GELU's input and the second GEMM's input, F/t wide each     16·s·b·h/t

that is ``s·b·h·(10 + 24/t) + 4·a·s·b/t + 16·s·b + 16`` bytes: Korthikanti et al.'s form less its ``5·a·s²·b/t``
attention core, plus the logsumexp and the LayerNorms' statistics. With sequence parallelism every term but the
seed is over ``t``. At t = 8 a gpt:175b block keeps 13.0·s·b·h bytes, where ``kernels=eager,attention=math`` keeps
23.0 (4.25 and 14.25 with sequence parallelism).

Note [untied head]: the output projection has its own weight, as pipelines keep it (the embedding
and the head live on different stages), so a model has ``V·C`` more parameters than the tied count
the GPT-3 paper names it by.

Note [tensor parallel]: ``tensor_parallel=t`` builds one rank's shard of Megatron-LM's split (Shoeybi et al.,
2019): attention by heads (the QKV projection C -> 3C/t for A/t heads, the output projection C/t -> C), the MLP's
first matrix by columns (C -> F/t) and its second by rows (F/t -> C), the vocabulary of the token embedding and
the head by rows (ceil(V/t) each: Megatron pads the vocabulary so every rank holds as many). LayerNorms, position
embeddings and the row-parallel layers' biases are replicated. The collectives are markers the counter sees
(:mod:`sim.planning.tensor_parallel`): an all-reduce after the output projection and after the MLP (g), and one in
the backward before QKV and before the MLP (f); the embedding all-reduces its partial lookups (g), the head
all-reduces its input's gradient (f). A rank's saved activations per block are then Korthikanti et al.'s
``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` bytes. ``t`` must divide the heads and F.

Note [sequence parallel]: ``sequence_parallel=True`` adds Korthikanti et al.'s sequence parallelism to the shard:
between the tensor-parallel regions each rank holds ``s/t`` of the tokens, so the LayerNorms, dropouts and residual
adds run on ``(B, T/t, C)``. f becomes an all-gather of the tokens (a reduce-scatter of their gradient), g a
reduce-scatter (an all-gather of the gradient), and a column-parallel GEMM keeps this rank's tokens for its weight
gradient, gathering them again in the backward (:mod:`sim.planning.tensor_parallel`). The embedding all-reduces its
lookups, adds the positions and keeps this rank's tokens (Megatron-LM's order where positions are learned); the head
gathers the tokens before its GEMM. A rank's saved activations per block are ``s·b·h·(34 + 5·a·s/h) / t`` bytes, its
FLOPs the shard's without it. ``t`` must divide the tokens ``s`` too.

References: Brown et al. (2020), "Language Models are Few-Shot Learners", Table 2.1; Korthikanti et
al. (2022), "Reducing Activation Recomputation in Large Transformer Models"; Dao et al. (2022), "FlashAttention: Fast
and Memory-Efficient Exact Attention with IO-Awareness"; Dao (2023), "FlashAttention-2: Faster Attention with Better
Parallelism and Work Partitioning"; Shoeybi et al. (2019),
"Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism"; Narayanan et al. (2021),
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 4.2 (the fused kernels);
Karpathy's minGPT.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.models.kernels import bias_dropout_add, bias_gelu, causal_softmax, flash_attention
from sim.planning.models.limits import check_decoder_size
from sim.planning.tensor_parallel import column_parallel, reduce_from_tensor_parallel, scatter_to_sequence_parallel

__all__ = ["ATTENTIONS", "CONFIGS", "GPTConfig", "gpt", "gpt_config", "gpt_sample"]

#: The attention forms a decoder runs: the math form, PyTorch's fused one, FlashAttention (Note [attention]).
ATTENTIONS = ("math", "sdpa", "flash")


def check_sequence_parallel(sequence_parallel: bool, t: int, seq_len: int) -> None:
    """Refuse sequence parallelism without a tensor-parallel split, or over a degree that does not divide the tokens.

    Raises:
        ValueError: which of the two.
    """
    if not sequence_parallel:
        return
    if t == 1:
        raise ValueError("sequence parallelism splits the tokens over the tensor-parallel ranks; it needs "
                         "tensor_parallel > 1")
    if seq_len % t:
        raise ValueError(f"tensor parallel {t} does not divide the {seq_len} tokens (sequence parallelism)")


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-style decoder.

    Attributes:
        n_layer: decoder blocks.
        n_head: attention heads (``d_model`` must divide by it).
        d_model: hidden size (C).
        seq_len: context length in tokens; 2048 as in GPT-3.
        vocab_size: 50257, GPT-2's byte-level BPE that GPT-3 kept.
        ffn: the MLP's inner width (F); ``None`` for ``4 * d_model``, GPT-3's at every size.
        dropout: 0.1 as in GPT-2; the dropout masks are part of what training keeps.
        attention: ``"math"``, ``"sdpa"`` (see Note [attention]) or ``"flash"`` (Note [flash attention]).
        kernels: ``"eager"``, every operator its own kernel, or ``"megatron"``, Megatron-LM's fused kernels (Note
            [Megatron's kernels]).
        tensor_parallel: ranks a layer is split over; the model built is one rank's shard (Note [tensor parallel]).
        sequence_parallel: split the tokens between the tensor-parallel regions over the ranks too (Note [sequence
            parallel]); needs ``tensor_parallel > 1``.
    """

    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    seq_len: int = 2048
    vocab_size: int = 50257
    ffn: int | None = None
    dropout: float = 0.1
    attention: Literal["math", "sdpa", "flash"] = "math"
    kernels: Literal["eager", "megatron"] = "eager"
    tensor_parallel: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.ffn is not None and self.ffn < 1:
            raise ValueError(f"GPTConfig.ffn must be >= 1, got {self.ffn}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} does not divide into n_head={self.n_head} heads")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be 'math', 'sdpa' or 'flash', got {self.attention!r}")
        if self.kernels not in ("eager", "megatron"):
            raise ValueError(f"kernels must be 'eager' or 'megatron', got {self.kernels!r}")
        t = self.tensor_parallel
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"tensor_parallel must be an integer >= 1, got {t!r}")
        if self.n_head % t:
            raise ValueError(f"tensor parallel {t} does not divide the {self.n_head} attention heads")
        if self.d_ff % t:
            raise ValueError(f"tensor parallel {t} does not divide the MLP's width {self.d_ff}")
        check_sequence_parallel(self.sequence_parallel, t, self.seq_len)
        check_decoder_size(self.n_layer, self.d_model, self.d_ff, self.seq_len, self.vocab_size, self.n_head,
                           self.parameters)

    @property
    def shard_vocab(self) -> int:
        """Rows of the token embedding and of the head on one rank: ``ceil(V / t)`` (Note [tensor parallel])."""
        return -(-self.vocab_size // self.tensor_parallel)

    @property
    def d_ff(self) -> int:
        """The MLP's inner width: ``ffn``, or ``4 * d_model`` where it is ``None``."""
        return 4 * self.d_model if self.ffn is None else self.ffn

    @property
    def block_parameters(self) -> int:
        """Parameters of one block: 4·C² + 2·C·F weights plus 9·C + F biases and LayerNorm gains
        (12·C² + 13·C with F = 4C)."""
        c, f = self.d_model, self.d_ff
        return 4 * c * c + 2 * c * f + 9 * c + f

    @property
    def parameters(self) -> int:
        """All parameters, with the untied head (see Note [untied head])."""
        c, v = self.d_model, self.vocab_size
        return self.n_layer * self.block_parameters + (v + self.seq_len) * c + 2 * c + v * c

    @property
    def shard_parameters(self) -> int:
        """Parameters of one rank's shard (Note [tensor parallel]): each block's matrices and split biases over
        ``t``, its LayerNorms and the projections' biases whole; the embedding's and head's vocabulary over ``t``."""
        c, f, t, v = self.d_model, self.d_ff, self.tensor_parallel, self.shard_vocab
        block = (4 * c * c + 2 * c * f + 3 * c + f) // t + 6 * c
        return self.n_layer * block + (v + self.seq_len) * c + 2 * c + v * c


#: The eight sizes of GPT-3 (Brown et al., 2020, Table 2.1). Two entries differ from the table, whose
#: head counts do not divide d_model: 1.3B uses 16 heads of 128 (the table: 24 heads, d_head 128) and
#: 13B uses d_model 5120 = 40 x 128 (the table: 5140), as Megatron-LM and OPT do.
CONFIGS: dict[str, GPTConfig] = {
    "125m": GPTConfig(12, 12, 768),
    "350m": GPTConfig(24, 16, 1024),
    "760m": GPTConfig(24, 16, 1536),
    "1.3b": GPTConfig(24, 16, 2048),
    "2.7b": GPTConfig(32, 32, 2560),
    "6.7b": GPTConfig(32, 32, 4096),
    "13b": GPTConfig(40, 40, 5120),
    "175b": GPTConfig(96, 96, 12288),
}


def gpt_config(name: str) -> GPTConfig:
    """The named GPT-3 size (``"1.3b"``, ``"175B"``, ...).

    Raises:
        KeyError: an unknown name; the message lists the known ones.
    """
    key = name.strip().lower()
    if key not in CONFIGS:
        raise KeyError(f"unknown GPT size {name!r}; known: {', '.join(CONFIGS)}")
    return CONFIGS[key]

# -- the decoder ---------------------------------------------------------------------------------------------------


class Embedding(nn.Module):
    """Token ids (B, T) to hidden states (B, T, C): token plus learned position embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.shard_vocab, cfg.d_model)  # this rank's rows (Note [tensor parallel])
        self.positions = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.group = cfg.tensor_parallel
        self.sequence_parallel = cfg.sequence_parallel

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        tokens = reduce_from_tensor_parallel(self.tokens(ids), self.group)  # every rank's rows summed
        x = tokens + self.positions(pos)  # (B, T, C)
        if self.sequence_parallel:  # this rank's tokens (Note [sequence parallel])
            x = scatter_to_sequence_parallel(x, self.group)  # (B, T/t, C)
        return self.drop(x)


class Attention(nn.Module):
    """Causal multi-head self-attention (see Note [attention])."""

    future: torch.Tensor

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.group = cfg.tensor_parallel
        self.n_head = cfg.n_head // self.group  # this rank's heads
        self.head_dim = cfg.d_model // cfg.n_head
        width = self.n_head * self.head_dim  # C / t
        self.qkv = nn.Linear(cfg.d_model, 3 * width)  # column-parallel
        self.proj = nn.Linear(width, cfg.d_model)  # row-parallel
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout
        self.attention = cfg.attention
        self.fused = cfg.kernels == "megatron"
        self.sequence_parallel = cfg.sequence_parallel
        # True above the diagonal: the future a token may not see. A buffer, so it is model state.
        future = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus the attention of ``x`` (the block's normalised input; this rank's tokens with sequence
        parallelism, as ``residual``)."""
        hd = self.head_dim
        c = self.n_head * hd  # C / t
        (qkv,) = column_parallel(x, [(self.qkv.weight, self.qkv.bias)], self.group, self.sequence_parallel)
        b, t, _ = qkv.shape  # every token, with sequence parallelism too
        q, k, v = (z.view(b, t, self.n_head, hd) for z in qkv.split(c, dim=2))  # each (B, T, nh, hd), a view
        p = self.p if self.training else 0.0
        if self.attention == "flash":  # the output's layout is the projection's input (Note [flash attention])
            y = flash_attention(q, k, v, 1.0 / math.sqrt(hd), p)[0].view(b, t, c)
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh, T, hd)
            if self.attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            elif self.fused:
                att = self.attn_drop(causal_softmax(q @ k.transpose(-2, -1), 1.0 / math.sqrt(hd)))  # (B, nh, T, T)
                y = att @ v  # (B, nh, T, hd)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nh, T, T)
                att = att.masked_fill(self.future[:t, :t], float("-inf"))
                att = self.attn_drop(F.softmax(att, dim=-1))
                y = att @ v  # (B, nh, T, hd)
            y = y.transpose(1, 2).contiguous().view(b, t, c)  # (B, T, C/t)
        if self.fused:  # the bias after the all-reduce, in bias_dropout_add
            out = reduce_from_tensor_parallel(F.linear(y, self.proj.weight), self.group, self.sequence_parallel)
            return bias_dropout_add(out, self.proj.bias, residual, self.p if self.training else 0.0)[0]
        out = reduce_from_tensor_parallel(self.proj(y), self.group, self.sequence_parallel)  # (B, T, C) or (B, T/t, C)
        return residual + self.resid_drop(out)


class Block(nn.Module):
    """One pre-LayerNorm decoder block: attention and MLP, each inside a residual connection."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(self.ln1(x), x)
        return self.mlp(self.ln2(x), x)


class MLP(nn.Module):
    """C -> F/t -> GELU -> C on one rank (Note [tensor parallel]), then dropout and the residual."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.group = cfg.tensor_parallel
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff // self.group)  # column-parallel
        self.act = nn.GELU()
        self.proj = nn.Linear(cfg.d_ff // self.group, cfg.d_model)  # row-parallel
        self.drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout
        self.fused = cfg.kernels == "megatron"
        self.sequence_parallel = cfg.sequence_parallel

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus the MLP of ``x`` (the block's normalised input; this rank's tokens with sequence
        parallelism, as ``residual``)."""
        sp = self.sequence_parallel
        if self.fused:  # Note [Megatron's kernels]
            (x,) = column_parallel(x, [(self.fc.weight, None)], self.group, sp)
            x = bias_gelu(x, self.fc.bias)  # (B, T, F/t)
            out = reduce_from_tensor_parallel(F.linear(x, self.proj.weight), self.group, sp)
            return bias_dropout_add(out, self.proj.bias, residual, self.p if self.training else 0.0)[0]
        (x,) = column_parallel(x, [(self.fc.weight, self.fc.bias)], self.group, sp)
        x = self.act(x)  # (B, T, F/t)
        return residual + self.drop(reduce_from_tensor_parallel(self.proj(x), self.group, sp))


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits: (B, T, C) -> (B, T, V)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.shard_vocab, bias=False)  # this rank's logits: (B, T, V/t)
        self.group = cfg.tensor_parallel
        self.sequence_parallel = cfg.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel(self.ln(x), [(self.out.weight, None)], self.group, self.sequence_parallel)[0]


def gpt(cfg: GPTConfig | str = "125m", **overrides: object) -> nn.Sequential:
    """A GPT-style decoder as ``nn.Sequential(embedding, block_0 .. block_{L-1}, head)``.

    Build it under ``with torch.device("meta"):`` to count a large size without allocating.

    Args:
        cfg: a :class:`GPTConfig` or the name of one of :data:`CONFIGS`.
        overrides: fields of the config to replace (``seq_len=512``, ``attention="sdpa"``).

    Raises:
        KeyError: an unknown size name.
        ValueError: an invalid config.
    """
    config = gpt_config(cfg) if isinstance(cfg, str) else cfg
    if overrides:
        config = replace(config, **overrides)  # type: ignore[arg-type]
    return decoder(Embedding(config), [Block(config) for _ in range(config.n_layer)], Head(config))


def decoder(embedding: nn.Module, blocks: list[nn.Module], head: nn.Module) -> nn.Sequential:
    """A decoder stack as the planner counts it, one layer per child: ``embedding, block0 .. block{L-1}, head``."""
    layers: OrderedDict[str, nn.Module] = OrderedDict(embedding=embedding)
    layers.update((f"block{i}", block) for i, block in enumerate(blocks))
    layers["head"] = head
    return nn.Sequential(layers)


def decoder_blocks(n_layer: int) -> range:
    """The indices :func:`decoder` puts its ``n_layer`` blocks at: the layers a count may treat as identical
    (:func:`sim.planning.flops.count_layers`, Note [identical layers])."""
    return range(1, n_layer + 1)


def token_ids(batch: int, seq_len: int, vocab_size: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (shapes only on meta, random on a real device)."""
    if str(device) == "meta":
        return torch.empty(batch, seq_len, dtype=torch.long, device="meta")
    return torch.randint(vocab_size, (batch, seq_len), device=device)


def gpt_sample(cfg: GPTConfig, batch: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (shapes only on meta, random on a real device)."""
    return token_ids(batch, cfg.seq_len, cfg.vocab_size, device)
