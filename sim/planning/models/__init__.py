"""Built-in models as real ``nn.Sequential`` modules, and a registry that names them.

Specs::

    gpt:1.3b          a GPT-3 size (125m, 350m, 760m, 1.3b, 2.7b, 6.7b, 13b, 175b)
    gpt:layers=L,hidden=H,heads=A,seq=S,vocab=V[,ffn=F]
                      a GPT of that shape (F, the MLP's inner width, is 4H unless given)
    llama:8b          a Llama 3 size (8b, 70b, 405b), at 8192 tokens
    llama:layers=L,hidden=H,heads=A,kv-heads=K,ffn=F,seq=S,vocab=V
                      a Llama-style decoder of that shape (K key/value heads shared by A query heads)

    options, after a size or among a shape's keys (gpt:175b,attention=math; llama:70b,kernels=eager), each
    defaulting to what Megatron-Core runs today (Note [spec defaults]):
    attention=flash   the default: FlashAttention, one kernel each way that keeps no s x s tensor (Note [flash
                      attention] in sim.planning.models.gpt); attention=math writes it out (QK^T, softmax, @V)
    kernels=megatron  the default: the fused kernels (gpt: Megatron-LM's, Note [Megatron's kernels] in
                      sim.planning.models.gpt; llama: Megatron-Core's and TransformerEngine's RMSNorm, SwiGLU and
                      RoPE, Note [fused kernels] in sim.planning.models.llama); kernels=eager runs every operator
                      as its own kernel, as PyTorch's eager mode does
    resnet101         ResNet-101 in torchgpipe's 370-layer flattening
    unet:B,C          U-Net (B, C): B convolutions per block, C channels at the top (unet = unet:5,64)
    amoebanet:L,D     AmoebaNet-D (L, D): L normal cells, D filters (amoebanet = amoebanet:18,256)

Each size has a cap far above the family's largest published model (up to 2,048 decoder blocks, U-Net B 64,
AmoebaNet-D L 96; Note [size caps] in :mod:`sim.planning.models.limits`): past it a spec is refused when it is read.

:func:`get_model` returns a :class:`ModelSpec`, which builds the module (on the meta device by
default, so a 175B model costs nothing) and a sample input of any batch size; for the decoders,
:meth:`ModelSpec.tensor_parallel` names one rank's shard of a tensor-parallel split, with sequence parallelism or
without.

Note [spec defaults]: a spec's options default to the kernels frameworks run today, FlashAttention and the fused
kernels (``attention=flash``, ``kernels=megatron``), so ``gpt:175b`` plans what a practitioner trains; the
default is left out of a canonical name, and the other value is written out (``gpt:175b,kernels=eager,attention=math``
is the model Korthikanti et al. (2022) count). The configs' own fields default to the math form, every operator
its own kernel: the module as PyTorch writes it, the reference each kernel's gradients are checked against.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

import torch
from torch import nn

from sim.planning.counts import AttentionCore, ModelProfile
from sim.planning.flops import count_layers
from sim.planning.models.amoebanet import amoebanet, amoebanet_sample, check_amoebanet
from sim.planning.models.gpt import CONFIGS, GPTConfig, decoder_blocks, gpt, gpt_config, gpt_sample
from sim.planning.models.llama import CONFIGS as LLAMA_CONFIGS
from sim.planning.models.llama import LlamaConfig, llama, llama_config, llama_sample
from sim.planning.models.resnet import resnet101, resnet_sample
from sim.planning.models.unet import check_unet, unet, unet_sample

__all__ = ["KNOWN", "ModelSpec", "get_model"]

_C = TypeVar("_C")

#: The spec forms :func:`get_model` understands, for messages and ``--help``.
KNOWN = ("gpt:" + "|".join(CONFIGS) + "[,kernels=megatron|eager][,attention=flash|math]",
         "gpt:layers=L,hidden=H,heads=A,seq=S,vocab=V[,ffn=F][,kernels=megatron|eager][,attention=flash|math]",
         "llama:" + "|".join(LLAMA_CONFIGS) + "[,kernels=megatron|eager][,attention=flash|math]",
         "llama:layers=L,hidden=H,heads=A,kv-heads=K,ffn=F,seq=S,vocab=V[,kernels=megatron|eager][,attention=flash|math]",
         "resnet101", "unet:B,C", "amoebanet:L,D")

# The keys of a shape spec, in their canonical order, each with the config field it sets.
_GPT_KEYS = {"layers": "n_layer", "hidden": "d_model", "heads": "n_head", "ffn": "ffn", "seq": "seq_len",
             "vocab": "vocab_size", "kernels": "kernels", "attention": "attention"}
# The keys whose value is a word, with the words each takes (the first is the default, left out of a canonical name;
# Note [spec defaults]); the options, which a size takes after it too.
_WORDS = {"kernels": ("megatron", "eager"), "attention": ("flash", "math")}
_LLAMA_KEYS = {"layers": "n_layer", "hidden": "d_model", "heads": "n_head", "kv-heads": "n_kv_head", "ffn": "ffn",
               "seq": "seq_len", "vocab": "vocab_size", "kernels": "kernels", "attention": "attention"}


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
            selective recompute (:mod:`sim.planning.recompute`); ``None``: none (a fused attention, not a decoder).
        identical: groups of layer indices the builder makes as the same computation (a decoder's blocks), for a
            count to reuse (Note [identical layers] in :mod:`sim.planning.flops`); empty: none known.
    """

    name: str
    description: str
    builder: Callable[[], nn.Sequential]
    sampler: Callable[[int, str], torch.Tensor]
    shard: Callable[[int, bool], ModelSpec] | None = None
    attention_core: Callable[[int], AttentionCore] | None = None
    identical: tuple[Collection[int], ...] = ()

    def tensor_parallel(self, t: int, sequence_parallel: bool = False) -> ModelSpec:
        """The spec of one rank's shard over ``t`` ranks (itself for ``t = 1``); cheap: nothing is built.

        ``sequence_parallel``: the tokens between the tensor-parallel regions split over the ranks too (Korthikanti
        et al., 2022; Note [sequence parallel] in :mod:`sim.planning.models.gpt`); the description says so.

        Raises:
            ValueError: the model has no tensor-parallel split, or ``t`` does not divide its heads (or with sequence
                parallelism its tokens; the message says which).
        """
        if t == 1:
            return self
        if self.shard is None:
            raise ValueError(f"model {self.name} has no tensor-parallel split (gpt and llama have)")
        try:
            return self.shard(t, sequence_parallel)
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
        """The model counted on meta in ``dtype`` (:func:`sim.planning.flops.count_layers`), with its attention core
        where it has one (for selective recompute, :mod:`sim.planning.recompute`)."""
        profile = count_layers(self.module("meta"), self.sample(2, "meta"), dtype=dtype, identical=self.identical)
        core = self.attention_core
        return profile if core is None else replace(profile, attention_core=core(dtype.itemsize))


