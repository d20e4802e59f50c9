"""Qwen3's mixture of experts as a preset of the decoder (:mod:`sim.planning.counting.models.decoder`).

A Qwen3-MoE block is pre-RMSNorm without biases: grouped-query attention with heads wider than ``hidden/heads``
(64 heads of 128 on a hidden size of 4096: ``head_width``), an RMSNorm over each head of q and k before RoPE
(``qk_norm``), and a mixture of 128 SwiGLU experts, 8 a token, in every block, without shared experts; softmax
scores, the top 8 renormalised. No dropout; untied head.

Sizes, each number from the released ``config.json`` of Qwen/Qwen3-235B-A22B on Hugging Face: hidden_size 4096,
num_hidden_layers 94, num_attention_heads 64, num_key_value_heads 4, head_dim 128, num_experts 128,
num_experts_per_tok 8, moe_intermediate_size 1536 (its intermediate_size, 12288, is no block's: every block has
experts), vocab_size 151936, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings false. With them it has 235.1B
parameters, 22.2B activated a token: the 235B/22B it is named by. Pre-trained at 4096 tokens in its general stage
(Qwen3 Technical Report, section 3.2).

References: Qwen Team (2025), "Qwen3 Technical Report" (arXiv 2505.09388).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.planning.counting.models.llama import LlamaConfig

__all__ = ["CONFIGS", "Qwen3Config"]


@dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """A decoder with Qwen3-MoE's defaults, Qwen3-235B-A22B's shape (the fields: :class:`DecoderConfig`): Llama's block
    (RMSNorm, SwiGLU, grouped-query attention, RoPE, no biases, q, k and v apart, no dropout) and its own sizes.

    Attributes:
        seq_len: 4096, the general pre-training stage's length.
        vocab_size: 151936, the released tokenizer's (padded).
        norm_eps: 1e-6 as released.
    """

    n_layer: int = 94
    n_head: int = 64
    d_model: int = 4096
    seq_len: int = 4096
    vocab_size: int = 151936
    ffn: int | None = 1536
    n_kv_head: int | None = 4
    rope_theta: float = 1e6
    norm_eps: float = 1e-6
    head_width: int | None = 128
    qk_norm: bool = True
    experts: int = 128
    experts_per_token: int = 8


#: Qwen3's MoE size (the module docstring gives each number's source).
CONFIGS: dict[str, Qwen3Config] = {"235b-a22b": Qwen3Config()}
