"""Nemotron-4 as a preset of the decoder (:mod:`sim.planning.counting.models.decoder`), with its 15B and 340B sizes.

A Nemotron-4 block is pre-LayerNorm, without biases, with grouped-query attention (8 KV heads), RoPE on q and k, one
fused QKV projection (Megatron-Core's ``linear_qkv``; the models were trained with Megatron) and a squared-ReLU MLP,
``proj(relu(fc(x))²)`` of width 4C; no dropout, untied input and output embeddings (Parmar et al., 2024; Nvidia,
2024). The released 340B checkpoint rotates half of each head (``rotary_percentage`` 0.5 in its config); here RoPE
turns the whole head, which changes no FLOP and no saved byte, only what the RoPE kernel reads and writes. RoPE's
base is Megatron's default, 10000 (the reports name none).

Note [saved activations]: a Nemotron-4 block of a spec's default keeps Note [saved activations] in
:mod:`sim.planning.counting.models.decoder_layers` with LayerNorm, squared ReLU and bare residual adds (no bias, no
dropout): ``s·b·h·(8 + (4 + 4·K/a)/t) + 4·s·b·F/t + 4·a·s·b/t + 16·s·b`` bytes on one of ``t`` ranks (with sequence
parallelism all of it over ``t``). At F = 4h that is 28 + 4·K/a per s·b·h at t = 1, 28.3 for 340B (K/a = 8/96); at
t = 8, 10.54·s·b·h for 340B.

References: Parmar et al. (2024), "Nemotron-4 15B Technical Report", arXiv 2402.16819, Table 1; Nvidia (2024),
"Nemotron-4 340B Technical Report", arXiv 2406.11704, Table 1; So et al. (2021), "Primer" (squared ReLU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from sim.planning.counting.models.decoder import DecoderConfig, preset
from sim.planning.counting.models.decoder_layers import decoder, token_ids

__all__ = ["CONFIGS", "NemotronConfig", "nemotron", "nemotron_config", "nemotron_sample"]


@dataclass(frozen=True)
class NemotronConfig(DecoderConfig):
    """A decoder with Nemotron-4's defaults, its 15B shape (the fields: :class:`DecoderConfig`).

    Attributes:
        seq_len: 4096, the pre-training length of both sizes.
        vocab_size: 256000, the SentencePiece tokenizer's (Parmar et al., 2024, Table 1).
    """

    n_layer: int = 32
    n_head: int = 48
    d_model: int = 6144
    seq_len: int = 4096
    vocab_size: int = 256000
    ffn: int | None = 24576
    n_kv_head: int | None = 8
    mlp: Literal["gelu", "swiglu", "relu2"] = "relu2"
    bias: bool = False
    position: Literal["learned", "rope"] = "rope"
    dropout: float = 0.0


#: Nemotron-4's two sizes. 15B: Parmar et al. (2024), Table 1 (32 layers, hidden 6144, 48 heads, 8 KV heads, sequence
#: 4096, vocabulary 256,000; 3.2B embedding and 12.5B non-embedding parameters). 340B: Nvidia (2024), Table 1 (96
#: layers, hidden 18432, 96 heads, 8 KV heads, sequence 4096, vocabulary 256,000; 9.4B embedding and 331.6B
#: non-embedding parameters). The MLP's width, 4C, is the released checkpoints' (``ffn_hidden_size``); with it the
#: counts are 3.15B + 12.48B and 9.44B + 331.59B.
CONFIGS: dict[str, NemotronConfig] = {
    "15b": NemotronConfig(n_layer=32, n_head=48, n_kv_head=8, d_model=6144, ffn=24576),
    "340b": NemotronConfig(n_layer=96, n_head=96, n_kv_head=8, d_model=18432, ffn=73728),
}


def nemotron_config(name: str) -> NemotronConfig:
    """The named Nemotron-4 size (``"15b"``, ``"340B"``).

    Raises:
        KeyError: an unknown name; the message lists the known ones.
    """
    return preset(CONFIGS, name, "Nemotron")


def nemotron(cfg: NemotronConfig | str = "15b", **overrides: object) -> nn.Sequential:
    """A Nemotron-style decoder as ``nn.Sequential(embedding, block_0 .. block_{L-1}, head)``.

    Args:
        cfg: a :class:`NemotronConfig` or the name of one of :data:`CONFIGS`.
        overrides: fields of the config to replace (``seq_len=8192``, ``attention="sdpa"``).

    Raises:
        KeyError: an unknown size name.
        ValueError: an invalid config.
    """
    return decoder(nemotron_config(cfg) if isinstance(cfg, str) else cfg, **overrides)


def nemotron_sample(cfg: DecoderConfig, batch: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (shapes only on meta, random on a real device)."""
    return token_ids(batch, cfg.seq_len, cfg.vocab_size, device)