def _ints(spec: str, arg: str, names: tuple[str, str]) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in arg.split(","))
    except ValueError:
        raise KeyError(f"model {spec!r}: expected two integers {names[0]},{names[1]} after ':'") from None
    return a, b


def _shape(spec: str, arg: str, keys: dict[str, str], optional: tuple[str, ...] = ()) -> dict[str, int | str]:
    """``key=value`` pairs after the ':' as config fields; every key of ``keys`` but ``optional`` is required. A key
    of :data:`_WORDS` takes one of its words, its default where not given (Note [spec defaults]); every other key an
    integer >= 1."""
    given: dict[str, int | str] = {}
    for item in arg.split(",") if arg else ():
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key:
            raise KeyError(f"model {spec!r}: expected key=value pairs, got {item.strip()!r}")
        if key not in keys:
            raise KeyError(f"model {spec!r}: unknown key {key!r}; keys: {', '.join(keys)}")
        if key in given:
            raise KeyError(f"model {spec!r}: {key} given twice")
        if key in _WORDS:
            if value not in _WORDS[key]:
                raise KeyError(f"model {spec!r}: {key}={value!r} is not one of {', '.join(_WORDS[key])}")
            given[key] = value
            continue
        try:
            number = int(value)
        except ValueError:
            raise KeyError(f"model {spec!r}: {key}={value!r} is not an integer") from None
        if number < 1:
            raise ValueError(f"model {spec!r}: {key} must be >= 1, got {number}")
        given[key] = number
    required = [k for k in keys if k not in optional]
    missing = [k for k in required if k not in given]
    if missing:
        raise KeyError(f"model {spec!r}: missing {', '.join(missing)} (needs {', '.join(required)})")
    defaults = {k: words[0] for k, words in _WORDS.items() if k in keys and k not in given}
    return {keys[k]: v for k, v in (given | defaults).items()}


def _canonical(family: str, cfg: object, keys: dict[str, str], skip: tuple[str, ...] = ()) -> str:
    """The spec that builds ``cfg`` again: every key in canonical order, less ``skip`` and words at their default."""
    return f"{family}:" + ",".join(f"{k}={getattr(cfg, f)}" for k, f in keys.items()
                                   if k not in skip and getattr(cfg, f) != _WORDS.get(k, (None,))[0])


def _options(keys: dict[str, str]) -> dict[str, str]:
    """Of a family's ``keys``, the options (:data:`_WORDS`) a size takes after it."""
    return {k: f for k, f in keys.items() if k in _WORDS}


def _size(arg: str) -> tuple[str, str] | None:
    """A size and the options after it (``"70b"``, ``"attention=flash"``); ``None`` for a shape spec."""
    size, _, options = arg.partition(",")
    return None if "=" in size else (size.strip(), options)


