"""Mixture-of-experts decoders (sim.planning.counting.models.moe_config, moe_layers): the presets' published sizes,
the spec's keys and refusals, one rank's shard of the experts, the all-to-all's bytes, the grouped GEMMs' shapes, the
layer's arithmetic on the CPU, and DeepSeek-V3's training FLOPs per token against its paper."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from sim.planning.counting.counts import ALL_TO_ALL, COLLECTIVE, ModelProfile, OpTable
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.counting.models.decoder import DecoderConfig
from sim.planning.counting.models.decoder_layers import decoder, decoder_groups, token_ids
from sim.planning.counting.models.deepseek import CONFIGS as DEEPSEEK
from sim.planning.counting.models.mixtral import CONFIGS as MIXTRAL
from sim.planning.counting.models.moe_layers import MixtureOfExperts, grouped_mm
from sim.planning.counting.models.qwen3 import CONFIGS as QWEN3


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- the published sizes -------------------------------------------------------------------------------------------


# Each total and activated count as its source states it, with the unit of its last digit: DeepSeek-V3's report
# (671B total, without the MTP module) and README_WEIGHTS (36.6B activated, which leaves out the token embedding);
# DeepSeek-V2's report (236B, 21B); Mixtral's paper (46.7B, 12.9B); Mistral's 8x22B announcement (141B, 39B); Qwen3's
# report (235B, 22B).
@pytest.mark.parametrize(("cfg", "total", "activated", "unit", "embedding_counted"), [
    (DEEPSEEK["v3"], 671, 366, (1e9, 1e8), False),
    (DEEPSEEK["v2"], 236, 21, (1e9, 1e9), True),
    (MIXTRAL["8x7b"], 467, 129, (1e8, 1e8), True),
    (MIXTRAL["8x22b"], 141, 39, (1e9, 1e9), True),
    (QWEN3["235b-a22b"], 235, 22, (1e9, 1e9), True),
], ids=["deepseek-v3", "deepseek-v2", "mixtral-8x7b", "mixtral-8x22b", "qwen3-235b-a22b"])
def test_the_presets_have_the_published_total_and_activated_parameters(
        cfg: DecoderConfig, total: int, activated: int, unit: tuple[float, float], embedding_counted: bool) -> None:
    main = replace(cfg, mtp_layers=0)  # the published totals leave the MTP module out
    assert round(main.parameters / unit[0]) == total
    lookup = 0 if embedding_counted else cfg.vocab_size * cfg.d_model
    assert round((main.activated_parameters - lookup) / unit[1]) == activated
    with torch.device("meta"):
        assert _params(decoder(cfg)) == cfg.parameters  # the module builds what the config counts


def test_deepseek_v3s_mtp_module_is_one_moe_block_and_its_projection() -> None:
    cfg = DEEPSEEK["v3"]
    c = cfg.d_model
    block = replace(cfg, mtp_layers=0).block_parameters
    assert cfg.mtp_parameters == block + 2 * c * c + 3 * c  # the projection 2C -> C and three RMSNorms
    assert cfg.mtp_parameters == pytest.approx(11.6e9, rel=0.005)  # the 11.5B README_WEIGHTS gives, to 1%


def test_a_dense_config_keeps_every_count() -> None:
    cfg = DecoderConfig()
    assert cfg.activated_parameters == cfg.parameters == cfg.shard_parameters
    assert cfg.mtp_parameters == 0 and decoder_groups(cfg) == (range(1, 13),)


# -- the spec -------------------------------------------------------------------------------------------------------

TINY = ("layers=3,hidden=64,heads=4,kv-heads=2,ffn=96,experts=8,top-k=2,seq=16,vocab=100,shared-experts=1,"
        "expert-ffn=32,dense-layers=1")


@pytest.mark.parametrize("spec", ["deepseek:v3", "deepseek:v2", "mixtral:8x7b", "mixtral:8x22b", "qwen3:235b-a22b",
                                  f"mixtral:{TINY}", "deepseek:layers=2,hidden=64,heads=4,ffn=96,experts=8,top-k=2,"
                                  "expert-ffn=32,seq=16,vocab=100,kv-lora=16,q-lora=24,rope-dim=8,nope-dim=8,v-dim=8,dense-layers=1"])
def test_a_moe_spec_names_itself_back(spec: str) -> None:
    model = get_model(spec)
    again = get_model(model.name)
    assert again.name == model.name and again.config == model.config
    assert "routing (imbalance 1.0)" in model.description  # the default balance, stated


@pytest.mark.parametrize(("spec", "error", "says"), [
    (f"mixtral:{TINY.replace('top-k=2', 'top-k=9')}", ValueError, "experts per token k=9 must be 1 to the 8 experts"),
    (f"mixtral:{TINY.replace('top-k=2', 'top-k=0')}", ValueError, "top-k must be >= 1, got 0"),
    (f"mixtral:{TINY},router=relu", KeyError, "router='relu' is not one of softmax, sigmoid"),
    (f"mixtral:{TINY.replace('dense-layers=1', 'dense-layers=4')}", ValueError,
     "dense_layers=4 is more than the 3 blocks"),
    (f"qwen3:{TINY.replace('experts=8,', '')}", KeyError, "missing experts"),
    ("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,top-k=2", ValueError, "experts_per_token need routed experts"),
    ("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,experts=8,top-k=2", ValueError, "the experts are SwiGLU MLPs"),
    ("deepseek:v3,experts=8", KeyError, "a size takes only kernels, attention after it"),
    (f"deepseek:{TINY},rope-dim=7", ValueError, "qk_rope_head_dim=7 is odd"),
    (f"deepseek:{TINY}", ValueError, "MLA has its own keys and values"),  # kv-heads given
])
def test_a_bad_moe_spec_is_refused_in_one_line(spec: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says.replace("(", r"\(").replace(")", r"\)")) as caught:
        get_model(spec)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("ep", "etp", "imbalance", "t", "says"), [
    (3, 1, 1.0, 1, "expert parallel 3 does not divide the 8 experts"),
    (2, 2, 1.0, 1, "expert tensor parallel 2 must be 1 or the tensor-parallel degree 1"),
    (2, 2, 1.0, 2, "expert tensor parallel 2 does not divide the experts' width 5"),
    (2, 1, 0.9, 1, "expert imbalance must be >= 1"),
    (0, 1, 1.0, 1, "expert_parallel must be an integer >= 1, got 0"),
])
def test_an_expert_shard_that_does_not_fit_is_refused_in_one_line(ep: int, etp: int, imbalance: float, t: int,
                                                                  says: str) -> None:
    odd = TINY.replace("expert-ffn=32", "expert-ffn=5").replace("shared-experts=1", "shared-experts=2")
    spec = get_model(f"mixtral:{odd}").tensor_parallel(t, t > 1)
    with pytest.raises(ValueError, match=says) as caught:
        spec.expert_parallel(ep, etp, imbalance)
    assert str(caught.value).startswith("model mixtral:") and "\n" not in str(caught.value)


def test_a_dense_model_has_no_expert_shard() -> None:
    with pytest.raises(ValueError, match="has no experts"):
        get_model("llama:8b").expert_parallel(2)


# -- one rank's shard ------------------------------------------------------------------------------------------------

SHARDS = [(1, 1, 1, False), (2, 1, 1, False), (4, 1, 2, True), (2, 2, 2, True), (2, 2, 2, False), (4, 1, 2, False)]


def _shard(ep: int, etp: int, t: int, sp: bool, imbalance: float = 1.0) -> ModelProfile:
    return get_model(f"mixtral:{TINY}").tensor_parallel(t, sp).expert_parallel(ep, etp, imbalance).count(
        torch.bfloat16)


@pytest.mark.parametrize(("ep", "etp", "t", "sp"), SHARDS)
def test_a_shard_counts_the_parameters_its_config_names(ep: int, etp: int, t: int, sp: bool) -> None:
    spec = get_model(f"mixtral:{TINY}").tensor_parallel(t, sp).expert_parallel(ep, etp)
    assert spec.config is not None
    cfg, profile = spec.config, _shard(ep, etp, t, sp)
    assert profile.parameters == cfg.shard_parameters == _params(spec.module())
    assert profile.expert_parameters == 2 * (8 // ep) * 3 * 64 * 32 // etp  # two MoE blocks of E/ep experts
    assert [layer.expert_parameters > 0 for layer in profile.layers] == [False, False, True, True, False]
    assert (profile.expert_parallel, profile.tensor_parallel, profile.sequence_parallel) == (ep, t, sp)


@pytest.mark.parametrize(("ep", "etp", "t", "sp"), SHARDS)
def test_each_moe_block_runs_two_all_to_alls_each_way_of_the_routed_tokens(ep: int, etp: int, t: int,
                                                                           sp: bool) -> None:
    profile = _shard(ep, etp, t, sp, imbalance=1.5)
    routed = 16 // t * 2 * 64 * 2  # per sample: the tokens this rank routes x k x hidden x 2 bytes
    for layer in profile.layers:
        for table in (layer.forward, layer.backward):
            mine = (table.kinds_or_default() == COLLECTIVE) & (table.collectives_or_default() == ALL_TO_ALL)
            expected = 2 if layer.expert_parameters else 0
            assert mine.sum() == expected, layer.name
            assert np.array_equal(table.bytes[mine], np.tile([0.0, routed], (expected, 1)))


def _grouped(table: OpTable, groups: int) -> np.ndarray:
    """Which of ``table``'s operators are grouped GEMMs of ``groups`` experts: linear products whose FLOPs are that
    many times one group's ``2·M·N·K`` (a Linear layer's are once)."""
    dims = table.dims_or_default()[:, :, 0] + table.dims_or_default()[:, :, 1]  # at one sample
    return table.linear_or_default() & (table.flops_at(1) == groups * 2 * dims.prod(axis=1))


def _expert_gemms(profile: ModelProfile, groups: int) -> np.ndarray:
    """The forward's grouped GEMMs of the first MoE block: M, N, K at one sample, one row each."""
    table = profile.layers[2].forward
    dims = table.dims_or_default()[_grouped(table, groups)]
    return dims[:, :, 0] + dims[:, :, 1]  # (3, 3): gate, up, down


