"""One decoder, every family (sim.planning.counting.models.decoder): Nemotron-4's published sizes, every option's
parameters, the activation bytes a fused block keeps against Note [saved activations] in
sim.planning.counting.models.decoder_layers for each family, the spec's new keys and their refusals, and the options'
modules on the CPU."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from torch import nn

from sim.cli import main
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.counting.models.decoder import DecoderConfig
from sim.planning.counting.models.decoder_layers import decoder, token_ids
from sim.planning.counting.models.decoder_specs import parse
from sim.planning.counting.models.nemotron import CONFIGS as NEMOTRON
from sim.planning.counting.models.nemotron import NemotronConfig


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- Nemotron-4's sizes --------------------------------------------------------------------------------------------


# Parmar et al. (2024), Table 1: 3.2B embedding and 12.5B non-embedding parameters (15B); Nvidia (2024), Table 1:
# 9.4B and 331.6B (340B).
@pytest.mark.parametrize(("size", "shape", "embedding", "rest"), [
    ("15b", (32, 6144, 48, 8, 24576), 3.2e9, 12.5e9),
    ("340b", (96, 18432, 96, 8, 73728), 9.4e9, 331.6e9),
])
def test_nemotron_sizes_match_the_published_counts(size: str, shape: tuple[int, ...], embedding: float,
                                                   rest: float) -> None:
    cfg = NEMOTRON[size]
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.kv_heads, cfg.d_ff) == shape
    assert (cfg.seq_len, cfg.vocab_size, cfg.mlp, cfg.norm, cfg.position, cfg.bias, cfg.tied) == (
        4096, 256000, "relu2", "layernorm", "rope", False, False)
    model = get_model(f"nemotron:{size}").module()
    layers, h, a, k, f = shape
    per_layer = 2 * h * h + 2 * h * (k * h // a) + 2 * h * f + 4 * h  # q, o; k, v; fc, proj; two LayerNorms
    closed = 2 * 256000 * h + layers * per_layer + 2 * h
    assert _params(model) == cfg.parameters == closed
    assert 2 * 256000 * h == pytest.approx(embedding, rel=0.02)  # 3.15B, which the 15B report gives as 3.2B
    assert cfg.parameters - 2 * 256000 * h == pytest.approx(rest, rel=0.002)
    assert cfg.parameters == pytest.approx(embedding + rest, rel=0.005)


def test_nemotron_340b_splits_over_a_node_of_eight() -> None:
    spec = get_model("nemotron:340b")
    assert spec.splits_over(8) and not spec.splits_over(16)  # 8 KV heads
    assert get_model("nemotron").name == "nemotron:15b"


# -- parameters of every option ------------------------------------------------------------------------------------

SMALL = DecoderConfig(n_layer=2, n_head=4, d_model=32, seq_len=8, vocab_size=50, n_kv_head=2, ffn=48)
OPTIONS = list(itertools.product(("gelu", "swiglu", "relu2"), ("layernorm", "rmsnorm"), (True, False),
                                 (True, False), ("learned", "rope"), ("fused", "split")))


@pytest.mark.parametrize(("mlp", "norm", "bias", "tied", "position", "qkv"), OPTIONS)
def test_every_option_counts_the_parameters_it_builds(mlp: str, norm: str, bias: bool, tied: bool, position: str,
                                                      qkv: str) -> None:
    cfg = replace(SMALL, mlp=mlp, norm=norm, bias=bias, tied=tied, position=position, qkv=qkv)  # type: ignore[arg-type]
    with torch.device("meta"):
        assert _params(decoder(cfg)) == cfg.parameters
        assert _params(decoder(cfg, tensor_parallel=2)) == replace(cfg, tensor_parallel=2).shard_parameters


def test_tied_embeddings_share_one_weight_that_the_counter_counts_once() -> None:
    untied = get_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100")
    tied = get_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,tied=on")
    model = tied.module()
    head, embedding = model.get_submodule("head.out"), model.get_submodule("embedding.tokens")
    assert head.weight is embedding.weight
    assert _params(untied.module()) - _params(model) == 100 * 64
    assert tied.count(torch.float32).parameters == _params(model)


# -- what a fused block keeps (Note [saved activations] in sim.planning.counting.models.decoder_layers)
# -----------------------


def _closed_form(cfg: DecoderConfig, b: int) -> float:
    """Bytes a block of a spec's default keeps in 16 bits: the norms' inputs and statistics, the GEMMs' inputs and
    the dropout-add masks on every rank (over t with sequence parallelism); FlashAttention's q, k, v, output and
    logsumexp and the MLP's activations over t; the dropout's seed."""
    s, h, a, k, f, t = cfg.seq_len * b, cfg.d_model, cfg.n_head, cfg.kv_heads, cfg.d_ff, cfg.tensor_parallel
    stats = 16 if cfg.norm == "layernorm" else 8
    masks = 2 * h if cfg.bias or cfg.dropout > 0 else 0
    mlp = (6 if cfg.mlp == "swiglu" else 4) * f
    replicated = s * (8 * h + stats + masks) / (t if cfg.sequence_parallel else 1)
    return replicated + s * (4 * h * (1 + k / a) + 4 * a + mlp) / t + (16 if cfg.dropout > 0 else 0)


SHAPE = "layers=2,hidden=128,heads=8,kv-heads=2,ffn=352,seq=32,vocab=100"
FAMILIES = {
    "gpt": "gpt:layers=2,hidden=128,heads=8,seq=32,vocab=100",  # LayerNorm, biases, dropout, GELU, MHA
    "llama": f"llama:{SHAPE}",  # RMSNorm, SwiGLU, GQA, RoPE, no bias, no dropout
    "nemotron": f"nemotron:{SHAPE}",  # LayerNorm, squared ReLU, GQA, RoPE and a fused QKV, no bias, no dropout
    "gpt, swiglu and GQA": "gpt:layers=2,hidden=128,heads=8,kv-heads=2,seq=32,vocab=100,mlp=swiglu,norm=rmsnorm",
    "gpt, relu2, rope, no bias": "gpt:layers=2,hidden=128,heads=8,kv-heads=2,seq=32,vocab=100,mlp=relu2,position=rope,"
                                 "bias=off",
    "llama, gelu with biases": f"llama:{SHAPE},mlp=gelu,norm=layernorm,bias=on,qkv=fused",
    "nemotron, gelu without bias": f"nemotron:{SHAPE},mlp=gelu,qkv=split",
}


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("b", [2, 3])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_default_block_of_every_family_keeps_the_closed_form(family: str, t: int, sp: bool, b: int) -> None:
    block = get_model(FAMILIES[family]).tensor_parallel(t, sp).count(torch.bfloat16).at(b)[1]
    assert block.saved_bytes == _closed_form(_config(FAMILIES[family], t, sp), b)


def _config(text: str, t: int = 1, sp: bool = False) -> DecoderConfig:
    """The config a spec names, as one rank's shard."""
    family, _, arg = text.partition(":")
    return replace(parse(text, family, arg)[2], tensor_parallel=t, sequence_parallel=sp)


