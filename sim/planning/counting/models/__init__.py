"""Built-in models as real ``nn.Sequential`` modules, and a registry that names them.

Specs::

    gpt:1.3b          a GPT-3 size (125m, 350m, 760m, 1.3b, 2.7b, 6.7b, 13b, 175b)
    gpt:layers=L,hidden=H,heads=A,seq=S,vocab=V[,ffn=F]
                      a GPT of that shape (F, the MLP's inner width, is 4H unless given)
    llama:8b          a Llama 3 size (8b, 70b, 405b), at 8192 tokens
    llama:layers=L,hidden=H,heads=A,kv-heads=K,ffn=F,seq=S,vocab=V
                      a Llama-style decoder of that shape (K key/value heads shared by A query heads)
    nemotron:15b      a Nemotron-4 size (15b, 340b), at 4096 tokens
    nemotron:layers=L,hidden=H,heads=A,kv-heads=K,ffn=F,seq=S,vocab=V
                      a Nemotron-style decoder of that shape
    deepseek:v3       DeepSeek-V3 (v3, v2), at 4096 tokens: MLA and DeepSeekMoE, V3 with its MTP module
    deepseek:layers=L,hidden=H,heads=A,ffn=F,experts=E,top-k=K,expert-ffn=FE,seq=S,vocab=V
                      a DeepSeek-style decoder of that shape (MLA's ranks and widths V3's unless given)
    mixtral:8x7b      a Mixtral size (8x7b, 8x22b), at its context (32768, 65536 tokens)
    mixtral:layers=L,hidden=H,heads=A,kv-heads=K,ffn=F,experts=E,top-k=K,seq=S,vocab=V
                      a Mixtral-style decoder of that shape (each expert F wide)
    qwen3:235b-a22b   Qwen3-235B-A22B, at 4096 tokens
    qwen3:layers=L,hidden=H,heads=A,kv-heads=K,ffn=F,experts=E,top-k=K,seq=S,vocab=V
                      a Qwen3-MoE-style decoder of that shape (each expert F wide, heads 128 wide unless head-dim=D)

    a shape of any family takes the decoder's other choices too, each defaulting to the family's (Note [decoder
    options] in sim.planning.counting.models.decoder): kv-heads=K (gpt: the heads), mlp=gelu|swiglu|relu2,
    norm=layernorm|rmsnorm, position=learned|rope, qkv=fused|split, bias=on|off, tied=on|off
    (gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000,kv-heads=2,mlp=swiglu,norm=rmsnorm,bias=off,tied=on),
    and the mixture of experts' and MLA's (Note [mixture of experts] in sim.planning.counting.models.moe_config):
    experts=E, top-k=K, shared-experts=N, expert-ffn=FE, dense-layers=n, router=softmax|sigmoid, node-limit=M,
    head-dim=D, qk-norm=on|off, attention-kind=standard|mla, q-lora=RQ, kv-lora=RKV, rope-dim=DR, nope-dim=DN,
    v-dim=DV, mtp=D

    options, after a size or among a shape's keys (gpt:175b,attention=math; llama:70b,kernels=eager), each
    defaulting to what Megatron-Core runs today (Note [spec defaults]):
    attention=flash   the default: FlashAttention, one kernel each way that keeps no s x s tensor (Note [flash
                      attention] in sim.planning.counting.models.decoder_layers); attention=math writes it out (QK^T,
                      softmax, @V)
    kernels=megatron  the default: the fused kernels of Megatron-LM, Megatron-Core and TransformerEngine (Note [fused
                      kernels] in sim.planning.counting.models.decoder_layers); kernels=eager runs every operator as its
                      own kernel, as PyTorch's eager mode does
    resnet101         ResNet-101 in torchgpipe's 370-layer flattening
    unet:B,C          U-Net (B, C): B convolutions per block, C channels at the top (unet = unet:5,64)
    amoebanet:L,D     AmoebaNet-D (L, D): L normal cells, D filters (amoebanet = amoebanet:18,256)

Each size has a cap far above the family's largest published model (up to 2,048 decoder blocks, U-Net B 64,
AmoebaNet-D L 96; Note [size caps] in :mod:`sim.planning.counting.models.limits`): past it a spec is refused when it is
read.

:func:`get_model` returns a :class:`ModelSpec`, which builds the module (on the meta device by
default, so a 175B model costs nothing) and a sample input of any batch size; for the decoders,
:meth:`ModelSpec.tensor_parallel` names one rank's shard of a tensor-parallel split, with sequence parallelism or
without, and for a mixture of experts :meth:`ModelSpec.expert_parallel` one rank's shard of its experts.

Note [spec defaults]: a spec's options default to the kernels frameworks run today, FlashAttention and the fused
kernels (``attention=flash``, ``kernels=megatron``), so ``gpt:175b`` plans what a practitioner trains; the
default is left out of a canonical name, and the other value is written out (``gpt:175b,kernels=eager,attention=math``
is the model Korthikanti et al. (2022) count). The configs' own fields default to the math form, every operator
its own kernel: the module as PyTorch writes it, the reference each kernel's gradients are checked against.
A shape's other keys are left out of its canonical name where they are the family's default.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
from torch import nn

from sim.planning.counting.counts import AttentionCore, ModelProfile
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models.amoebanet import amoebanet, amoebanet_sample, check_amoebanet
from sim.planning.counting.models.decoder import DecoderConfig
from sim.planning.counting.models.decoder_layers import decoder, decoder_groups, token_ids
from sim.planning.counting.models.decoder_specs import FAMILIES, describe, parse
from sim.planning.counting.models.decoder_specs import KNOWN as DECODERS
from sim.planning.counting.models.resnet import resnet101, resnet_sample
from sim.planning.counting.models.unet import check_unet, unet, unet_sample

__all__ = ["KNOWN", "ModelSpec", "get_model"]

_C = TypeVar("_C")

#: The spec forms :func:`get_model` understands, for messages and ``--help``.
KNOWN = (*DECODERS, "resnet101", "unet:B,C", "amoebanet:L,D")


@dataclass(frozen=True)
class ModelSpec:
    """A named model: how to build it and how to make an input for it.

    Attributes:
        name: the canonical spec (``"gpt:1.3b"``, ``"unet:5,64"``).
        description: for display.
        builder: builds the module under the current default device.
        sampler: ``(batch, device) -> input``.
        shard: ``(t, sequence_parallel) -> `` the spec of one rank's shard over ``t`` tensor-parallel ranks;
            ``None``: the model has no tensor-parallel split.
        attention_core: ``itemsize -> `` its blocks' attention core in a dtype of ``itemsize`` bytes, for
            selective recompute (:mod:`sim.planning.parallel.recompute`); ``None``: none (a fused attention, not
            a decoder).
        identical: groups of layer indices the builder makes as the same computation (a decoder's blocks), for a
            count to reuse (Note [identical layers] in :mod:`sim.planning.counting.reuse`); empty: none known.
        experts: ``(ep, etp, imbalance) -> `` the spec of one rank's shard of the experts
            (:meth:`expert_parallel`); ``None``: the model has no experts.
        config: the decoder's config; ``None``: not a decoder.
    """

    name: str
    description: str
    builder: Callable[[], nn.Sequential]
    sampler: Callable[[int, str], torch.Tensor]
    shard: Callable[[int, bool], ModelSpec] | None = None
    attention_core: Callable[[int], AttentionCore] | None = None
    identical: tuple[Collection[int], ...] = ()
    experts: Callable[[int, int, float], ModelSpec] | None = None
    config: DecoderConfig | None = None

    def tensor_parallel(self, t: int, sequence_parallel: bool = False) -> ModelSpec:
        """The spec of one rank's shard over ``t`` ranks (itself for ``t = 1``); cheap: nothing is built.

        ``sequence_parallel``: the tokens between the tensor-parallel regions split over the ranks too (Korthikanti
        et al., 2022; Note [sequence parallel] in :mod:`sim.planning.counting.models.decoder`); the description says so.

        Raises:
            ValueError: the model has no tensor-parallel split, or ``t`` does not divide its heads (or with sequence
                parallelism its tokens; the message says which).
        """
        if t == 1:
            return self
        if self.shard is None:
            raise ValueError(f"model {self.name} has no tensor-parallel split (the decoders have)")
        try:
            return self.shard(t, sequence_parallel)
        except ValueError as exc:
            raise ValueError(f"model {self.name}: {exc}") from None

    def expert_parallel(self, ep: int, etp: int = 1, imbalance: float = 1.0) -> ModelSpec:
        """The spec of one rank's shard of the experts: ``E/ep`` of them, each split over ``etp`` ranks, fed the
        busiest rank's tokens, ``imbalance`` times the balanced share (Note [routed tokens] in
        :mod:`sim.planning.counting.models.moe_layers`); composes with :meth:`tensor_parallel`. Cheap: nothing is
        built.

        Raises:
            ValueError: the model has no experts, ``ep`` does not divide them, ``etp`` does not divide their width
                or is neither 1 nor the tensor-parallel degree, or ``imbalance`` is below 1 (one line, naming the
                model).
        """
        if self.experts is None:
            raise ValueError(f"model {self.name} has no experts to split over expert-parallel ranks")
        try:
            return self.experts(ep, etp, imbalance)
        except ValueError as exc:
            raise ValueError(f"model {self.name}: {exc}") from None

    def splits_over(self, t: int) -> bool:
        """Whether :meth:`tensor_parallel` takes ``t`` ranks (its heads, key/value heads and MLP divide by ``t``)."""
        try:
            self.tensor_parallel(t)
        except ValueError:
            return False
        return True

    def module(self, device: str | torch.device = "meta", dtype: torch.dtype | None = None) -> nn.Sequential:
        """Build the model on ``device`` (meta by default: nothing is allocated), in ``dtype`` if given."""
        with torch.device(device):
            model = self.builder()
        return model.to(dtype) if dtype is not None else model

    def sample(self, batch: int, device: str | torch.device = "meta") -> torch.Tensor:
        """An input of ``batch`` samples (random on a real device, shapes only on meta)."""
        if batch < 1:
            raise ValueError(f"a batch needs at least one sample, got {batch}")
        return self.sampler(batch, str(device))

    def count(self, dtype: torch.dtype) -> ModelProfile:
        """The model counted on meta in ``dtype`` (:func:`sim.planning.counting.flops.count_layers`), with its attention
        core where it has one (for selective recompute, :mod:`sim.planning.parallel.recompute`); a decoder's profile
        says sequence parallelism as its config does (Note [routed tokens] in
        :mod:`sim.planning.counting.models.moe_layers`: the experts' tokens are gathered without it too)."""
        profile = count_layers(self.module("meta"), self.sample(2, "meta"), dtype=dtype, identical=self.identical)
        if self.config is not None:  # a mixture of experts gathers tokens without sequence parallelism too
            profile = replace(profile, sequence_parallel=self.config.sequence_parallel)
        core = self.attention_core
        return profile if core is None else replace(profile, attention_core=core(dtype.itemsize))


def _ints(spec: str, arg: str, names: tuple[str, str]) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in arg.split(","))
    except ValueError:
        raise KeyError(f"model {spec!r}: expected two integers {names[0]},{names[1]} after ':'") from None
    return a, b