@pytest.mark.parametrize(("ep", "etp", "t", "imbalance"), [(1, 1, 1, 1.0), (4, 1, 1, 1.0), (2, 2, 2, 1.0),
                                                            (4, 1, 1, 2.0)])
def test_the_experts_gemms_run_at_the_tokens_each_expert_gets(ep: int, etp: int, t: int, imbalance: float) -> None:
    gemms = _expert_gemms(_shard(ep, etp, t, t > 1, imbalance), 8 // ep)
    per_expert = etp * ep * math.ceil(16 // t * 2 * imbalance / 8)  # Note [routed tokens], per sample
    assert gemms.tolist() == [[per_expert, 32 // etp, 64], [per_expert, 32 // etp, 64], [per_expert, 64, 32 // etp]]


def test_imbalance_grows_the_experts_work_and_not_the_all_to_all() -> None:
    balanced, busiest = _shard(2, 1, 1, False), _shard(2, 1, 1, False, imbalance=2.0)
    layer, busy = balanced.layers[2].forward, busiest.layers[2].forward
    experts = _grouped(layer, 4)
    assert experts.sum() == 3
    assert busy.flops[experts, 1].sum() == 2 * layer.flops[experts, 1].sum()
    exchange = layer.collectives_or_default() == ALL_TO_ALL
    assert np.array_equal(busy.bytes[exchange], layer.bytes[exchange])


# -- the layer on the CPU --------------------------------------------------------------------------------------------


def _tiny() -> DecoderConfig:
    """The config of the tiny Mixtral-style shape."""
    cfg = get_model(f"mixtral:{TINY}").config
    assert cfg is not None
    return cfg


def _reference(moe: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """Each token through its k experts, one at a time, weighted by its normalised gates, plus the shared experts."""
    flat = x.reshape(-1, x.shape[-1])
    scores = torch.softmax(flat @ moe.router.weight.T, dim=-1)
    gates, chosen = scores.topk(moe.k, dim=-1)
    gates = gates / gates.sum(-1, keepdim=True)
    out = torch.zeros_like(flat)
    for i in range(flat.shape[0]):
        for j in range(moe.k):
            e = int(chosen[i, j])
            hidden = nn.functional.silu(flat[i] @ moe.gate[e]) * (flat[i] @ moe.up[e])
            out[i] += gates[i, j] * (hidden @ moe.down[e])
    assert moe.shared is not None
    shared = moe.shared
    out += shared.down(nn.functional.silu(shared.gate(flat)) * shared.up(flat))
    return out.view_as(x)


@pytest.mark.parametrize("kernels", ["eager", "megatron"])
def test_the_moe_layer_computes_each_tokens_experts_and_their_gradients(kernels: str) -> None:
    torch.manual_seed(0)
    cfg = replace(_tiny(), kernels=kernels, expert_imbalance=4.0)  # type: ignore[arg-type]
    moe = MixtureOfExperts(cfg).double()  # capacity k·imbalance/E = 1 of every token: none dropped
    x = torch.randn(2, 16, 64, dtype=torch.float64, requires_grad=True)
    zero = torch.zeros_like(x)
    out = moe(x, zero)
    assert torch.allclose(out, _reference(moe, x))
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), [x, moe.gate, moe.down])
    expected = torch.autograd.grad((_reference(moe, x) * weights).sum(), [x, moe.gate, moe.down])
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want)


def test_a_token_past_its_experts_capacity_is_dropped() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(replace(_tiny(), shared_experts=0))
    with torch.no_grad():  # on positive inputs every token scores expert 0 first and expert 1 second
        moe.router.weight.copy_(torch.tensor([1.0, 0.5, *[-1.0] * 6]).unsqueeze(1).expand(8, 64))
    x = torch.randn(1, 16, 64).abs()
    out = moe(x, torch.zeros_like(x))
    capacity = math.ceil(16 * 2 / 8)  # the first 4 tokens fill experts 0 and 1; the others are dropped
    assert out[0, :capacity].abs().amin() > 0 and out[0, capacity:].abs().sum() == 0


def test_the_grouped_product_and_its_gradients_are_bmms() -> None:
    a = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(grouped_mm, (a, b))
    assert torch.equal(grouped_mm(a, b), torch.bmm(a, b))


def test_a_decoder_with_an_mtp_module_trains_on_the_cpu_and_counts_with_its_blocks_reused() -> None:
    spec = get_model("deepseek:layers=3,hidden=64,heads=4,ffn=96,experts=8,top-k=2,expert-ffn=32,seq=16,vocab=100,"
                     "kv-lora=16,q-lora=24,rope-dim=8,nope-dim=8,v-dim=8,dense-layers=1,mtp=2")
    model = spec.module("cpu")
    logits = model(token_ids(2, 16, 100, "cpu"))
    assert [tuple(z.shape) for z in logits] == [(2, 16, 100)] * 3  # the main head's and each MTP module's
    sum(z.sum() for z in logits).backward()
    assert all(p.grad is not None for p in model.parameters())
    reused = spec.count(torch.bfloat16)
    whole = count_layers(spec.module(), spec.sample(2), dtype=torch.bfloat16)  # every layer counted
    assert [layer.at(3) for layer in reused.layers] == [layer.at(3) for layer in whole.layers]
    assert sum(layer.parameters for layer in reused.layers if layer.name.startswith("mtp")) == \
        spec.config.mtp_parameters  # type: ignore[union-attr]


# -- DeepSeek-V3's FLOPs per token -----------------------------------------------------------------------------------


def test_deepseek_v3s_training_flops_per_token_are_its_papers() -> None:
    """Zhao et al. (2025), "Insights into DeepSeek-V3" (ISCA 2025, arXiv 2505.09343), Table 2: 250 GFLOPs of training
    compute per token at 4096 tokens. The count, forward and backward without the MTP module (which the table's
    671B model leaves out), is 4.4% above it: FlashAttention's backward computes the scores again (2.5 times the
    forward's attention, where 6·N + 3·attention counts 2) and the router's GEMMs."""
    spec = get_model("deepseek:v3")
    profile = spec.count(torch.bfloat16)
    per_token = sum(layer.forward.flops_at(1).sum() + layer.backward.flops_at(1).sum()
                    for layer in profile.layers if not layer.name.startswith("mtp")) / 4096
    assert per_token == pytest.approx(250e9, rel=0.05)
