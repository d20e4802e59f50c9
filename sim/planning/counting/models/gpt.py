"""GPT as a preset of the decoder (:mod:`sim.planning.counting.models.decoder`), with the GPT-3 paper's model sizes.

A GPT block is pre-LayerNorm, with biases, learned positions, one fused QKV projection and a GELU MLP of width 4C;
dropout 0.1 as in GPT-2. The head is untied (Note [untied head]).

Note [untied head]: the output projection has its own weight, as pipelines keep it (the embedding and the head live
on different stages), so a model has ``V·C`` more parameters than the tied count the GPT-3 paper names it by
(``tied=True`` counts so, Note [tied embeddings] in :mod:`sim.planning.counting.models.decoder`).

Note [saved activations]: a GPT block of a spec's default keeps Note [saved activations] in
:mod:`sim.planning.counting.models.decoder_layers` with LayerNorm, K = a, F = 4h and both residual branches through
``bias_dropout_add``: ``s·b·h·(10 + 24/t) + 4·a·s·b/t + 16·s·b + 16`` bytes on one of ``t`` ranks, Korthikanti et
al.'s ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` less its attention core, plus the logsumexp and the LayerNorms' statistics
(every term but the seed over ``t`` with sequence parallelism). At t = 8 a gpt:175b block keeps 13.0·s·b·h bytes,
where ``kernels=eager,attention=math`` keeps 23.0 (4.25 and 14.25 with sequence parallelism).

References: Brown et al. (2020), "Language Models are Few-Shot Learners", Table 2.1; Radford et al. (2019),
"Language Models are Unsupervised Multitask Learners" (GPT-2); Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models".
"""

from __future__ import annotations

import torch
from torch import nn

from sim.planning.counting.models.decoder import DecoderConfig, preset
from sim.planning.counting.models.decoder_layers import Block, decoder, token_ids

__all__ = ["CONFIGS", "Block", "GPTConfig", "gpt", "gpt_config", "gpt_sample"]

#: A GPT's config: the decoder's defaults are GPT-3 125M's
#: (:class:`~sim.planning.counting.models.decoder.DecoderConfig`).
GPTConfig = DecoderConfig

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
    return preset(CONFIGS, name, "GPT")


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
    return decoder(gpt_config(cfg) if isinstance(cfg, str) else cfg, **overrides)


def gpt_sample(cfg: GPTConfig, batch: int, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of token ids, shape ``(batch, seq_len)`` (shapes only on meta, random on a real device)."""
    return token_ids(batch, cfg.seq_len, cfg.vocab_size, device)