def test_a_nemotron_340b_block_at_t8_keeps_the_closed_form() -> None:
    cfg = _config("nemotron:340b", 8)
    with torch.device("meta"):
        model = decoder(cfg, n_layer=1)
    block = count_layers(model, token_ids(1, cfg.seq_len, cfg.vocab_size), dtype=torch.bfloat16).at(1)[1]
    assert block.saved_bytes == _closed_form(cfg, 1)
    assert block.saved_bytes / (4096 * 18432) == pytest.approx(10.54, abs=0.01)  # Note [saved activations] there


# -- the spec ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "canonical"), [
    ("NEMOTRON:340B", "nemotron:340b"),
    ("nemotron:15b,kernels=eager,attention=math", "nemotron:15b,kernels=eager,attention=math"),
    (f"nemotron:{SHAPE},mlp=relu2,norm=layernorm,bias=off,tied=off,position=rope,qkv=fused",  # the defaults
     f"nemotron:{SHAPE}"),
    ("gpt:tied=on,bias=off,norm=rmsnorm,mlp=swiglu,kv-heads=8,layers=2,hidden=64,heads=8,seq=16,vocab=100",
     "gpt:layers=2,hidden=64,heads=8,seq=16,vocab=100,mlp=swiglu,norm=rmsnorm,bias=off,tied=on"),  # K = A: MHA
    ("gpt:layers=2,hidden=64,heads=8,kv-heads=2,seq=16,vocab=100,position=rope",
     "gpt:layers=2,hidden=64,heads=8,kv-heads=2,seq=16,vocab=100,position=rope"),
    (f"llama:{SHAPE},mlp=gelu,bias=on,qkv=fused", f"llama:{SHAPE},mlp=gelu,qkv=fused,bias=on"),
])
def test_the_new_keys_have_a_canonical_name_that_round_trips(spec: str, canonical: str) -> None:
    entry = get_model(spec)
    assert entry.name == canonical
    again = get_model(entry.name)
    assert again.description == entry.description
    assert _params(again.module()) == _params(entry.module())


