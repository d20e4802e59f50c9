"""The parts every decoder block is made of, whatever its attention and MLP: RoPE's tables, the norms, and the end
of a residual branch (the layers: :mod:`sim.planning.counting.models.decoder_layers`,
:mod:`sim.planning.counting.models.mla`, :mod:`sim.planning.counting.models.moe_layers`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sim.planning.counting.models.decoder import DecoderConfig
from sim.planning.counting.models.kernels import bias_dropout_add, rms_norm
from sim.planning.counting.modules import recompute_module
from sim.planning.counting.tensor_parallel import reduce_from_tensor_parallel

__all__ = ["Branch", "make_norm", "normalise", "rope_tables", "rotate"]


def rope_tables(cfg: DecoderConfig, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, (T, d) for heads of ``width`` d (the config's heads where ``None``):
    pair i turns at ``rope_theta ** (-2i/d)`` per position."""
    d = cfg.head_dim if width is None else width
    inv_freq = cfg.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)  # (d/2,)
    angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), inv_freq)  # (T, d/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, d): the two halves of a head rotate as pairs
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, heads, T, d): element i of the first half and element i of the second turn as one pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Branch(nn.Module):
    """A residual branch (attention, MLP) that ends in a row-parallel linear layer, then its bias, dropout and the
    residual add, fused where Megatron fuses them (Note [fused kernels] in
    :mod:`sim.planning.counting.models.decoder_layers`)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout
        self.fused = cfg.kernels == "megatron"
        self.fused_residual = self.fused and (cfg.bias or cfg.dropout > 0)
        self.group, self.sequence_parallel = cfg.tensor_parallel, cfg.sequence_parallel

    def _end(self, linear: nn.Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus ``linear(x)`` reduced over the ranks, with its dropout (``residual`` is this rank's tokens
        with sequence parallelism)."""
        sp = self.sequence_parallel
        if self.fused_residual:  # the bias after the all-reduce, in bias_dropout_add
            out = reduce_from_tensor_parallel(F.linear(x, linear.weight), self.group, sp)
            return bias_dropout_add(out, linear.bias, residual, self.p if self.training else 0.0)[0]
        return residual + self.drop(reduce_from_tensor_parallel(linear(x), self.group, sp))  # (B, T or T/t, C)


def make_norm(cfg: DecoderConfig, width: int | None = None) -> nn.Module:
    """The config's norm over ``width`` features (the hidden size where ``None``)."""
    features = cfg.d_model if width is None else width
    if cfg.norm == "layernorm":
        return nn.LayerNorm(features, eps=cfg.norm_eps)
    return nn.RMSNorm(features, eps=cfg.norm_eps)


def normalise(norm: nn.Module, x: torch.Tensor, fused: bool) -> torch.Tensor:
    """``norm(x)``; an RMSNorm as TransformerEngine's fused kernel where ``fused`` (Note [fused kernels] in
    :mod:`sim.planning.counting.models.decoder_layers`)."""
    with recompute_module("layernorm"):  # Note [recompute modules] in sim.planning.counting.modules
        if fused and isinstance(norm, nn.RMSNorm):
            return rms_norm(x, norm.weight, norm.eps)[0]
        return norm(x)
