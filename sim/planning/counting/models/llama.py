"""Llama as a preset of the decoder (:mod:`sim.planning.counting.models.decoder`), with the Llama 3 model sizes.

A Llama block is pre-RMSNorm, without biases, with grouped-query attention (A query heads share K key/value heads),
RoPE on q and k, three separate q, k, v projections and a SwiGLU MLP, ``down(silu(gate(x)) * up(x))``; no dropout.
The head is untied.

Note [saved activations]: a Llama block of a spec's default keeps Note [saved activations] in
:mod:`sim.planning.counting.models.decoder_layers` with RMSNorm, SwiGLU and bare residual adds (no bias, no dropout):
``s·b·h·(8 + (4 + 4·K/a)/t) + 6·s·b·F/t + 4·a·s·b/t + 8·s·b`` bytes on one of ``t`` ranks; with sequence parallelism
all of it over ``t``. Per s·b·h at t = 1 that is 12 + 4·K/a + 6·F/h, about 34 at every Llama 3 size (31.8 for 405B,
33.5 for 70B); the eager block keeps 50.3 for 405B with FlashAttention. At t = 8 a llama:405b block keeps
10.97·s·b·h bytes, where ``kernels=eager,attention=math`` keeps 39.8 (3.97 and 22.3 with sequence parallelism).

Llama 3's 8 KV heads allow tensor parallelism up to t = 8, a node (Note [tensor parallel] in
:mod:`sim.planning.counting.models.decoder`).

References: Dubey et al. (2024), "The Llama 3 Herd of Models", Table 3 (sizes) and section 3.1.1 (the
architecture); Touvron et al. (2023), "LLaMA: Open and Efficient Foundation Language Models" (pre-norm RMSNorm,
SwiGLU, RoPE); Ainslie et al. (2023), "GQA"; Su et al. (2021), "RoFormer" (rotary position embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from sim.planning.counting.models.decoder import DecoderConfig, preset
from sim.planning.counting.models.decoder_layers import decoder, token_ids

__all__ = ["CONFIGS", "LlamaConfig", "llama", "llama_config", "llama_sample"]


@dataclass(frozen=True)
class LlamaConfig(DecoderConfig):
    """A decoder with Llama's defaults, Llama 3 8B's shape (the fields: :class:`DecoderConfig`).

    Attributes:
        seq_len: 8192, Llama 3's pre-training length.
        vocab_size: 128256, the released tokenizer's (128000 tokens, as Table 3 rounds it, and 256 special ones).
        rope_theta: 500000 in Llama 3.
        norm_eps: 1e-5 as in the released models.
    """

    n_layer: int = 32
    n_head: int = 32
    d_model: int = 4096
    seq_len: int = 8192
    vocab_size: int = 128256
    ffn: int | None = 14336
    n_kv_head: int | None = 8
    mlp: Literal["gelu", "swiglu", "relu2"] = "swiglu"
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    bias: bool = False
    position: Literal["learned", "rope"] = "rope"
    qkv: Literal["fused", "split"] = "split"
    dropout: float = 0.0
    rope_theta: float = 500000.0


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
    return preset(CONFIGS, name, "Llama")


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
    return decoder(llama_config(cfg) if isinstance(cfg, str) else cfg, **overrides)


def llama_sample(cfg: DecoderConfig, batch: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (shapes only on meta, random on a real device)."""
    return token_ids(batch, cfg.seq_len, cfg.vocab_size, device)