@pytest.mark.parametrize(("spec", "error", "says"), [
    ("gpt:layers=2,hidden=64,heads=8,kv-heads=3,seq=16,vocab=100", ValueError, "kv-heads must divide heads"),
    (f"nemotron:{SHAPE.replace('kv-heads=2', 'kv-heads=16')}", ValueError, "n_kv_head=16"),
    (f"nemotron:{SHAPE},mlp=relu", KeyError, "mlp='relu' is not one of gelu, swiglu, relu2"),
    (f"nemotron:{SHAPE},norm=batchnorm", KeyError, "norm='batchnorm' is not one of layernorm, rmsnorm"),
    (f"nemotron:{SHAPE},bias=yes", KeyError, "bias='yes' is not one of on, off"),
    (f"nemotron:{SHAPE},position=alibi", KeyError, "position='alibi' is not one of learned, rope"),
    ("nemotron:15b,mlp=gelu", KeyError, "a size takes only kernels, attention after it, not 'mlp'"),
    ("nemotron:70b", KeyError, "unknown Nemotron size"),
    (f"nemotron:{SHAPE.replace('kv-heads=2,', '')}", KeyError, "missing kv-heads"),
    (f"nemotron:{SHAPE.replace('layers=2', 'layers=5000')}", ValueError, "layers 5,000 is above the planner's cap"),
    ("gpt:layers=2,hidden=42,heads=6,seq=16,vocab=100,position=rope", ValueError, "RoPE needs an even width"),
])
def test_bad_specs_are_refused_in_one_line_naming_the_key(spec: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as info:
        get_model(spec)
    message = str(info.value.args[0])
    assert says in message and "\n" not in message and (spec in message or "known" in message)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("mlp", "relu", "mlp must be 'gelu', 'swiglu' or 'relu2', got 'relu'"),
    ("norm", "batchnorm", "norm must be 'layernorm' or 'rmsnorm'"),
    ("qkv", "packed", "qkv must be 'fused' or 'split'"),
    ("bias", "on", "bias must be True or False"),
    ("n_kv_head", 5, "n_head=48 does not divide into n_kv_head=5 groups"),
    ("dropout", 1.0, "dropout must be in [0, 1)"),
])
def test_a_config_refuses_a_bad_option(field: str, value: object, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        replace(NemotronConfig(), **{field: value})  # type: ignore[arg-type]


def test_the_cli_refuses_kv_heads_that_do_not_divide_the_heads_before_counting(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def count(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was counted")

    monkeypatch.setattr("sim.cli.plan.count_layers", count)
    spec = f"nemotron:{SHAPE.replace('kv-heads=2', 'kv-heads=3')}"
    assert main(["plan", "--model", spec, "--batch", "8", "--gpus", "2", "--hardware", "a100-80gb"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpipe-sim plan: error: ") and "kv-heads" in lines[0], lines


def test_the_cli_plans_a_nemotron_shape(capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"nemotron:{SHAPE}"
    assert main(["plan", "--model", spec, "--batch", "8", "--gpus", "4", "--hardware", "a100-80gb", "--link",
                 "nvlink3", "--schedule", "1f1b", "--chunks", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(get_model(spec).name + ":") and "best:" in out


# -- the options on the CPU ----------------------------------------------------------------------------------------

TINY = NemotronConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn=48, seq_len=8, vocab_size=50)


@pytest.mark.parametrize(("kv_heads", "qkv", "bias", "dropout"), [
    (2, "fused", False, 0.0), (1, "split", True, 0.0), (4, "fused", True, 0.0), (2, "fused", False, 0.1),
])
@pytest.mark.parametrize("mlp", ["relu2", "gelu", "swiglu"])
def test_the_fused_kernels_and_flash_attention_compute_the_math_form(kv_heads: int, qkv: str, bias: bool,
                                                                      dropout: float, mlp: str) -> None:
    """Megatron's kernels with FlashAttention against every operator eager with attention written out: the same
    outputs and gradients (without dropout; with it, in eval mode, where it is off)."""
    torch.manual_seed(0)
    cfg = replace(TINY, n_kv_head=kv_heads, qkv=qkv, bias=bias, dropout=dropout, mlp=mlp)  # type: ignore[arg-type]
    eager = decoder(cfg)
    fused = decoder(cfg, kernels="megatron", attention="flash")
    fused.load_state_dict(eager.state_dict())
    if dropout:
        eager.eval(), fused.eval()
    ids = token_ids(2, cfg.seq_len, cfg.vocab_size, "cpu")
    out_eager, out_fused = eager(ids), fused(ids)
    torch.testing.assert_close(out_fused, out_eager)
    out_eager.pow(2).mean().backward()
    out_fused.pow(2).mean().backward()
    for (name, a), b in zip(eager.named_parameters(), fused.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_a_bias_free_branch_with_dropout_trains_through_the_fused_residual() -> None:
    torch.manual_seed(0)
    cfg = replace(TINY, dropout=0.1, kernels="megatron", attention="flash")
    model = decoder(cfg)
    model(token_ids(2, cfg.seq_len, cfg.vocab_size, "cpu")).pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_every_attention_form_agrees_for_grouped_queries_with_biases() -> None:
    torch.manual_seed(0)
    cfg = replace(TINY, n_kv_head=1, bias=True, position="learned", dropout=0.0)
    models = [decoder(cfg, attention=a).eval() for a in ("math", "sdpa", "flash")]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    ids = token_ids(2, cfg.seq_len, cfg.vocab_size, "cpu")
    for model in models[1:]:
        torch.testing.assert_close(model(ids), models[0](ids))
