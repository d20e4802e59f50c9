"""Model shapes people name: ``gpt:layers=...``, the Llama 3 sizes and ``llama:layers=...``, counted on meta."""

from __future__ import annotations

import resource

import pytest
import torch
from torch import nn

from sim.cli import main
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.counting.models.decoder_layers import _rope_tables, _rotate
from sim.planning.counting.models.gpt import CONFIGS, Block, GPTConfig, gpt
from sim.planning.counting.models.llama import CONFIGS as LLAMA
from sim.planning.counting.models.llama import LlamaConfig, llama, llama_sample


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _llama_closed_form(layers: int, h: int, a: int, k: int, f: int, v: int) -> int:
    """Embedding V·H; per layer attention H·(H + 2·K·H/A) + H·H, SwiGLU 3·H·F, two RMSNorm gains 2H;
    final RMSNorm H; untied head V·H."""
    per_layer = h * (h + 2 * k * h // a) + h * h + 3 * h * f + 2 * h
    return v * h + layers * per_layer + h + v * h


# Llama 3's sizes as Dubey et al. (2024) publish them, and the numbers the released checkpoints report.
@pytest.mark.parametrize(("size", "shape", "published"), [
    ("8b", (32, 4096, 32, 8, 14336, 128256), 8.03e9),
    ("70b", (80, 8192, 64, 8, 28672, 128256), 70.6e9),
    ("405b", (126, 16384, 128, 8, 53248, 128256), 405e9),
])
def test_llama3_sizes_match_the_closed_form_and_the_published_counts(
        size: str, shape: tuple[int, ...], published: float) -> None:
    cfg = LLAMA[size]
    layers, h, a, k, f, v = shape
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.ffn, cfg.vocab_size) == shape
    assert cfg.seq_len == 8192
    model = get_model(f"llama:{size}").module()
    closed = _llama_closed_form(layers, h, a, k, f, v)
    assert len(model) == layers + 2
    assert _params(model) == closed == cfg.parameters
    assert closed == pytest.approx(published, rel=0.01)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_llama_405b_builds_on_meta_without_allocating() -> None:
    before = _rss_bytes()
    model = get_model("llama:405b").module()
    grown = _rss_bytes() - before
    assert all(p.is_meta for p in model.parameters()) and all(b.is_meta for b in model.buffers())
    assert grown < 2**29, f"building grew the process by {grown / 2**20:.0f} MiB"  # the weights alone: 811 GB


@pytest.mark.parametrize("size", ["125m", "1.3b", "175b"])
def test_a_gpt_shape_spec_is_the_preset_it_names(size: str) -> None:
    cfg = CONFIGS[size]
    spec = get_model(f"gpt:layers={cfg.n_layer},hidden={cfg.d_model},heads={cfg.n_head},seq={cfg.seq_len},"
                     f"vocab={cfg.vocab_size}")
    assert _params(spec.module()) == _params(get_model(f"gpt:{size}").module()) == cfg.parameters
    assert spec.sample(2).shape == (2, cfg.seq_len)


def test_gpt_175b_by_its_numbers() -> None:
    spec = get_model("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=50257")
    assert _params(spec.module()) == CONFIGS["175b"].parameters


@pytest.mark.parametrize(("spec", "canonical"), [
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000", "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"),
    ("GPT: vocab=1000, seq=128, heads=4, hidden=256, layers=4",
     "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"),
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000,ffn=1024",  # 4H: the default, left out
     "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"),
    ("gpt:ffn=512,layers=4,hidden=256,heads=4,seq=128,vocab=1000",
     "gpt:layers=4,hidden=256,heads=4,ffn=512,seq=128,vocab=1000"),
    ("gpt:kernels=megatron,layers=4,hidden=256,heads=4,seq=128,vocab=1000",  # the default, left out
     "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"),
    ("gpt:attention=math,kernels=eager,layers=4,hidden=256,heads=4,seq=128,vocab=1000",
     "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000,kernels=eager,attention=math"),
    ("llama:vocab=100,seq=16,ffn=96,kv-heads=2,heads=4,hidden=32,layers=2",
     "llama:layers=2,hidden=32,heads=4,kv-heads=2,ffn=96,seq=16,vocab=100"),
    ("LLAMA:70B", "llama:70b"),
    ("llama", "llama:8b"),
])
def test_shape_specs_have_a_canonical_name_that_round_trips(spec: str, canonical: str) -> None:
    entry = get_model(spec)
    assert entry.name == canonical
    again = get_model(entry.name)
    assert again.name == canonical and again.description == entry.description
    assert _params(again.module()) == _params(entry.module())


