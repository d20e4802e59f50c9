"""DeepSeek-V2 and DeepSeek-V3 as presets of the decoder (:mod:`sim.planning.counting.models.decoder`): multi-head
latent attention and DeepSeekMoE.

A DeepSeek block is pre-RMSNorm without biases: MLA (Note [multi-head latent attention] in
:mod:`sim.planning.counting.models.mla`), then a SwiGLU MLP in the first ``dense_layers`` blocks and a mixture of
fine-grained routed experts and shared ones in the others (Note [mixture of experts] in
:mod:`sim.planning.counting.models.moe_config`). V2 routes by softmax scores over 160 experts (6 a token, on at most
3 devices); V3 by sigmoid scores over 256 (8 a token, on at most 4 nodes: ``node_limit``), with one multi-token
prediction module. No dropout; untied head.

Sizes, each number from the released configuration: DeepSeek-V3's ``inference/configs/config_671B.json`` and
DeepSeek-V2's ``config_236B.json`` in the deepseek-ai/DeepSeek-V3 repository (dim, inter_dim, moe_inter_dim,
n_layers, n_dense_layers, n_heads, n_routed_experts, n_shared_experts, n_activated_experts, n_limited_groups,
q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, vocab_size, score_func), and the
Hugging Face ``config.json`` of deepseek-ai/DeepSeek-V3 (num_nextn_predict_layers 1, rms_norm_eps 1e-6, rope_theta
10000). With them V3 has 671.0B parameters without its MTP module (11.6B more), 37.5B activated a token (36.6B
without the token embedding, as DeepSeek's README_WEIGHTS counts them); V2 235.7B and 21.4B: the 671B/37B and
236B/21B the reports name them by. Both pre-trained at 4096 tokens (V3 report, section 4.2; V2 report, section
3.1.2).

References: DeepSeek-AI (2024), "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
Model" (arXiv 2405.04434); DeepSeek-AI (2024), "DeepSeek-V3 Technical Report" (arXiv 2412.19437).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sim.planning.counting.models.decoder import DecoderConfig

__all__ = ["CONFIGS", "DeepSeekConfig"]


@dataclass(frozen=True)
class DeepSeekConfig(DecoderConfig):
    """A decoder with DeepSeek's defaults, DeepSeek-V3's shape (the fields: :class:`DecoderConfig`).

    Attributes:
        seq_len: 4096, the pre-training length of V2 and V3.
        vocab_size: 129280, V3's tokenizer's.
        norm_eps: 1e-6, the released models'.
    """

    n_layer: int = 61
    n_head: int = 128
    d_model: int = 7168
    seq_len: int = 4096
    vocab_size: int = 129280
    ffn: int | None = 18432
    mlp: Literal["gelu", "swiglu", "relu2"] = "swiglu"
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    bias: bool = False
    position: Literal["learned", "rope"] = "rope"
    dropout: float = 0.0
    norm_eps: float = 1e-6
    experts: int = 256
    experts_per_token: int = 8
    shared_experts: int = 1
    expert_ffn: int | None = 2048
    dense_layers: int = 3
    router: Literal["softmax", "sigmoid"] = "sigmoid"
    node_limit: int | None = 4
    attention_kind: Literal["standard", "mla"] = "mla"
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    mtp_layers: int = 1


#: DeepSeek's two sizes (the module docstring gives each number's source). V2 limits each token to 3 devices, not
#: nodes: ``node_limit`` is left unset for it.
CONFIGS: dict[str, DeepSeekConfig] = {
    "v3": DeepSeekConfig(),
    "v2": DeepSeekConfig(n_layer=60, d_model=5120, vocab_size=102400, ffn=12288, experts=160, experts_per_token=6,
                         shared_experts=2, expert_ffn=1536, dense_layers=1, router="softmax", node_limit=None,
                         mtp_layers=0),
}
