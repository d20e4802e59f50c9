"""Meta-device counting: exact FLOPs of linear layers and attention, kernels and bytes, bytes saved for backward
(Korthikanti et al.), 175B on meta."""

from __future__ import annotations

import resource

import pytest
import torch
from torch import nn

from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models.gpt import CONFIGS, GPTConfig, gpt, gpt_sample
from sim.planning.hardware.catalog import get_device


def test_linear_forward_is_2_b_in_out_and_backward_twice_that() -> None:
    b, d_in, d_out = 8, 16, 32
    model = nn.Sequential(nn.Identity(), nn.Linear(d_in, d_out, bias=False))
    counts = count_layers(model, torch.randn(b, d_in)).at(b)
    assert counts[1].forward_flops == 2 * b * d_in * d_out
    assert counts[1].backward_flops == 2 * counts[1].forward_flops  # input gradient + weight gradient


def test_first_layer_backward_has_no_input_gradient() -> None:
    # the data does not require grad, so layer 0's backward is the weight gradient alone
    model = nn.Sequential(nn.Linear(16, 32, bias=False))
    c = count_layers(model, torch.randn(4, 16)).at(4)[0]
    assert c.backward_flops == c.forward_flops == 2 * 4 * 16 * 32


def test_counts_are_affine_in_the_batch() -> None:
    model = nn.Sequential(nn.Identity(), nn.Linear(16, 32), nn.ReLU())
    profile = count_layers(model, torch.randn(1, 16))
    for batch in (1, 3, 64):
        c = profile.at(batch)
        assert c[1].forward_flops == 2 * batch * 16 * 32
        assert c[2].output_bytes == batch * 32 * 4


def test_parameter_counts_and_bytes() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    profile = count_layers(model, torch.randn(2, 10))
    assert profile.parameters == sum(p.numel() for p in model.parameters())
    assert profile.parameter_bytes == 4 * profile.parameters
    assert [layer.parameter_tensors for layer in profile.layers] == [2, 0, 2]


def test_saved_bytes_exclude_parameters_and_count_each_storage_once() -> None:
    b = 4
    model = nn.Sequential(nn.Identity(), nn.Linear(1000, 1000, bias=False), nn.ReLU(), nn.Linear(1000, 10))
    profile = count_layers(model, torch.randn(b, 1000))
    c = profile.at(b)
    assert c[1].saved_bytes == b * 1000 * 4  # its input, not the 4 MB weight
    assert c[2].saved_bytes == b * 1000 * 4  # ReLU keeps its output ...
    assert c[3].saved_bytes == 0  # ... which the next linear saves too: counted once
    reused = profile.layers[3].input_saved_bytes
    assert reused[0] + reused[1] * b == b * 1000 * 4  # a stage starting at layer 3 keeps it as well


def test_dropout_keeps_a_one_byte_mask_as_on_a_gpu() -> None:
    model = nn.Sequential(nn.Identity(), nn.Dropout(0.1))
    c = count_layers(model, torch.randn(8, 100)).at(8)[1]
    assert c.saved_bytes == 8 * 100  # bool mask, not a float one


def test_memory_traffic_of_an_elementwise_layer() -> None:
    c = count_layers(nn.Sequential(nn.Identity(), nn.ReLU()), torch.randn(8, 100)).at(8)[1]
    assert c.forward_flops == 0
    assert c.forward_bytes == 2 * 8 * 100 * 4  # read and write
    assert c.forward_kernels == 1


def test_convolution_backward_is_counted_as_its_kernels() -> None:
    """Note [one operator, several kernels]: backward-data, backward-filter, backward-bias, each its own pass."""
    b, c_in, c_out, hw = 4, 8, 16, 10
    model = nn.Sequential(nn.Identity(), nn.Conv2d(c_in, c_out, 3, padding=1))
    layer = count_layers(model, torch.randn(2, c_in, hw, hw)).layers[1]
    x, y = b * c_in * hw * hw * 4, b * c_out * hw * hw * 4  # bytes of the input and of the output (gradient)
    w, bias = c_out * c_in * 9 * 4, c_out * 4
    conv = 2 * b * c_out * hw * hw * c_in * 9  # the forward's FLOPs
    flops, nbytes = layer.backward.flops_at(b), layer.backward.bytes_at(b)
    assert list(flops[:3]) == [conv, conv, 0]  # the FLOPs are the single count's, split
    assert list(nbytes[:3]) == [y + w + x, y + x + w, y + bias]  # each kernel reads the output gradient
    assert layer.backward.kernels == 3 + 2  # and one accumulation into .grad per parameter


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_reads_its_input_twice_in_training(train: bool) -> None:
    """Statistics over the whole (N, H, W) slice come before the first output: two passes in training."""
    b, c, hw = 4, 8, 10
    model = nn.Sequential(nn.Identity(), nn.BatchNorm2d(c)).train(train)
    layer = count_layers(model, torch.randn(2, c, hw, hw)).layers[1]
    x = b * c * hw * hw * 4
    forward = sorted(layer.forward.bytes_at(b))[-2:]  # the largest kernels (training adds a counter update)
    if train:
        assert forward[0] == x and forward[1] == pytest.approx(2 * x, abs=8 * 4 * c)  # statistics; normalisation
        backward = sorted(layer.backward.bytes_at(b))[-2:]
        assert backward[0] == 2 * x and backward[1] == pytest.approx(3 * x, abs=8 * 4 * c)  # reductions; dx
    else:
        assert layer.forward.kernels == 1 and forward[-1] == pytest.approx(2 * x, abs=8 * 4 * c)