def test_gpt_ffn_sets_the_mlp_width() -> None:
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=64, seq_len=16, vocab_size=100, ffn=96)
    with torch.device("meta"):
        model = gpt(cfg)
    block0 = model[1]
    assert isinstance(block0, Block)
    assert block0.mlp.fc.out_features == 96 == block0.mlp.proj.in_features
    c, f = 64, 96
    block = 3 * c * c + 3 * c + c * c + c + c * f + f + f * c + c + 4 * c  # qkv, proj, fc, proj, two LayerNorms
    assert _params(model) == cfg.parameters == 2 * block + (100 + 16) * c + 2 * c + 100 * c
    assert GPTConfig().d_ff == 4 * 768 and GPTConfig(d_model=64, n_head=4).d_ff == 256  # follows d_model


# -- FLOPs -------------------------------------------------------------------------------------------


def _llama_block_flops(cfg: LlamaConfig, b: int) -> int:
    """Forward FLOPs of one block: 2 per weight per token for q, k, v, o and the three MLP matrices, and 4·b·s²·C
    for QK^T and the probabilities times V (every (query, key) pair of the s×s square, as the math form computes
    it and the counter counts it; the causal half is masked, not skipped)."""
    s, c = cfg.seq_len, cfg.d_model
    weights = cfg.block_parameters - 2 * c  # less the two RMSNorm gains
    return 2 * b * s * weights + 4 * b * s * s * c


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_llama_blocks_count_their_matrix_products(attention: str) -> None:
    cfg = LlamaConfig(n_layer=2, n_head=8, n_kv_head=2, d_model=128, ffn=352, seq_len=64, vocab_size=500,
                      attention=attention)  # type: ignore[arg-type]
    with torch.device("meta"):
        model = llama(cfg)
    counts = count_layers(model, llama_sample(cfg, 2)).at(3)
    for block in counts[1:-1]:
        assert block.forward_flops == _llama_block_flops(cfg, 3)
        assert block.backward_flops == 2 * block.forward_flops
    assert counts[-1].forward_flops == 2 * 3 * cfg.seq_len * cfg.d_model * cfg.vocab_size  # the head


def test_llama_training_flops_are_6_n_tokens_plus_attention() -> None:
    """The whole model against the usual estimate: 2·N·tokens forward for the N parameters that multiply (all
    but the embedding, whose lookup is free), plus attention's 4·L·b·s²·C; backward twice that."""
    cfg = LlamaConfig(n_layer=4, n_head=8, n_kv_head=4, d_model=256, ffn=704, seq_len=128, vocab_size=1000)
    with torch.device("meta"):
        model = llama(cfg)
    b, s = 2, cfg.seq_len
    counts = count_layers(model, llama_sample(cfg, 1)).at(b)
    n = cfg.parameters - cfg.vocab_size * cfg.d_model
    forward = 2 * n * b * s + 4 * cfg.n_layer * b * s * s * cfg.d_model
    # N holds the RMSNorm gains, which the counter prices by their bytes (no FLOPs): 0.07% here
    assert sum(c.forward_flops for c in counts) == pytest.approx(forward, rel=0.01)
    assert sum(c.forward_flops + c.backward_flops for c in counts) == pytest.approx(3 * forward, rel=0.01)


def test_llama_8b_block_at_full_size() -> None:
    cfg = LLAMA["8b"]
    with torch.device("meta"):
        model = llama(cfg, n_layer=1)
    block = count_layers(model, llama_sample(cfg, 1), dtype=torch.bfloat16).at(1)[1]
    assert block.forward_flops == _llama_block_flops(cfg, 1)


# -- the model on the CPU ----------------------------------------------------------------------------

