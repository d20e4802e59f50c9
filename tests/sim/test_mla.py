"""DeepSeek's multi-head latent attention (sim.planning.counting.models.mla): its parameters in closed form, its
FlashAttention against the math form on the CPU, its FLOPs with heads of two widths, its tensor-parallel shard, and
its refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from sim.planning.counting.counts import MATMUL
from sim.planning.counting.models import get_model
from sim.planning.counting.models.decoder_layers import decoder
from sim.planning.counting.models.deepseek import CONFIGS as DEEPSEEK
from sim.planning.counting.models.deepseek import DeepSeekConfig
from sim.planning.counting.models.mla import LatentAttention
from sim.planning.counting.models.moe_config import attention_parameters

SMALL = DeepSeekConfig(n_layer=2, n_head=4, d_model=64, seq_len=16, vocab_size=100, ffn=96, experts=8,
                       experts_per_token=2, expert_ffn=32, dense_layers=1, mtp_layers=0, q_lora_rank=24,
                       kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10)


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_deepseek_v3s_attention_has_the_closed_form_parameters() -> None:
    # q down 7168 x 1536 and its norm, q up 1536 x 128·(128 + 64); kv down 7168 x (512 + 64) and its norm, kv up
    # 512 x 128·(128 + 128); o 128·128 x 7168 (the config_671B.json's shapes).
    whole = 7168 * 1536 + 1536 + 7168 * 576 + 512
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    assert attention_parameters(DEEPSEEK["v3"]) == (split, whole)
    assert split + whole == 187_107_328
    with torch.device("meta"):
        assert _params(LatentAttention(DEEPSEEK["v3"])) == split + whole


@pytest.mark.parametrize("q_lora", [24, None])
@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True), (4, True)])
def test_an_mla_decoder_builds_the_parameters_it_counts(q_lora: int | None, t: int, sp: bool) -> None:
    cfg = replace(SMALL, q_lora_rank=q_lora, tensor_parallel=t, sequence_parallel=sp)
    with torch.device("meta"):
        model = decoder(cfg)
    assert _params(model) == cfg.shard_parameters
    attention = model.get_submodule("block0.attn")
    assert isinstance(attention, LatentAttention)
    assert attention.heads == 4 // t and attention.o.in_features == 4 // t * 10


@pytest.mark.parametrize("kernels", ["eager", "megatron"])
def test_mla_flash_attention_computes_the_math_form_and_its_gradients(kernels: str) -> None:
    torch.manual_seed(0)
    flash = LatentAttention(replace(SMALL, attention="flash", kernels=kernels)).double()  # type: ignore[arg-type]
    math_form = LatentAttention(replace(SMALL, attention="math", kernels=kernels)).double()  # type: ignore[arg-type]
    math_form.load_state_dict(flash.state_dict())
    x = torch.randn(2, 16, 64, dtype=torch.float64, requires_grad=True)
    residual = torch.zeros_like(x)
    out, reference = flash(x, residual), math_form(x, residual)
    assert torch.allclose(out, reference)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, flash.kv_up.weight, flash.q_down.weight], grad)  # type: ignore[union-attr]
    want = torch.autograd.grad(reference, [x, math_form.kv_up.weight, math_form.q_down.weight],  # type: ignore[union-attr]
                               grad)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b)


def test_mla_attention_counts_its_two_head_widths() -> None:
    """FlashAttention's forward is ``b·a·s²·(d_qk + d_v)`` for heads of query/key width d_qk and value width d_v
    (Note [flash attention] in sim.planning.counting.operators): here 20 and 10."""
    spec = get_model("deepseek:layers=2,hidden=64,heads=4,ffn=96,experts=8,top-k=2,expert-ffn=32,seq=16,vocab=100,"
                     "dense-layers=1,mtp=0,q-lora=24,kv-lora=16,rope-dim=8,nope-dim=12,v-dim=10")
    table = spec.count(torch.bfloat16).layers[1].forward
    core = (table.kinds_or_default() == MATMUL) & ~table.linear_or_default()
    assert table.flops_at(1)[core].tolist() == [4 * 16 * 16 * (20 + 10)]
    assert table.dims_or_default()[core, :, 1].tolist() == [[4 * 16, 0, 0]]  # M = b·a·s; N = s and K fixed
    assert table.dims_or_default()[core, 1:, 0].tolist() == [[16, 15]]  # K the two widths' mean


@pytest.mark.parametrize(("field", "value", "says"), [
    ("qk_rope_head_dim", 7, "qk_rope_head_dim=7 is odd"),
    ("kv_lora_rank", 0, "kv_lora_rank must be an integer >= 1, got 0"),
    ("n_kv_head", 2, "MLA has its own keys and values"),
    ("qk_norm", True, "MLA has its own keys and values"),
    ("position", "learned", "decoupled RoPE"),
    ("attention_kind", "latent", "attention_kind must be 'standard' or 'mla'"),
])
def test_an_mla_config_refuses_a_bad_option(field: str, value: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        replace(SMALL, **{field: value})  # type: ignore[arg-type]
