"""What FP8 training keeps for the backward (Note [fp8 saved] in sim.planning.counting.saved): a Linear's input as
its FP8 copy, one byte an element, where only Linears keep it; BF16 beside the copy where another operator keeps it
too; the first and last layers in BF16."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from torch import nn

from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_device

S, H, F = 16, 128, 256  # tokens, hidden, SwiGLU width
LLAMA = f"llama:layers=2,hidden={H},heads=8,kv-heads=2,ffn={F},seq={S},vocab=100"  # FlashAttention, fused kernels


@cache
def _llama() -> ModelProfile:
    return get_model(LLAMA).count(torch.bfloat16)


def _saved(profile: ModelProfile, training: str, b: int) -> list[int]:
    return [s.saved_bytes for s in FlopCosts(profile, get_device("h100-sxm"), training).stages([1, 2, 1], b)]


@pytest.mark.parametrize("b", [1, 3])
def test_a_llama_block_keeps_its_linears_inputs_in_fp8(b: int) -> None:
    # A block's Linears read four tensors: norm1's output (q, k, v: one fused TE module, one copy), attention's output
    # (o; FlashAttention keeps it too, so BF16 stays beside the copy), norm2's output (gate, up) and SwiGLU's output
    # (down). In FP8: -2 s h + s h, + s h, -2 s h + s h, -2 s F + s F bytes a sample: s (h + F) fewer.
    bf16, fp8 = _saved(_llama(), "bf16-adam", b), _saved(_llama(), "fp8-adam", b)
    assert bf16[1] - fp8[1] == 2 * b * S * (H + F)  # the stage of the two blocks
    assert (fp8[0], fp8[2]) == (bf16[0], bf16[2])  # embedding and head run in BF16 (outside fp8_autocast)


def test_the_fp8_bytes_are_counted_beside_the_bf16_ones() -> None:
    block = _llama().layers[1]
    assert sum(h.bf16[1] for h in block.held) == block.saved_bytes[1]
    assert sum(h.fp8[1] for h in block.held) == block.saved_bytes[1] - S * (H + F)


def test_a_linear_whose_input_only_it_keeps_keeps_one_byte_an_element() -> None:
    width, tokens, b = 64, 32, 2
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(4)])
    profile = count_layers(model, torch.empty(b, tokens, width), dtype=torch.bfloat16)
    bf16, fp8 = (FlopCosts(profile, get_device("h100-sxm"), t).stages([1, 2, 1], b) for t in ("bf16-adam", "fp8-adam"))
    assert bf16[1].saved_bytes == 2 * (2 * b * tokens * width)  # each middle Linear's input in BF16
    assert fp8[1].saved_bytes == 2 * (1 * b * tokens * width)  # its FP8 copy
    assert (fp8[0].saved_bytes, fp8[2].saved_bytes) == (bf16[0].saved_bytes, bf16[2].saved_bytes)