def _config(spec: str, kind: Callable[..., _C], fields: dict[str, int | str]) -> _C:
    """``kind(**fields)``, its refusal prefixed with the spec."""
    try:
        return kind(**fields)
    except ValueError as exc:
        raise ValueError(f"model {spec!r}: {exc}") from None


def _decoder(name: str, title: str, family: str, cfg: DecoderConfig) -> ModelSpec:
    """The spec of the decoder ``cfg``, named ``name``; its shards keep the name (Note [tensor parallel] in
    :mod:`sim.planning.counting.models.decoder`)."""
    def shard(t: int, sp: bool) -> ModelSpec:
        return _decoder(name, title, family, replace(cfg, tensor_parallel=t, sequence_parallel=sp))

    def experts(ep: int, etp: int, imbalance: float) -> ModelSpec:
        return _decoder(name, title, family, replace(cfg, expert_parallel=ep, expert_tensor_parallel=etp,
                                                     expert_imbalance=imbalance))

    core = _core(cfg.n_head // cfg.tensor_parallel, cfg.seq_len, cfg.dropout > 0) if cfg.attention == "math" else None
    return ModelSpec(name, describe(family, title, cfg), lambda: decoder(cfg),
                     lambda b, d: token_ids(b, cfg.seq_len, cfg.vocab_size, d), shard, core, decoder_groups(cfg),
                     experts if cfg.experts else None, cfg)


def _core(heads: int, seq: int, dropout: bool) -> Callable[[int], AttentionCore]:
    """The core saves its softmax output, and with dropout the mask (one byte an element) and the dropped output."""
    return lambda itemsize: AttentionCore(heads, seq, heads * seq * seq * (itemsize + (1 + itemsize) * dropout))


def get_model(spec: str) -> ModelSpec:
    """Parse a model spec (see the module docstring) into a :class:`ModelSpec`.

    Raises:
        KeyError: an unknown model or size, or a shape spec with an unknown, missing or non-integer key;
            the message says which, or lists the known specs.
        ValueError: known model, invalid sizes (e.g. ``unet:0,64``, ``gpt:...,hidden=100,heads=3``).
    """
    text = spec.strip().lower()
    family, _, arg = text.partition(":")
    if family in FAMILIES:
        name, title, cfg = parse(spec, family, arg)
        return _decoder(name, title, family, cfg)
    if family in ("resnet101", "resnet") and arg in ("", "101"):
        return ModelSpec("resnet101", "ResNet-101, 370 layers (torchgpipe's flattening), 224x224 images",
                         resnet101, lambda b, d: resnet_sample(b, 224, d))
    if family == "unet":
        blocks, channels = _ints(spec, arg, ("B", "C")) if arg else (5, 64)
        _config(spec, check_unet, {"blocks": blocks, "channels": channels})
        return ModelSpec(f"unet:{blocks},{channels}", f"U-Net ({blocks}, {channels}), 192x192 images",
                         lambda: unet(blocks, channels), lambda b, d: unet_sample(b, 192, d))
    if family == "amoebanet":
        layers, filters = _ints(spec, arg, ("L", "D")) if arg else (18, 256)
        _config(spec, check_amoebanet, {"layers": layers, "filters": filters})
        return ModelSpec(f"amoebanet:{layers},{filters}", f"AmoebaNet-D ({layers}, {filters}), 224x224 images",
                         lambda: amoebanet(layers, filters), lambda b, d: amoebanet_sample(b, 224, d))
    raise KeyError(f"unknown model {spec!r}; known: {', '.join(KNOWN)}")
