"""The decoder families' specs (``gpt:175b``, ``llama:layers=...,kv-heads=8``): parsed into a config, a canonical
name and a description (the grammar: :mod:`sim.planning.counting.models`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial

from sim.planning.counting.models.decoder import MLPS, NORMS, POSITIONS, QKVS, DecoderConfig, preset
from sim.planning.counting.models.deepseek import CONFIGS as DEEPSEEK_CONFIGS
from sim.planning.counting.models.deepseek import DeepSeekConfig
from sim.planning.counting.models.gpt import CONFIGS as GPT_CONFIGS
from sim.planning.counting.models.gpt import GPTConfig, gpt_config
from sim.planning.counting.models.llama import CONFIGS as LLAMA_CONFIGS
from sim.planning.counting.models.llama import LlamaConfig, llama_config
from sim.planning.counting.models.mixtral import CONFIGS as MIXTRAL_CONFIGS
from sim.planning.counting.models.mixtral import MixtralConfig
from sim.planning.counting.models.moe_config import ATTENTION_KINDS, ROUTERS
from sim.planning.counting.models.nemotron import CONFIGS as NEMOTRON_CONFIGS
from sim.planning.counting.models.nemotron import NemotronConfig, nemotron_config
from sim.planning.counting.models.qwen3 import CONFIGS as QWEN3_CONFIGS
from sim.planning.counting.models.qwen3 import Qwen3Config

__all__ = ["FAMILIES", "KNOWN", "Family", "describe", "parse"]

# The keys of a shape spec, in their canonical order, each with the config field it sets.
_KEYS = {"layers": "n_layer", "hidden": "d_model", "heads": "n_head", "kv-heads": "n_kv_head", "ffn": "ffn",
         "seq": "seq_len", "vocab": "vocab_size", "mlp": "mlp", "norm": "norm", "position": "position", "qkv": "qkv",
         "bias": "bias", "tied": "tied", "head-dim": "head_width", "qk-norm": "qk_norm", "experts": "experts",
         "top-k": "experts_per_token", "shared-experts": "shared_experts", "expert-ffn": "expert_ffn",
         "dense-layers": "dense_layers", "router": "router", "node-limit": "node_limit",
         "attention-kind": "attention_kind", "q-lora": "q_lora_rank", "kv-lora": "kv_lora_rank",
         "rope-dim": "qk_rope_head_dim", "nope-dim": "qk_nope_head_dim", "v-dim": "v_head_dim", "mtp": "mtp_layers",
         "kernels": "kernels", "attention": "attention"}
# The keys whose value is a word, with the words each takes; on and off set a flag.
_WORDS = {"mlp": MLPS, "norm": NORMS, "position": POSITIONS, "qkv": QKVS, "bias": ("on", "off"),
          "tied": ("on", "off"), "qk-norm": ("on", "off"), "router": ROUTERS, "attention-kind": ATTENTION_KINDS,
          "kernels": ("megatron", "eager"), "attention": ("flash", "math")}
# The integer keys that take 0 (none of them); every other integer key takes 1 and more.
_COUNTS = ("shared-experts", "dense-layers", "mtp")
# The options, which a size takes after it too, with their defaults (Note [spec defaults] in
# sim.planning.counting.models).
_OPTIONS = {"kernels": "megatron", "attention": "flash"}


@dataclass(frozen=True)
class Family:
    """A decoder family: its config, sizes, and what its specs require and say.

    Attributes:
        kind: the config with the family's defaults (a shape's keys left out take them).
        sizes: the published sizes by name.
        lookup: a size's config by name; raises KeyError listing the known ones.
        default: the size a bare ``family`` names.
        title: a size's description starts with it and the size (``"GPT-3 175B"``).
        shape: a shape's description starts with it.
        required: the keys a shape must give.
        kernels: what a description says of ``kernels=megatron``.
    """

    kind: Callable[..., DecoderConfig]
    sizes: Mapping[str, DecoderConfig]
    lookup: Callable[[str], DecoderConfig]
    default: str
    title: str
    shape: str
    required: tuple[str, ...]
    kernels: str


_SHAPE = ("layers", "hidden", "heads", "seq", "vocab")
#: The decoder families by spec prefix.
FAMILIES = {
    "gpt": Family(GPTConfig, GPT_CONFIGS, gpt_config, "125m", "GPT-3", "GPT", _SHAPE, "Megatron-LM's fused kernels"),
    "llama": Family(LlamaConfig, LLAMA_CONFIGS, llama_config, "8b", "Llama 3", "Llama-style decoder",
                    (*_SHAPE, "kv-heads", "ffn"), "fused kernels (Megatron-Core)"),
    "nemotron": Family(NemotronConfig, NEMOTRON_CONFIGS, nemotron_config, "15b", "Nemotron-4",
                       "Nemotron-style decoder", (*_SHAPE, "kv-heads", "ffn"), "fused kernels (Megatron-Core)"),
    "deepseek": Family(DeepSeekConfig, DEEPSEEK_CONFIGS, partial(preset, DEEPSEEK_CONFIGS, family="DeepSeek"), "v3",
                       "DeepSeek", "DeepSeek-style decoder", (*_SHAPE, "ffn", "experts", "top-k", "expert-ffn"),
                       "fused kernels (Megatron-Core)"),
    "mixtral": Family(MixtralConfig, MIXTRAL_CONFIGS, partial(preset, MIXTRAL_CONFIGS, family="Mixtral"), "8x7b",
                      "Mixtral", "Mixtral-style decoder", (*_SHAPE, "kv-heads", "ffn", "experts", "top-k"),
                      "fused kernels (Megatron-Core)"),
    "qwen3": Family(Qwen3Config, QWEN3_CONFIGS, partial(preset, QWEN3_CONFIGS, family="Qwen3"), "235b-a22b",
                    "Qwen3", "Qwen3-MoE-style decoder", (*_SHAPE, "kv-heads", "ffn", "experts", "top-k"),
                    "fused kernels (Megatron-Core)"),
}

_LETTERS = {"layers": "L", "hidden": "H", "heads": "A", "kv-heads": "K", "ffn": "F", "seq": "S", "vocab": "V",
            "head-dim": "D", "experts": "E", "top-k": "k", "shared-experts": "N", "expert-ffn": "FE",
            "dense-layers": "n", "node-limit": "M", "q-lora": "RQ", "kv-lora": "RKV", "rope-dim": "DR",
            "nope-dim": "DN", "v-dim": "DV", "mtp": "D"}
_OPTION_TEXT = "[,kernels=megatron|eager][,attention=flash|math]"
#: The decoders' spec forms, for messages and ``--help``: a size, and a shape with its optional keys.
KNOWN = tuple(form for name, family in FAMILIES.items() for form in (
    f"{name}:" + "|".join(family.sizes) + _OPTION_TEXT,
    f"{name}:" + ",".join(f"{k}={_LETTERS[k]}" for k in _LETTERS if k in family.required)
    + "".join(f"[,{k}={_LETTERS.get(k) or '|'.join(_WORDS[k])}]" for k in _KEYS
              if k not in family.required and k not in _OPTIONS) + _OPTION_TEXT))


def _fields(spec: str, arg: str, keys: tuple[str, ...], required: tuple[str, ...]) -> dict[str, object]:
    """``key=value`` pairs after the ':' as config fields; every key of ``required`` must be given. A key of
    :data:`_WORDS` takes one of its words (an option its default where not given), every other key an integer >= 1
    (>= 0 for the counts of :data:`_COUNTS`).

    Raises:
        KeyError: an unknown, repeated, missing or malformed key, or a word a key does not take.
        ValueError: an integer below 1 (below 0 for a count).
    """
    given: dict[str, object] = {}
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
            given[key] = value == "on" if _WORDS[key] == ("on", "off") else value
            continue
        try:
            number = int(value)
        except ValueError:
            raise KeyError(f"model {spec!r}: {key}={value!r} is not an integer") from None
        least = 0 if key in _COUNTS else 1
        if number < least:
            raise ValueError(f"model {spec!r}: {key} must be >= {least}, got {number}")
        given[key] = number
    missing = [k for k in required if k not in given]
    if missing:
        raise KeyError(f"model {spec!r}: missing {', '.join(missing)} (needs {', '.join(required)})")
    return {_KEYS[k]: v for k, v in ({k: w for k, w in _OPTIONS.items() if k in keys} | given).items()}


def _config(spec: str, make: Callable[..., DecoderConfig], values: dict[str, object]) -> DecoderConfig:
    """``make(**values)``, its refusal prefixed with the spec."""
    try:
        return make(**values)
    except ValueError as exc:
        raise ValueError(f"model {spec!r}: {exc}") from None


def _text(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _default(family: Family, key: str, cfg: DecoderConfig) -> object:
    """What ``key`` is where a shape leaves it out: an option's default, or the family's (a width or a head count
    where the family's default is ``None``: 4·hidden, the heads)."""
    if key in _OPTIONS:
        return _OPTIONS[key]
    default = getattr(family.kind(), _KEYS[key])
    if default is None and key in _RESOLVED:  # a width or a head count that follows another
        return {"ffn": 4 * cfg.d_model, "kv-heads": cfg.n_head, "head-dim": cfg.d_model // cfg.n_head,
                "expert-ffn": cfg.d_ff}[key]
    return default


# The keys whose config field may be None, and the property that resolves it.
_RESOLVED = {"ffn": "d_ff", "kv-heads": "kv_heads", "head-dim": "head_dim", "expert-ffn": "expert_width"}


def _resolved(key: str, cfg: DecoderConfig) -> object:
    return getattr(cfg, _RESOLVED.get(key, _KEYS[key]))


def parse(spec: str, name: str, arg: str) -> tuple[str, str, DecoderConfig]:
    """The canonical name, the title and the config of the spec ``name:arg`` of a family of :data:`FAMILIES`.

    Raises:
        KeyError: an unknown size, or a malformed shape (:func:`_fields`); a size followed by a key other than an
            option.
        ValueError: an invalid config (``kv-heads`` that do not divide the heads, a size past a cap); the message
            names the spec.
    """
    family = FAMILIES[name]
    size, _, options = arg.partition(",")
    if "=" in size:  # a shape
        cfg = _config(spec, family.kind, _fields(spec, arg, tuple(_KEYS), family.required))
        words = [f"{k}={_text(_resolved(k, cfg))}" for k in _KEYS
                 if k in family.required or _resolved(k, cfg) != _default(family, k, cfg)]
        return f"{name}:" + ",".join(words), family.shape, cfg
    size = size.strip() or family.default
    for item in options.split(",") if options else ():
        key = item.partition("=")[0].strip()
        if key not in _OPTIONS:
            raise KeyError(f"model {spec!r}: a size takes only {', '.join(_OPTIONS)} after it, not {key!r}; for "
                           f"another shape, expected key=value pairs for every key ({', '.join(_KEYS)})")
    cfg = _config(spec, lambda **values: replace(family.lookup(size), **values),
                  _fields(spec, options, tuple(_OPTIONS), ()))
    words = [f"{k}={getattr(cfg, _KEYS[k])}" for k, v in _OPTIONS.items() if getattr(cfg, _KEYS[k]) != v]
    return ",".join([f"{name}:{size.lower()}", *words]), f"{family.title} {_size_title(size)}", cfg


def describe(name: str, title: str, cfg: DecoderConfig) -> str:
    """A decoder's description: its shape, its choices that are not the family's, its kernels and its shard."""
    family = FAMILIES[name]
    kv = f", {cfg.kv_heads} KV heads" if "kv-heads" in family.required or cfg.kv_heads != cfg.n_head else ""
    base = family.kind()
    choices = "".join(f", {k} {_text(getattr(cfg, _KEYS[k]))}" for k in _WORDS
                      if k not in _OPTIONS and getattr(cfg, _KEYS[k]) != getattr(base, _KEYS[k]))
    kernels = (", FlashAttention" if cfg.attention == "flash" else "") + (
        f", {family.kernels}" if cfg.kernels == "megatron" else "")
    t = cfg.tensor_parallel
    sp = ", sequence parallel" if cfg.sequence_parallel else ""
    shard = "" if t == 1 else f", tensor-parallel shard of {t}{sp}"
    return (f"{title} ({cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads{kv}{_attention(cfg)}, "
            f"{_mlp(cfg)}{choices}, {cfg.seq_len} tokens{kernels}{shard}{_experts(cfg)})")


def _attention(cfg: DecoderConfig) -> str:
    """What a description says of the attention's heads where they are not the standard ones."""
    if cfg.attention_kind == "mla":
        q = "" if cfg.q_lora_rank is None else f"q rank {cfg.q_lora_rank}, "
        return (f", MLA ({q}kv rank {cfg.kv_lora_rank}, heads {cfg.qk_nope_head_dim}+{cfg.qk_rope_head_dim} "
                f"wide, values {cfg.v_head_dim})")
    return "" if cfg.head_width is None else f" of {cfg.head_dim}"


def _mlp(cfg: DecoderConfig) -> str:
    """What a description says of the MLPs: their width, or the experts'."""
    if not cfg.experts:
        return f"MLP {cfg.d_ff}"
    first = "the first block" if cfg.dense_layers == 1 else f"the first {cfg.dense_layers} blocks"
    dense = f"{first} MLP {cfg.d_ff}, then " if cfg.dense_layers else ""
    shared = f" and {cfg.shared_experts} shared" if cfg.shared_experts else ""
    mtp = f", {cfg.mtp_layers} MTP module{'s' * (cfg.mtp_layers > 1)}" if cfg.mtp_layers else ""
    return f"{dense}{cfg.experts} experts of {cfg.expert_width}, {cfg.experts_per_token} a token{shared}{mtp}"


def _experts(cfg: DecoderConfig) -> str:
    """What a description says of the expert-parallel shard and the routing's balance (its default stated)."""
    if not cfg.experts:
        return ""
    ep, etp = cfg.expert_parallel, cfg.expert_tensor_parallel
    shard = "" if ep * etp == 1 else f", expert-parallel shard of {ep}" + (f" x {etp}" if etp > 1 else "")
    balance = "balanced routing" if cfg.expert_imbalance == 1.0 else "the busiest rank's routing"
    return f"{shard}, {balance} (imbalance {float(cfg.expert_imbalance)!r})"


def _size_title(size: str) -> str:
    """A size as its makers write it: upper case (``405B``, ``235B-A22B``, ``V3``) but for the ``x`` of experts times
    their size (Mistral's ``8x7B``)."""
    return size.upper().replace("X", "x")