def _size_options(spec: str, options: str, keys: dict[str, str]) -> dict[str, int | str]:
    """The options after a size as config fields (:func:`_shape` of the family's options).

    Raises:
        KeyError: a key that is not an option (a shape's key: a shape is given whole, every key).
    """
    allowed = _options(keys)
    for item in options.split(",") if options else ():
        key = item.partition("=")[0].strip()
        if key not in allowed:
            raise KeyError(f"model {spec!r}: a size takes only {', '.join(allowed)} after it, not {key!r}; for "
                           f"another shape, expected key=value pairs for every key ({', '.join(keys)})")
    return _shape(spec, options, allowed, optional=tuple(_WORDS))


def _sized_name(family: str, size: str, cfg: object, keys: dict[str, str]) -> str:
    """The canonical name of a size with options: the size, then the options not at their default in canonical
    order."""
    words = [f"{k}={getattr(cfg, f)}" for k, f in _options(keys).items() if getattr(cfg, f) != _WORDS[k][0]]
    return ",".join([f"{family}:{size}", *words])


def _config(spec: str, kind: Callable[..., _C], fields: dict[str, int | str]) -> _C:
    """``kind(**fields)``, its refusal prefixed with the spec."""
    try:
        return kind(**fields)
    except ValueError as exc:
        raise ValueError(f"model {spec!r}: {exc}") from None


def _gpt(spec: str, arg: str) -> ModelSpec:
    sized = _size(arg)
    if sized is None:
        cfg = _config(spec, GPTConfig, _shape(spec, arg, _GPT_KEYS, optional=("ffn", *_WORDS)))
        name = _canonical("gpt", cfg, _GPT_KEYS, skip=("ffn",) if cfg.d_ff == 4 * cfg.d_model else ())
        title = "GPT"
    else:
        key = sized[0] or "125m"
        options = _size_options(spec, sized[1], _GPT_KEYS)
        cfg = _config(spec, partial(replace, gpt_config(key)), options)
        name = _sized_name("gpt", key, cfg, _GPT_KEYS)
        title = f"GPT-3 {key.upper()}"
    return _gpt_spec(name, title, cfg)


def _shard(t: int, sequence_parallel: bool) -> str:
    """What a description adds for one rank's shard."""
    if t == 1:
        return ""
    return f", tensor-parallel shard of {t}" + (", sequence parallel" if sequence_parallel else "")


def _gpt_spec(name: str, title: str, cfg: GPTConfig) -> ModelSpec:
    shard = _shard(cfg.tensor_parallel, cfg.sequence_parallel)
    kernels = _flash(cfg.attention) + (", Megatron-LM's fused kernels" if cfg.kernels == "megatron" else "")
    return ModelSpec(name, f"{title} ({cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, "
                     f"MLP {cfg.d_ff}, {cfg.seq_len} tokens{kernels}{shard})", lambda: gpt(cfg),
                     lambda b, d: gpt_sample(cfg, b, d),
                     lambda t, sp: _gpt_spec(name, title, replace(cfg, tensor_parallel=t, sequence_parallel=sp)),
                     _core(cfg.n_head // cfg.tensor_parallel, cfg.seq_len, cfg.dropout > 0)
                     if cfg.attention == "math" else None, (decoder_blocks(cfg.n_layer),))


def _llama(spec: str, arg: str) -> ModelSpec:
    sized = _size(arg)
    if sized is None:
        cfg = _config(spec, LlamaConfig, _shape(spec, arg, _LLAMA_KEYS, optional=tuple(_WORDS)))
        name, title = _canonical("llama", cfg, _LLAMA_KEYS), "Llama-style decoder"
    else:
        key = sized[0] or "8b"
        options = _size_options(spec, sized[1], _LLAMA_KEYS)
        cfg = _config(spec, partial(replace, llama_config(key)), options)
        name = _sized_name("llama", key, cfg, _LLAMA_KEYS)
        title = f"Llama 3 {key.upper()}"
    return _llama_spec(name, title, cfg)


def _flash(attention: str) -> str:
    """What a description adds for the attention."""
    return ", FlashAttention" if attention == "flash" else ""


def _llama_spec(name: str, title: str, cfg: LlamaConfig) -> ModelSpec:
    shard = _shard(cfg.tensor_parallel, cfg.sequence_parallel)
    kernels = _flash(cfg.attention) + (", fused kernels (Megatron-Core)" if cfg.kernels == "megatron" else "")
    return ModelSpec(name, f"{title} ({cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, "
                     f"{cfg.n_kv_head} KV heads, MLP {cfg.ffn}, {cfg.seq_len} tokens{kernels}{shard})",
                     lambda: llama(cfg), lambda b, d: llama_sample(cfg, b, d),
                     lambda t, sp: _llama_spec(name, title, replace(cfg, tensor_parallel=t, sequence_parallel=sp)),
                     _core(cfg.n_head // cfg.tensor_parallel, cfg.seq_len, False) if cfg.attention == "math" else None,
                     (decoder_blocks(cfg.n_layer),))


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
    if family == "gpt":
        return _gpt(spec, arg)
    if family == "llama":
        return _llama(spec, arg)
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
