"""One decoder for every family: the config of its shape and options, and its parameter counts (the builder and its
layers: :mod:`sim.planning.counting.models.decoder_layers`).

Layers (pre-norm, as GPT-2, GPT-3, Llama and Nemotron-4; the modules:
:mod:`sim.planning.counting.models.decoder_layers`)::

    Embedding     token ids (B, T) -> (B, T, C): the tokens, plus a learned position embedding where
                  position="learned" (with rope, RoPE rotates q and k instead)
    Block x L     x + Attention(Norm(x)), then x + MLP(Norm(x))
    Head          Norm, then a linear layer to the vocabulary: (B, T, C) -> (B, T, V)

``gpt``, ``llama`` and ``nemotron`` (:mod:`~sim.planning.counting.models.gpt`,
:mod:`~sim.planning.counting.models.llama`, :mod:`~sim.planning.counting.models.nemotron`) are presets of it: a config
with the family's defaults and its published sizes.

Note [decoder options]: each option is one architectural choice, the same for every family::

    n_head, n_kv_head  A query heads share K key/value heads: MHA (K = A, None's meaning), GQA, MQA (K = 1)
    mlp                gelu: fc C -> F, GELU, proj F -> C (GPT); relu2: the same with relu(x)² (So et al., 2021,
                       "Primer"; Nemotron-4); swiglu: down(silu(gate(x)) * up(x)), three matrices (Llama)
    norm               layernorm (a gain and a bias, whatever ``bias`` says, as TransformerEngine's) or rmsnorm
    bias               biases on every linear layer but the head (GPT), or none (Llama, Nemotron-4)
    tied               the head's weight is the token embedding's (Note [tied embeddings])
    position           learned: a position embedding added to the tokens (GPT); rope: q and k rotated (RoFormer)
    qkv                fused: one GEMM C -> (A + 2K)·d (GPT-2's c_attn, Megatron-Core's linear_qkv); split: three
                       (Llama's wq, wk, wv). The FLOPs are the same; the GEMMs' shapes and the bytes read differ.
    head_width, qk_norm  heads wider than C/A, and an RMSNorm over each head of q and k (Qwen3)
    attention_kind     standard, or mla: DeepSeek's multi-head latent attention (Note [multi-head latent attention]
                       in :mod:`sim.planning.counting.models.mla`)
    experts, ...       a mixture of experts in the blocks from ``dense_layers`` on, and MTP modules after the last
                       (Note [mixture of experts], Note [multi-token prediction] in
                       :mod:`sim.planning.counting.models.moe_config`)

Note [tied embeddings]: ``tied=True`` makes the head's weight the token embedding's Parameter, so the model has
``V·C`` fewer parameters (GPT-3's paper counts its sizes so). A pipeline keeps the embedding and the head on
different stages; the counter counts a shared parameter at its first layer only (:mod:`sim.planning.counting.counts`),
so the last stage's copy of the weight, and the all-reduce that keeps the two equal, are not in the plan.

Note [tensor parallel]: ``tensor_parallel=t`` builds one rank's shard of Megatron-LM's split (Shoeybi et al.,
2019): A/t query heads and K/t key/value heads (the QKV projection column-parallel, the output projection
row-parallel), the MLP's first matrices by columns (C -> F/t) and its last by rows (F/t -> C), the vocabulary of
the token embedding and the head by rows (ceil(V/t) each: Megatron pads the vocabulary so every rank holds as many).
Norms, position embeddings and the row-parallel layers' biases are replicated. ``t`` must divide the heads, the
key/value heads (as Megatron-LM requires of its query groups, so every rank keeps whole groups and no KV head is
replicated) and F. The collectives are :mod:`sim.planning.counting.tensor_parallel`'s markers: g after the output
projection and after the MLP, f before the QKV projection and before the MLP, g after the embedding, f before the head.

Note [sequence parallel]: ``sequence_parallel=True`` adds Korthikanti et al.'s (2022) sequence parallelism: between
the tensor-parallel regions each rank holds ``s/t`` of the tokens, so the norms, dropouts and residual adds run on
``(B, T/t, C)``; f becomes an all-gather of the tokens, g a reduce-scatter, and a column-parallel GEMM keeps this
rank's tokens for its weight gradient, gathering them again in the backward. The embedding reduce-scatters its
lookups; with learned positions it all-reduces them, adds the positions and keeps this rank's tokens (Megatron-LM's
order). The head gathers the tokens before its GEMM. ``t`` must divide the tokens ``s`` too.

References: Brown et al. (2020), "Language Models are Few-Shot Learners"; Dubey et al. (2024), "The Llama 3 Herd of
Models"; Parmar et al. (2024), "Nemotron-4 15B Technical Report"; Shoeybi et al. (2019), "Megatron-LM"; Korthikanti
et al. (2022), "Reducing Activation Recomputation in Large Transformer Models"; Ainslie et al. (2023), "GQA"; Su et
al. (2021), "RoFormer"; Karpathy's minGPT.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from sim.planning.counting.models.limits import check_decoder_size
from sim.planning.counting.models.moe_config import (
    BlockParameters,
    block_parameters,
    check_moe,
    is_moe_block,
    mtp_parameters,
)

__all__ = ["ATTENTIONS", "KERNELS", "MLPS", "NORMS", "POSITIONS", "QKVS", "DecoderConfig", "check_sequence_parallel",
           "preset"]

C = TypeVar("C")

#: The attention forms a decoder runs: the math form, PyTorch's fused one, FlashAttention (Note [attention] in
#: :mod:`sim.planning.counting.models.decoder_layers`).
ATTENTIONS = ("math", "sdpa", "flash")
#: Every operator its own kernel, or Megatron's fused kernels (Note [fused kernels] in
#: :mod:`sim.planning.counting.models.decoder_layers`).
KERNELS = ("eager", "megatron")
#: The MLPs, norms, position encodings and QKV projections of Note [decoder options].
MLPS = ("gelu", "swiglu", "relu2")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
QKVS = ("fused", "split")


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


def _word(name: str, value: object, known: tuple[str, ...]) -> None:
    if value not in known:
        raise ValueError(f"{name} must be {', '.join(repr(k) for k in known[:-1])} or {known[-1]!r}, got {value!r}")


@dataclass(frozen=True)
class DecoderConfig:
    """Shape and options of a decoder (Note [decoder options]); the defaults are GPT-3 125M's (GPT-2 small).

    Attributes:
        n_layer: decoder blocks (L).
        n_head: query heads (A); ``d_model`` must divide by it.
        d_model: hidden size (C).
        seq_len: context length in tokens; 2048 as in GPT-3.
        vocab_size: 50257, GPT-2's byte-level BPE that GPT-3 kept.
        ffn: the MLP's inner width (F); ``None`` for ``4 * d_model``, GPT-3's at every size.
        n_kv_head: key/value heads (K), dividing ``n_head``; ``None`` for ``n_head`` (multi-head attention).
        mlp: ``"gelu"``, ``"swiglu"`` or ``"relu2"`` (squared ReLU).
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        bias: biases on the linear layers (not the head's).
        tied: the head shares the token embedding's weight (Note [tied embeddings]).
        position: ``"learned"`` position embeddings or ``"rope"``; RoPE needs heads of an even width.
        qkv: ``"fused"``, one QKV projection, or ``"split"``, three (Note [decoder options]).
        dropout: 0.1 as in GPT-2; the dropout masks are part of what training keeps.
        rope_theta: RoPE's base frequency; 10000 as in RoFormer.
        norm_eps: the norms' epsilon; 1e-5, PyTorch's LayerNorm's.
        attention: ``"math"``, ``"sdpa"`` or ``"flash"`` (Note [attention] in
            :mod:`sim.planning.counting.models.decoder_layers`).
        kernels: ``"eager"``, every operator its own kernel, or ``"megatron"``, the fused kernels of Megatron-LM,
            Megatron-Core and TransformerEngine (Note [fused kernels] there).
        tensor_parallel: ranks a layer is split over; the model built is one rank's shard (Note [tensor parallel]).
        sequence_parallel: split the tokens between the tensor-parallel regions over the ranks too (Note [sequence
            parallel]); needs ``tensor_parallel > 1``.
        head_width: each head's width where it is not ``d_model / n_head`` (Qwen3: 64 heads of 128 on 4096);
            ``None``: ``d_model / n_head``.
        qk_norm: an RMSNorm over each head of q and of k before RoPE (Qwen3).
        experts: routed experts per MoE block (E); 0: a dense decoder (Note [mixture of experts] in
            :mod:`sim.planning.counting.models.moe_config`).
        experts_per_token: the experts each token is routed to (k), 1 to E.
        shared_experts: experts every token goes through, as one dense SwiGLU MLP of that many times ``expert_ffn``.
        expert_ffn: each expert's inner width; ``None``: ``ffn``.
        dense_layers: the first blocks keep the dense MLP of width ``ffn``.
        router: the router's scores: ``"softmax"`` over the experts (Mixtral, Qwen3, DeepSeek-V2) or ``"sigmoid"``,
            normalised over the k chosen (DeepSeek-V3).
        node_limit: DeepSeek's node-limited routing, each token's experts on at most this many nodes; ``None``: none.
        expert_parallel: the counted shard is one rank of an expert-parallel group of this many ranks (ep): E/ep
            experts, fed the tokens routed to them from the ep ranks (Note [all-to-all] in
            :mod:`sim.planning.counting.expert_parallel`).
        expert_tensor_parallel: each expert's FFN split over this many ranks (Megatron's column and row split);
            1 or ``tensor_parallel``.
        expert_imbalance: the counted rank is the busiest of its group: it receives this many times the balanced
            share of the routed tokens; >= 1, 1.0 for perfectly balanced routing.
        attention_kind: ``"standard"`` (A query heads over K key/value heads) or ``"mla"``, DeepSeek's multi-head
            latent attention (Note [multi-head latent attention] in :mod:`sim.planning.counting.models.mla`).
        q_lora_rank: MLA's query compression; ``None``: q projected from the hidden state directly.
        kv_lora_rank: MLA's key/value latent width.
        qk_rope_head_dim: MLA's decoupled RoPE width of each query head and of the one shared key.
        qk_nope_head_dim: MLA's width of each head's query and key without RoPE.
        v_head_dim: MLA's width of each value head.
        mtp_layers: DeepSeek-V3's multi-token prediction modules after the last block, each one block more
            (Note [multi-token prediction] in :mod:`sim.planning.counting.models.moe_config`).
    """

    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    seq_len: int = 2048
    vocab_size: int = 50257
    ffn: int | None = None
    n_kv_head: int | None = None
    mlp: Literal["gelu", "swiglu", "relu2"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    bias: bool = True
    tied: bool = False
    position: Literal["learned", "rope"] = "learned"
    qkv: Literal["fused", "split"] = "fused"
    dropout: float = 0.1
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    attention: Literal["math", "sdpa", "flash"] = "math"
    kernels: Literal["eager", "megatron"] = "eager"
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    head_width: int | None = None
    qk_norm: bool = False
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_ffn: int | None = None
    dense_layers: int = 0
    router: Literal["softmax", "sigmoid"] = "softmax"
    node_limit: int | None = None
    expert_parallel: int = 1
    expert_tensor_parallel: int = 1
    expert_imbalance: float = 1.0
    attention_kind: Literal["standard", "mla"] = "standard"
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        kind = type(self).__name__
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "ffn", "n_kv_head", "head_width"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{kind}.{name} must be >= 1, got {value}")
        if self.head_width is None and self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} does not divide into n_head={self.n_head} heads")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head={self.n_head} does not divide into n_kv_head={self.kv_heads} groups "
                             f"(kv-heads must divide heads)")
        for name, known in (("mlp", MLPS), ("norm", NORMS), ("position", POSITIONS), ("qkv", QKVS),
                            ("attention", ATTENTIONS), ("kernels", KERNELS)):
            _word(name, getattr(self, name), known)
        for name in ("bias", "tied", "sequence_parallel", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.position == "rope" and self.attention_kind == "standard" and self.head_dim % 2:
            raise ValueError(f"heads of width {self.head_dim} are odd; RoPE needs an even width")
        t = self.tensor_parallel
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"tensor_parallel must be an integer >= 1, got {t!r}")
        if self.n_head % t:
            raise ValueError(f"tensor parallel {t} does not divide the {self.n_head} attention heads")
        if self.kv_heads % t:
            raise ValueError(f"tensor parallel {t} does not divide the {self.kv_heads} key/value heads "
                             f"(each rank keeps whole groups of query heads)")
        if (self.experts == 0 or self.dense_layers) and self.d_ff % t:
            raise ValueError(f"tensor parallel {t} does not divide the MLP's width {self.d_ff}")
        check_sequence_parallel(self.sequence_parallel, t, self.seq_len)
        check_moe(self)
        check_decoder_size(self.n_layer + self.mtp_layers, self.d_model, max(self.d_ff, self.expert_width),
                           self.seq_len, self.vocab_size, self.n_head, self.parameters, self.experts)

    @property
    def d_ff(self) -> int:
        """The MLP's inner width: ``ffn``, or ``4 * d_model`` where it is ``None``."""
        return 4 * self.d_model if self.ffn is None else self.ffn

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head``, or ``n_head`` where it is ``None``."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        """Width of one head: ``head_width``, or d = C / A where it is ``None``."""
        return self.d_model // self.n_head if self.head_width is None else self.head_width

    @property
    def expert_width(self) -> int:
        """Each expert's inner width: ``expert_ffn``, or ``ffn`` where it is ``None``."""
        return self.d_ff if self.expert_ffn is None else self.expert_ffn

    @property
    def shard_vocab(self) -> int:
        """Rows of the token embedding and of the head on one rank: ``ceil(V / t)`` (Note [tensor parallel])."""
        return -(-self.vocab_size // self.tensor_parallel)

    def _blocks(self) -> tuple[tuple[BlockParameters, int], ...]:
        """Each kind of block's parameters and how many blocks of it: the dense ones, the MoE ones, and the MTP
        modules' block and own parameters (Note [mixture of experts], Note [multi-token prediction] in
        :mod:`sim.planning.counting.models.moe_config`). Counts, not a list of every block: a size past the cap
        (:func:`~sim.planning.counting.models.limits.check_decoder_size`) is refused at once, not after a loop."""
        dense = min(self.dense_layers, self.n_layer) if self.experts else self.n_layer
        last = block_parameters(self, is_moe_block(self, self.n_layer - 1))
        return ((block_parameters(self, False), dense), (block_parameters(self, True), self.n_layer - dense),
                (last, self.mtp_layers), (mtp_parameters(self), self.mtp_layers))

    @property
    def norm_parameters(self) -> int:
        """Parameters of one norm: a gain, and a bias for LayerNorm."""
        return (2 if self.norm == "layernorm" else 1) * self.d_model

    @property
    def block_parameters(self) -> int:
        """Parameters of one block, the last one's kind (12·C² + 13·C for GPT's, with F = 4C)."""
        return block_parameters(self, is_moe_block(self, self.n_layer - 1)).total

    @property
    def parameters(self) -> int:
        """All parameters: token embedding, learned positions, blocks, final norm, the head unless tied, and the MTP
        modules'."""
        return self._total(self.vocab_size, sum(block.total * k for block, k in self._blocks()))

    @property
    def mtp_parameters(self) -> int:
        """The MTP modules' own parameters (Note [multi-token prediction]), which ``parameters`` includes."""
        return sum(block.total * k for block, k in self._blocks()[2:])

    @property
    def activated_parameters(self) -> int:
        """The parameters one token's forward reads: ``parameters`` less the ``E - k`` routed experts it skips in
        each MoE block (Note [mixture of experts])."""
        skipped = sum(block.experts * k for block, k in self._blocks()) // max(self.experts, 1)
        return self.parameters - skipped * (self.experts - self.experts_per_token)

    @property
    def shard_parameters(self) -> int:
        """Parameters of one rank's shard (Note [tensor parallel]): each block's split part over ``t``, its routed
        experts over ``ep x etp``, the rest whole; the vocabulary of the embedding and the head over ``t``."""
        t, ep = self.tensor_parallel, self.expert_parallel * self.expert_tensor_parallel
        return self._total(self.shard_vocab,
                           sum((b.split // t + b.whole + b.experts // ep) * k for b, k in self._blocks()))

    def _total(self, vocab: int, blocks: int) -> int:
        c = self.d_model
        embeddings = (1 if self.tied else 2) * vocab * c + (self.seq_len * c if self.position == "learned" else 0)
        return embeddings + blocks + self.norm_parameters


def preset(configs: Mapping[str, C], name: str, family: str) -> C:
    """The size ``name`` (case-insensitive) of a family's published ``configs``.

    Raises:
        KeyError: an unknown name; the message lists the known ones.
    """
    key = name.strip().lower()
    if key not in configs:
        raise KeyError(f"unknown {family} size {name!r}; known: {', '.join(configs)}")
    return configs[key]
