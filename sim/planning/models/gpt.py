"""A GPT-style decoder stack as an ``nn.Sequential``, with the GPT-3 paper's model sizes.

Layers (pre-LayerNorm, as GPT-2 and GPT-3)::

    Embedding     token ids (B, T) -> (B, T, C): token + position embedding, dropout
    Block x L     x + Attention(LN(x)), then x + MLP(LN(x)); MLP is C -> F -> GELU -> C (F = 4C by default)
    Head          LN, then a linear layer to the vocabulary: (B, T, C) -> (B, T, V)

Note [attention]: ``attention="math"`` (the default) writes attention out as Megatron-LM did in
Korthikanti et al. (2022): QK^T, scale, causal mask, softmax, dropout, times V. What it keeps for
backward is their ``s·b·h·(34 + 5·a·s/h)`` bytes per layer in 16-bit precision. ``attention="sdpa"``
calls ``F.scaled_dot_product_attention`` (the fused kernel on a GPU); both count the same FLOPs.

Note [untied head]: the output projection has its own weight, as pipelines keep it (the embedding
and the head live on different stages), so a model has ``V·C`` more parameters than the tied count
the GPT-3 paper names it by.

References: Brown et al. (2020), "Language Models are Few-Shot Learners", Table 2.1; Korthikanti et
al. (2022), "Reducing Activation Recomputation in Large Transformer Models"; Karpathy's minGPT.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CONFIGS", "GPTConfig", "gpt", "gpt_config", "gpt_sample"]


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
        attention: ``"math"`` or ``"sdpa"`` (see Note [attention]).
    """

    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    seq_len: int = 2048
    vocab_size: int = 50257
    ffn: int | None = None
    dropout: float = 0.1
    attention: Literal["math", "sdpa"] = "math"

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.ffn is not None and self.ffn < 1:
            raise ValueError(f"GPTConfig.ffn must be >= 1, got {self.ffn}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} does not divide into n_head={self.n_head} heads")
        if self.attention not in ("math", "sdpa"):
            raise ValueError(f"attention must be 'math' or 'sdpa', got {self.attention!r}")

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


class Embedding(nn.Module):
    """Token ids (B, T) to hidden states (B, T, C): token plus learned position embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        return self.drop(self.tokens(ids) + self.positions(pos))  # (B, T, C)


class Attention(nn.Module):
    """Causal multi-head self-attention (see Note [attention])."""

    future: torch.Tensor

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout
        self.math = cfg.attention == "math"
        # True above the diagonal: the future a token may not see. A buffer, so it is model state.
        future = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        hd = c // self.n_head
        q, k, v = self.qkv(x).split(c, dim=2)  # each (B, T, C)
        q = q.view(b, t, self.n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(b, t, self.n_head, hd).transpose(1, 2)
        v = v.view(b, t, self.n_head, hd).transpose(1, 2)
        if self.math:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nh, T, T)
            att = att.masked_fill(self.future[:t, :t], float("-inf"))
            att = self.attn_drop(F.softmax(att, dim=-1))
            y = att @ v  # (B, nh, T, hd)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # (B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    """One pre-LayerNorm decoder block: attention and MLP, each inside a residual connection."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(OrderedDict([
            ("fc", nn.Linear(cfg.d_model, cfg.d_ff)),
            ("act", nn.GELU()),
            ("proj", nn.Linear(cfg.d_ff, cfg.d_model)),
            ("drop", nn.Dropout(cfg.dropout)),
        ]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits: (B, T, C) -> (B, T, V)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


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
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    layers["embedding"] = Embedding(config)
    for i in range(config.n_layer):
        layers[f"block{i}"] = Block(config)
    layers["head"] = Head(config)
    return nn.Sequential(layers)


def gpt_sample(cfg: GPTConfig, batch: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (zeros on meta or random on a real device)."""
    if str(device) == "meta":
        return torch.empty(batch, cfg.seq_len, dtype=torch.long, device="meta")
    return torch.randint(cfg.vocab_size, (batch, cfg.seq_len), device=device)
