"""Mixtral as a preset of the decoder (:mod:`sim.planning.counting.models.decoder`): Llama's block with a mixture
of 8 SwiGLU experts, 2 a token, in place of every MLP (Note [mixture of experts] in
:mod:`sim.planning.counting.models.moe_config`).

A Mixtral block is pre-RMSNorm without biases, grouped-query attention (8 KV heads), RoPE (theta 1e6), separate q,
k, v projections; the router's softmax over the top 2 logits weighs the two experts. No dropout; untied head.

Sizes, each number from the released ``config.json`` on Hugging Face: mistralai/Mixtral-8x7B-v0.1 (hidden_size 4096,
intermediate_size 14336, num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, num_local_experts 8,
num_experts_per_tok 2, vocab_size 32000, max_position_embeddings 32768, rope_theta 1e6) and
mistralai/Mixtral-8x22B-v0.1 (6144, 16384, 56, 48, 8, 8, 2, vocab_size 32768, 65536, 1e6). With them 8x7B has
46.7B parameters, 12.9B activated a token, and 8x22B 140.6B and 39.2B: the 46.7B/12.9B (Jiang et al., 2024) and
141B/39B (Mistral AI, "Cheaper, Better, Faster, Stronger", 2024) they are named by. Each at its context length.

References: Jiang et al. (2024), "Mixtral of Experts" (arXiv 2401.04088); Mistral AI (2024), Mixtral 8x22B's
announcement.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.planning.counting.models.llama import LlamaConfig

__all__ = ["CONFIGS", "MixtralConfig"]


@dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    """A decoder with Mixtral's defaults, Mixtral 8x7B's shape (the fields: :class:`DecoderConfig`): Llama's block
    (RMSNorm, SwiGLU, grouped-query attention, RoPE, no biases, q, k and v apart, no dropout) and its own sizes.

    Attributes:
        seq_len: 32768, 8x7B's context (Jiang et al., 2024, section 2).
        vocab_size: 32000, 8x7B's tokenizer's.
        rope_theta: 1e6 as released.
    """

    n_layer: int = 32
    n_head: int = 32
    d_model: int = 4096
    seq_len: int = 32768
    vocab_size: int = 32000
    ffn: int | None = 14336
    n_kv_head: int | None = 8
    rope_theta: float = 1e6
    experts: int = 8
    experts_per_token: int = 2


#: Mixtral's two sizes (the module docstring gives each number's source).
CONFIGS: dict[str, MixtralConfig] = {
    "8x7b": MixtralConfig(),
    "8x22b": MixtralConfig(n_layer=56, n_head=48, d_model=6144, seq_len=65536, vocab_size=32768, ffn=16384),
}