def test_dtype_override_counts_in_half_precision() -> None:
    model = nn.Sequential(nn.Identity(), nn.Linear(16, 16))
    half = count_layers(model, torch.randn(2, 16), dtype=torch.float16)
    full = count_layers(model, torch.randn(2, 16))
    assert half.dtype == torch.float16 and model[1].weight.dtype == torch.float32  # the model is unchanged
    assert half.parameter_bytes * 2 == full.parameter_bytes
    assert half.at(4)[1].output_bytes * 2 == full.at(4)[1].output_bytes


def _block_flops(b: int, s: int, h: int) -> int:
    """Analytic forward FLOPs of one GPT block: QKV, QK^T, AV, projection, MLP (Narayanan et al., 2021)."""
    return 24 * b * s * h * h + 4 * b * s * s * h


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_attention_is_counted_as_its_matrix_products(attention: str) -> None:
    cfg = GPTConfig(n_layer=1, n_head=4, d_model=64, seq_len=32, vocab_size=100, attention=attention)  # type: ignore[arg-type]
    with torch.device("meta"):
        model = gpt(cfg)
    block = count_layers(model, gpt_sample(cfg, 2)).at(3)[1]
    assert block.forward_flops == _block_flops(3, 32, 64)
    assert block.backward_flops == 2 * block.forward_flops


KORTHIKANTI_TOLERANCE = 1e-3  # LayerNorm keeps its mean and 1/std in fp32: 16·s·b bytes the formula leaves out


@pytest.mark.parametrize("size", ["125m", "1.3b", "175b"])
def test_activation_bytes_per_layer_match_korthikanti(size: str) -> None:
    cfg = CONFIGS[size]
    with torch.device("meta"):
        model = gpt(cfg, n_layer=1)
    profile = count_layers(model, gpt_sample(cfg, 1), dtype=torch.float16)
    s, h, a = cfg.seq_len, cfg.d_model, cfg.n_head
    for b in (1, 4):
        formula = s * b * h * (34 + 5 * a * s / h)  # bytes, 16-bit activations, no recomputation
        assert profile.at(b)[1].saved_bytes == pytest.approx(formula, rel=KORTHIKANTI_TOLERANCE)


def test_stage_memory_matches_korthikanti_with_and_without_recompute() -> None:
    """What the simulator holds per micro-batch: k blocks save k times the formula; a checkpointed stage keeps
    its input, 2·s·b·h bytes in 16 bits (Korthikanti et al.'s full recomputation)."""
    cfg = CONFIGS["125m"]
    with torch.device("meta"):
        model = gpt(cfg, n_layer=4)
    profile = count_layers(model, gpt_sample(cfg, 1), dtype=torch.float16)
    costs = FlopCosts(profile, get_device("a100-80gb"), "fp16-adam")
    s, h, a = cfg.seq_len, cfg.d_model, cfg.n_head
    for b in (1, 3):
        formula = s * b * h * (34 + 5 * a * s / h)
        _, one, two, _, _ = costs.stages((1, 1, 2, 1, 1), b)  # embedding | block | 2 blocks | block | head
        assert one.saved_bytes == pytest.approx(formula, rel=KORTHIKANTI_TOLERANCE)
        assert two.saved_bytes == pytest.approx(2 * formula, rel=KORTHIKANTI_TOLERANCE)
        assert one.checkpoint_bytes == two.checkpoint_bytes == 2 * s * b * h


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@pytest.mark.slow
def test_gpt_175b_builds_and_counts_on_meta_without_allocating() -> None:
    cfg = CONFIGS["175b"]
    before = _rss_bytes()
    with torch.device("meta"):
        model = gpt(cfg)
    profile = count_layers(model, gpt_sample(cfg, 1), dtype=torch.float16)
    grown = _rss_bytes() - before
    assert all(p.is_meta for p in model.parameters())
    assert grown < 2**30, f"counting grew the process by {grown / 2**30:.1f} GiB"  # the weights alone: 350 GB
    assert profile.parameters == cfg.parameters
    assert 174e9 < profile.parameters < 176e9
    assert profile.at(1)[1].forward_flops == _block_flops(1, cfg.seq_len, cfg.d_model)


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="nn.Sequential"):
        count_layers(nn.Linear(2, 2), torch.randn(1, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no layers"):
        count_layers(nn.Sequential(), torch.randn(1, 2))
    with pytest.raises(ValueError, match="batch dimension"):
        count_layers(nn.Sequential(nn.Identity()), torch.tensor(1.0))
