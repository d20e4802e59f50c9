"""Built-in models: sizes as published, the registry, and a tiny forward/backward of each on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import KNOWN, get_model
from sim.planning.counting.models.amoebanet import amoebanet
from sim.planning.counting.models.gpt import CONFIGS, GPTConfig, gpt, gpt_sample
from sim.planning.counting.models.resnet import resnet
from sim.planning.counting.models.unet import unet

TORCHGPIPE_BALANCES = [(370,), (135, 235), (44, 92, 124, 110), (26, 22, 33, 44, 44, 66, 66, 69)]


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet101_is_torchgpipe_370_layer_flattening() -> None:
    spec = get_model("resnet101")
    model = spec.module()
    assert len(model) == 370
    assert all(sum(b) == len(model) for b in TORCHGPIPE_BALANCES)
    assert _params(model) == 44_549_160  # ResNet-101's published parameter count
    names = list(dict(model.named_children()))
    assert names[:5] == ["conv1", "bn1", "relu", "maxpool", "layer1_0_fork"]
    assert names[-3:] == ["avgpool", "flatten", "fc"]


def test_resnet101_forward_flops() -> None:
    spec = get_model("resnet101")
    counts = count_layers(spec.module(), spec.sample(2)).at(1)
    gflop = sum(c.forward_flops for c in counts) / 1e9
    assert gflop == pytest.approx(2 * 7.8, rel=0.01)  # 7.8 G multiply-adds per 224x224 image


@pytest.mark.parametrize(("b", "c", "layers", "params"), [
    (6, 72, 285, 362.2e6), (11, 128, 505, 2.21e9), (24, 128, 1077, 4.99e9), (24, 160, 1077, 7.80e9),
])
def test_unet_sizes_match_torchgpipe(b: int, c: int, layers: int, params: float) -> None:
    with torch.device("meta"):
        model = unet(b, c)
    assert len(model) == layers == 44 * b + 21
    assert _params(model) == pytest.approx(params, rel=0.005)


@pytest.mark.parametrize(("layers", "filters", "params"), [
    (18, 208, 81.5e6), (18, 416, 319.0e6), (18, 544, 542.7e6), (36, 544, 1.06e9), (72, 512, 1.84e9),
])
def test_amoebanet_sizes_match_torchgpipe(layers: int, filters: int, params: float) -> None:
    with torch.device("meta"):
        model = amoebanet(layers, filters)
    assert _params(model) == pytest.approx(params, rel=0.005)
    assert len(model) == 1 + 2 + layers + 2 + 1


@pytest.mark.parametrize("size", list(CONFIGS))
def test_gpt_sizes(size: str) -> None:
    cfg = CONFIGS[size]
    with torch.device("meta"):
        model = gpt(cfg)
    assert len(model) == cfg.n_layer + 2
    assert _params(model) == cfg.parameters
    nominal = {"125m": 125e6, "350m": 350e6, "760m": 760e6, "1.3b": 1.3e9, "2.7b": 2.7e9, "6.7b": 6.7e9,
               "13b": 13e9, "175b": 175e9}[size]
    # the paper counts a tied head; ours is untied (V·C more), which matters only for the small sizes
    tied = cfg.parameters - cfg.vocab_size * cfg.d_model
    assert tied == pytest.approx(nominal, rel=0.1)


def test_registry_parses_specs() -> None:
    assert get_model("gpt:1.3b").name == "gpt:1.3b"
    assert get_model("GPT:175B").name == "gpt:175b"
    assert get_model("unet:5,64").name == "unet:5,64" == get_model("unet").name
    assert get_model("amoebanet:18,256").name == "amoebanet:18,256" == get_model("amoebanet").name
    assert get_model("resnet101").sample(3).shape == (3, 3, 224, 224)
    assert get_model("unet:2,16").sample(1).shape == (1, 3, 192, 192)
    assert get_model("gpt:125m").sample(2).shape == (2, 2048)


@pytest.mark.parametrize("spec", ["vgg16", "gpt:7b", "unet:5", "amoebanet:x,y", "resnet50"])
def test_unknown_models_raise_key_error_listing_known_names(spec: str) -> None:
    with pytest.raises(KeyError) as info:
        get_model(spec)
    message = str(info.value)
    assert "known" in message or "expected" in message


def test_unknown_model_message_lists_every_family() -> None:
    with pytest.raises(KeyError) as info:
        get_model("vgg16")
    assert all(k in str(info.value) for k in KNOWN)


@pytest.mark.parametrize("spec", ["unet:0,64", "unet:5,63", "amoebanet:17,256", "amoebanet:18,100"])
def test_invalid_sizes_raise_value_error(spec: str) -> None:
    with pytest.raises(ValueError):
        get_model(spec)


def _train_step(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    out.float().pow(2).mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    return out


def test_tiny_gpt_trains_on_cpu() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=16, seq_len=8, vocab_size=50)
    for attention in ("math", "sdpa"):
        model = gpt(cfg, attention=attention)
        out = _train_step(model, gpt_sample(cfg, 3, "cpu"))
        assert out.shape == (3, 8, 50)


def test_gpt_attention_variants_agree() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8, vocab_size=50, dropout=0.0)
    math_model = gpt(cfg).eval()
    sdpa_model = gpt(cfg, attention="sdpa").eval()
    sdpa_model.load_state_dict(math_model.state_dict())
    ids = gpt_sample(cfg, 2, "cpu")
    torch.testing.assert_close(math_model(ids), sdpa_model(ids))


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8, vocab_size=50, dropout=0.0)
    model = gpt(cfg).eval()
    ids = gpt_sample(cfg, 1, "cpu")
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 50
    torch.testing.assert_close(model(ids)[:, :-1], model(changed)[:, :-1])  # the past ignores the future


def test_tiny_resnet_trains_on_cpu() -> None:
    torch.manual_seed(0)
    out = _train_step(resnet((1, 1, 1, 1), width=4, num_classes=10), torch.rand(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_tiny_unet_trains_on_cpu() -> None:
    torch.manual_seed(0)
    out = _train_step(unet(1, 4), torch.rand(2, 3, 64, 64))
    assert out.shape == (2, 1, 64, 64)


def test_tiny_amoebanet_trains_on_cpu() -> None:
    torch.manual_seed(0)
    out = _train_step(amoebanet(3, 16, num_classes=10), torch.rand(2, 3, 64, 64))
    assert out.shape == (2, 10)


@pytest.mark.parametrize("spec", ["gpt:125m", "unet:2,16", "amoebanet:3,32"])
def test_builtins_count_on_meta(spec: str) -> None:
    entry = get_model(spec)
    profile = count_layers(entry.module(), entry.sample(2))
    assert len(profile) == len(entry.module())
    assert sum(c.forward_flops for c in profile.at(1)) > 0
