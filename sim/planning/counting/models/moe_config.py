"""A decoder's mixture-of-experts and latent-attention options: their checks and the parameters of each block kind
(the config: :class:`sim.planning.counting.models.decoder.DecoderConfig`; the layers:
:mod:`sim.planning.counting.models.moe_layers` and :mod:`sim.planning.counting.models.mla`).

Note [mixture of experts]: with ``experts=E`` the MLP of every block from ``dense_layers`` on is a mixture of
experts (Shazeer et al., 2017; GShard; DeepSeekMoE)::

    router        a linear layer C -> E (no bias), softmax or sigmoid scores, the top k of them per token
    routed        E SwiGLU experts of width F_e; each token goes through its k, weighted by its scores
    shared        ``shared_experts`` SwiGLU experts every token goes through: one dense MLP of width n_s·F_e

Per token the block reads only k of the E routed experts, so a model's ``activated_parameters`` are its
``parameters`` less ``(E - k)`` experts of every MoE block: the count DeepSeek, Mistral and Qwen name a model's
"activated" size by (DeepSeek's own count leaves the token embedding out too, a lookup of one row).
Expert parallelism shards the experts: one rank of ``ep`` holds ``E/ep`` of them, each split over ``etp`` ranks as
Megatron splits an MLP (``expert_tensor_parallel``); the rest of the block follows ``tensor_parallel``. Experts
have no biases, as in every published MoE here.

Note [multi-token prediction]: DeepSeek-V3's MTP module (Liu et al., 2024, section 2.2) predicts one token further
from the last block's output and the next token's embedding: the two RMSNormed and concatenated, a projection
2C -> C, one block of the last block's kind, and the head's norm; the token embedding and the head are the main
model's (shared, counted once). Its parameters are in ``parameters`` (the model trains them) and apart in
``mtp_parameters``, since the published totals leave them out (DeepSeek-V3: 671B without its 14B MTP module).

References: Shazeer et al. (2017), "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts
Layer"; Lepikhin et al. (2020), "GShard"; Dai et al. (2024), "DeepSeekMoE"; DeepSeek-AI (2024), "DeepSeek-V2" and
"DeepSeek-V3 Technical Report" (arXiv 2405.04434, 2412.19437); Jiang et al. (2024), "Mixtral of Experts".
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

__all__ = ["ATTENTION_KINDS", "ROUTERS", "BlockParameters", "attention_parameters", "block_parameters",
           "check_moe", "is_moe_block", "mtp_parameters"]

#: The attention kinds (Note [multi-head latent attention] in :mod:`sim.planning.counting.models.mla`) and the
#: routers' scores (Note [mixture of experts]).
ATTENTION_KINDS = ("standard", "mla")
ROUTERS = ("softmax", "sigmoid")


# Note [what the rules read]: the checks and counts here read a config through :class:`DecoderConfig`, the fields and
# properties they use, rather than importing :class:`sim.planning.counting.models.decoder.DecoderConfig`, which calls
# them: the config depends on its rules, the rules on no config (tests/test_imports.py counts type-only imports too).
class DecoderConfig(Protocol):
    """What the mixture-of-experts and latent-attention rules read of a decoder's config (Note [what the rules
    read]); read-only, as the frozen config's fields are."""

    @property
    def n_layer(self) -> int: ...

    @property
    def n_head(self) -> int: ...

    @property
    def d_model(self) -> int: ...

    @property
    def n_kv_head(self) -> int | None: ...

    @property
    def mlp(self) -> str: ...

    @property
    def bias(self) -> bool: ...

    @property
    def position(self) -> str: ...

    @property
    def tensor_parallel(self) -> int: ...

    @property
    def experts(self) -> int: ...

    @property
    def experts_per_token(self) -> int: ...

    @property
    def shared_experts(self) -> int: ...

    @property
    def expert_ffn(self) -> int | None: ...

    @property
    def dense_layers(self) -> int: ...

    @property
    def expert_parallel(self) -> int: ...

    @property
    def expert_tensor_parallel(self) -> int: ...

    @property
    def expert_imbalance(self) -> float: ...

    @property
    def node_limit(self) -> int | None: ...

    @property
    def router(self) -> str: ...

    @property
    def attention_kind(self) -> str: ...

    @property
    def q_lora_rank(self) -> int | None: ...

    @property
    def kv_lora_rank(self) -> int: ...

    @property
    def qk_rope_head_dim(self) -> int: ...

    @property
    def qk_nope_head_dim(self) -> int: ...

    @property
    def v_head_dim(self) -> int: ...

    @property
    def qk_norm(self) -> bool: ...

    @property
    def mtp_layers(self) -> int: ...

    @property
    def d_ff(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def expert_width(self) -> int: ...

    @property
    def norm_parameters(self) -> int: ...


class BlockParameters(NamedTuple):
    """One block's parameters: those split over the tensor-parallel ranks, those every rank keeps whole, and the
    routed experts' (split over ``expert_parallel x expert_tensor_parallel`` ranks)."""

    split: int
    whole: int
    experts: int

    @property
    def total(self) -> int:
        return self.split + self.whole + self.experts


def _positive(cfg: DecoderConfig, name: str, minimum: int) -> int:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_moe(cfg: DecoderConfig) -> None:
    """Refuse a config whose experts, expert parallelism or latent attention do not fit together (one line each).

    Raises:
        ValueError: which option, and why.
    """
    for name in ("experts", "experts_per_token", "shared_experts", "dense_layers", "mtp_layers"):
        _positive(cfg, name, 0)
    ep, etp = _positive(cfg, "expert_parallel", 1), _positive(cfg, "expert_tensor_parallel", 1)
    e, k = cfg.experts, cfg.experts_per_token
    if cfg.router not in ROUTERS:
        raise ValueError(f"router must be 'softmax' or 'sigmoid', got {cfg.router!r}")
    if not isinstance(cfg.expert_imbalance, int | float) or not cfg.expert_imbalance >= 1.0:
        raise ValueError(f"expert imbalance must be >= 1 (1.0: perfectly balanced routing), got "
                         f"{cfg.expert_imbalance!r}")
    if e == 0:
        moe_only = {"experts_per_token": k, "shared_experts": cfg.shared_experts, "dense_layers": cfg.dense_layers,
                    "expert_parallel": ep - 1, "expert_tensor_parallel": etp - 1,
                    "node_limit": cfg.node_limit or 0, "expert_ffn": cfg.expert_ffn or 0}
        given = [name for name, value in moe_only.items() if value]
        if given:
            raise ValueError(f"{', '.join(given)} need routed experts (experts >= 1)")
    else:
        if not 1 <= k <= e:
            raise ValueError(f"experts per token k={k} must be 1 to the {e} experts")
        if cfg.mlp != "swiglu":
            raise ValueError(f"the experts are SwiGLU MLPs, as every published MoE here; mlp must be 'swiglu', "
                             f"got {cfg.mlp!r}")
        if cfg.expert_ffn is not None:
            _positive(cfg, "expert_ffn", 1)
        if e % ep:
            raise ValueError(f"expert parallel {ep} does not divide the {e} experts")
        if etp not in (1, cfg.tensor_parallel):
            raise ValueError(f"expert tensor parallel {etp} must be 1 or the tensor-parallel degree "
                             f"{cfg.tensor_parallel} (one tensor-parallel group per count)")
        if cfg.expert_width % etp:
            raise ValueError(f"expert tensor parallel {etp} does not divide the experts' width {cfg.expert_width}")
        if (cfg.shared_experts * cfg.expert_width) % cfg.tensor_parallel:
            raise ValueError(f"tensor parallel {cfg.tensor_parallel} does not divide the shared experts' width "
                             f"{cfg.shared_experts * cfg.expert_width}")
        if cfg.dense_layers > cfg.n_layer:
            raise ValueError(f"dense_layers={cfg.dense_layers} is more than the {cfg.n_layer} blocks")
        if cfg.node_limit is not None:
            _positive(cfg, "node_limit", 1)
    if cfg.attention_kind not in ATTENTION_KINDS:
        raise ValueError(f"attention_kind must be 'standard' or 'mla', got {cfg.attention_kind!r}")
    if cfg.attention_kind == "mla":
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            _positive(cfg, name, 1)
        if _positive(cfg, "qk_rope_head_dim", 2) % 2:
            raise ValueError(f"qk_rope_head_dim={cfg.qk_rope_head_dim} is odd; RoPE needs an even width")
        if cfg.q_lora_rank is not None:
            _positive(cfg, "q_lora_rank", 1)
        if cfg.n_kv_head is not None or cfg.qk_norm or cfg.position != "rope":
            raise ValueError("MLA has its own keys and values (no kv-heads, no qk-norm) and decoupled RoPE "
                             "(position='rope')")


def is_moe_block(cfg: DecoderConfig, index: int) -> bool:
    """Whether block ``index`` (from 0; an MTP module's block is ``n_layer`` on) has experts."""
    return cfg.experts > 0 and index >= cfg.dense_layers


def attention_parameters(cfg: DecoderConfig) -> tuple[int, int]:
    """The attention's parameters split over the tensor-parallel ranks and kept whole on each.

    Standard: q and o ``C·A·d`` each, k and v ``C·K·d`` each (with biases, the column-parallel ones split and o's
    whole), and with qk-norm two gains of ``d``. MLA (Note [multi-head latent attention] in
    :mod:`sim.planning.counting.models.mla`): the down-projections and their norms whole, the up-projections and o
    split by heads.
    """
    c, a = cfg.d_model, cfg.n_head
    if cfg.attention_kind == "mla":
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        kv_down = c * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank  # and its norm's gain
        kv_up = cfg.kv_lora_rank * a * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        out = a * cfg.v_head_dim * c
        if cfg.q_lora_rank is None:
            return c * a * qk + kv_up + out, kv_down
        q_down = c * cfg.q_lora_rank + cfg.q_lora_rank
        return cfg.q_lora_rank * a * qk + kv_up + out, q_down + kv_down
    q, kv = a * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    split = 2 * c * q + 2 * c * kv + (q + 2 * kv if cfg.bias else 0)
    return split, c * cfg.bias + (2 * cfg.head_dim if cfg.qk_norm else 0)


def _mlp(cfg: DecoderConfig, width: int) -> tuple[int, int]:
    """A dense MLP of ``width``: its matrices and column-parallel biases split, its row-parallel bias whole."""
    gated = cfg.mlp == "swiglu"
    split = (3 if gated else 2) * cfg.d_model * width + ((2 if gated else 1) * width if cfg.bias else 0)
    return split, cfg.d_model * cfg.bias


def block_parameters(cfg: DecoderConfig, moe: bool) -> BlockParameters:
    """One block's parameters (Note [mixture of experts]): attention, two norms, and a dense MLP of width ``ffn``
    or, where ``moe``, the router (whole), the shared experts (one SwiGLU MLP, split) and the routed experts."""
    attn_split, attn_whole = attention_parameters(cfg)
    norms = 2 * cfg.norm_parameters
    if not moe:
        split, whole = _mlp(cfg, cfg.d_ff)
        return BlockParameters(attn_split + split, attn_whole + whole + norms, 0)
    c, f = cfg.d_model, cfg.expert_width
    shared = 3 * c * cfg.shared_experts * f
    return BlockParameters(attn_split + shared, attn_whole + norms + cfg.experts * c, cfg.experts * 3 * c * f)


def mtp_parameters(cfg: DecoderConfig) -> BlockParameters:
    """One MTP module's parameters besides its block (Note [multi-token prediction]): the two input norms and the
    head's, and the projection ``2C -> C``, all whole."""
    return BlockParameters(0, 3 * cfg.norm_parameters + 2 * cfg.d_model * cfg.d_model, 0)