TINY = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn=48, seq_len=8, vocab_size=50)


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_tiny_llama_trains_on_cpu(attention: str) -> None:
    torch.manual_seed(0)
    model = llama(TINY, attention=attention)
    out = model(llama_sample(TINY, 3, "cpu"))
    assert out.shape == (3, 8, 50)
    out.pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_llama_attention_variants_agree(kv_heads: int) -> None:
    """The math form's grouping (Note [grouped attention]) against PyTorch's own grouped-query attention."""
    torch.manual_seed(0)
    math_model = llama(TINY, n_kv_head=kv_heads).eval()
    sdpa_model = llama(TINY, n_kv_head=kv_heads, attention="sdpa").eval()
    sdpa_model.load_state_dict(math_model.state_dict())
    ids = llama_sample(TINY, 2, "cpu")
    torch.testing.assert_close(math_model(ids), sdpa_model(ids))


def test_llama_is_causal() -> None:
    torch.manual_seed(0)
    model = llama(TINY).eval()
    ids = llama_sample(TINY, 1, "cpu")
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % TINY.vocab_size
    torch.testing.assert_close(model(ids)[:, :-1], model(changed)[:, :-1])


def test_rope_scores_depend_on_the_offset_alone() -> None:
    """RoPE's point: the score of a query at position m and a key at n is a function of m - n."""
    torch.manual_seed(0)
    cfg = LlamaConfig(n_layer=1, n_head=1, n_kv_head=1, d_model=16, ffn=16, seq_len=12, vocab_size=10)
    cos, sin = _rope_tables(cfg)
    q, k = torch.randn(16), torch.randn(16)
    qs = _rotate(q.expand(1, 1, 12, 16), cos, sin)[0, 0]  # (T, d): the same query at every position
    ks = _rotate(k.expand(1, 1, 12, 16), cos, sin)[0, 0]
    scores = qs @ ks.T  # (T, T)
    for offset in range(-3, 4):
        diagonal = scores.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    torch.testing.assert_close(qs.norm(dim=-1), q.norm().expand(12))  # a rotation keeps the length
    assert not torch.allclose(scores.diagonal(0)[:1], scores.diagonal(1)[:1])


# -- refusals ----------------------------------------------------------------------------------------

LLAMA_OK = "layers=2,hidden=32,heads=4,kv-heads=2,ffn=48,seq=8,vocab=50"


@pytest.mark.parametrize(("spec", "error", "says"), [
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000,depth=3", KeyError, "unknown key 'depth'"),
    ("gpt:layers=4,hidden=256,heads=4,seq=128", KeyError, "missing vocab"),
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1k", KeyError, "is not an integer"),
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000,layers=5", KeyError, "layers given twice"),
    ("gpt:175b,seq=4096", KeyError, "expected key=value pairs"),
    ("gpt:layers=4,hidden=250,heads=4,seq=128,vocab=1000", ValueError, "does not divide"),
    ("gpt:layers=0,hidden=256,heads=4,seq=128,vocab=1000", ValueError, "layers must be >= 1"),
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000,ffn=-1", ValueError, "ffn must be >= 1"),
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000,kernels=fused", KeyError, "is not one of megatron, eager"),
    ("llama:7b", KeyError, "unknown Llama size"),
    ("llama:" + LLAMA_OK.replace("kv-heads=2,", ""), KeyError, "missing kv-heads"),
    ("llama:" + LLAMA_OK.replace("kv-heads=2", "kv-heads=3"), ValueError, "does not divide into n_kv_head=3"),
    ("llama:" + LLAMA_OK.replace("hidden=32", "hidden=12"), ValueError, "RoPE needs an even width"),
    ("llama:" + LLAMA_OK.replace("seq=8", "seq=0"), ValueError, "seq must be >= 1"),
    ("llama:" + LLAMA_OK + ",theta=10000", KeyError, "unknown key 'theta'"),
])
def test_bad_shape_specs_are_refused_in_one_line(spec: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as info:
        get_model(spec)
    message = str(info.value.args[0])
    assert says in message and "\n" not in message
    assert "model" in message or "known" in message


# -- the command line --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000",
                                  "llama:layers=4,hidden=256,heads=4,kv-heads=2,ffn=704,seq=128,vocab=1000"])
def test_plan_takes_shape_specs(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", spec, "--batch", "8", "--gpus", "2", "--hardware", "a100-80gb", "--link",
                 "nvlink3", "--schedule", "gpipe", "--checkpoint", "never", "--chunks", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(get_model(spec).name + ":") and "best:" in out
