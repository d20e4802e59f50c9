"""The ablation's costs counted from the project's own U-Net on the ``meta`` device and the catalog's P40.

:func:`counted_unet` counts U-Net (B, C) (:mod:`sim.planning.counting.models.unet`) with the planner's counter
(:func:`sim.planning.counting.flops.count_layers`), times every kernel by the device's roofline
(:class:`sim.planning.costs.from_flops.FlopCosts`) and sums each stage of the balance: a
:class:`~sim.ablation.study.UNetSetup` with no number fitted to the ablation. The boundary tensors are read off
a meta forward pass of the micro-batch: the activation is the tuple's first tensor, each further tensor a skip
(:mod:`sim.planning.counting.models.layers`), from the layer that appends it to the layer that takes it back.
:func:`one_device_throughput` predicts torchgpipe's one-P40 U-Net benchmark with the same counts, the evidence
the ablation page uses for how fast this model's kernels really run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from sim.ablation.study import Skip, UNetSetup
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import ModelProfile, count_layers
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_device, get_link

__all__ = ["BALANCE", "ONE_P40", "SkipTensor", "counted_costs", "counted_unet", "one_device_throughput",
           "tuple_tensors"]

#: torchgpipe's balance for U-Net (5, 64) on 4 P40s (``benchmarks/unet-timeline/main.py``).
BALANCE = (34, 76, 70, 61)
#: torchgpipe's U-Net (5, 64) on one P40 without a pipeline: (batch, samples/s); ``benchmarks/unet-speed``.
ONE_P40 = (40, 28.500)
TRAINING = "fp32-sgd"  # the benchmarks train in fp32 with plain SGD


@dataclass(frozen=True)
class SkipTensor:
    """A skip of a tuple-passing sequential: appended by layer ``source``, taken back by layer ``destination``."""

    source: int
    destination: int
    bytes: int


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tuple_tensors(module: nn.Sequential, sample: torch.Tensor) -> tuple[list[int], list[SkipTensor]]:
    """Walk ``module`` on meta tensors: the bytes of the activation after each layer, and every skip.

    A layer whose output tuple is longer than its input appended skips (the last ones); shorter, it took the
    last ones back (the convention of :mod:`sim.planning.counting.models.layers`).

    Raises:
        ValueError: a skip is never taken back.
    """
    x: torch.Tensor | tuple[torch.Tensor, ...] = sample.to("meta")
    open_skips: list[tuple[int, int]] = []  # (layer that appended it, bytes), innermost last
    activation, skips = [], []
    with torch.no_grad():
        for k, layer in enumerate(module):
            before = len(x) - 1 if isinstance(x, tuple) else 0
            x = layer(x)
            parts = x if isinstance(x, tuple) else (x,)
            after = len(parts) - 1
            for t in parts[1 + before:]:
                open_skips.append((k, _bytes(t)))
            for _ in range(before - after):
                source, nbytes = open_skips.pop()
                skips.append(SkipTensor(source, k, nbytes))
            activation.append(_bytes(parts[0]))
    if open_skips:
        raise ValueError(f"{len(open_skips)} skip(s) appended by layers {[s for s, _ in open_skips]} are never "
                         "taken back; the model must end with a single tensor")
    return activation, skips


@lru_cache(maxsize=4)
def _profile(blocks: int, channels: int) -> tuple[nn.Sequential, ModelProfile]:
    spec = get_model(f"unet:{blocks},{channels}")
    module = spec.module("meta")
    return module, count_layers(module, spec.sample(2))


def counted_costs(blocks: int = 5, channels: int = 64, device: str = "tesla-p40") -> FlopCosts:
    """The counted U-Net (B, C) priced on ``device`` (fp32, SGD): the costs :func:`counted_unet` sums."""
    return FlopCosts(_profile(blocks, channels)[1], get_device(device), TRAINING)


def _stage_of(layer: int, bounds: np.ndarray) -> int:
    return int(np.searchsorted(bounds, layer, side="right")) - 1


def counted_unet(blocks: int = 5, channels: int = 64, batch: int = 128, chunks: int = 8,
                 balance: Sequence[int] = BALANCE, device: str = "tesla-p40", link: str = "pcie3-x16") -> UNetSetup:
    """U-Net (B, C) counted on the meta device and priced on ``device``, cut by ``balance``, one micro-batch of
    ``batch / chunks`` samples (the defaults are torchgpipe's ablation).

    Stage seconds are the roofline's per kernel, summed over the stage's layers; the optimizer step is plain SGD's;
    bytes are those of the real boundary tensors of one micro-batch.

    Raises:
        ValueError: ``chunks`` does not divide ``batch``, or the balance does not cover the model's layers.
    """
    if chunks < 1 or batch % chunks:
        raise ValueError(f"chunks ({chunks}) must divide the mini-batch ({batch}): the ablation's micro-batches "
                         "are equal")
    return _counted(blocks, channels, batch, chunks, tuple(int(b) for b in balance), device, link)


@lru_cache(maxsize=8)
def _counted(blocks: int, channels: int, batch: int, chunks: int, balance: tuple[int, ...], device: str,
             link: str) -> UNetSetup:
    microbatch = batch // chunks
    module, _ = _profile(blocks, channels)
    costs = counted_costs(blocks, channels, device)
    stages = costs.stages(balance, microbatch)  # checks the balance
    activation, skips = tuple_tensors(module, get_model(f"unet:{blocks},{channels}").sample(microbatch))
    bounds = np.cumsum([0, *balance])
    crossing = []
    for s in skips:
        a, b = _stage_of(s.source, bounds), _stage_of(s.destination, bounds)
        if a != b:  # a skip within one stage never leaves its device
            crossing.append(Skip(a, b, s.bytes))
    return UNetSetup(
        chunks=chunks, batch=batch,
        forward=tuple(s.forward for s in stages), backward=tuple(s.backward for s in stages),
        activation_bytes=tuple(activation[int(b) - 1] for b in bounds[1:-1]),
        skips=tuple(crossing),
        update_seconds=tuple(costs.update_seconds(balance)),
        saved_bytes=tuple(s.saved_bytes for s in stages),
        checkpoint_bytes=tuple(s.checkpoint_bytes for s in stages),
        checkpoint="except_last", link=get_link(link),
    )


def one_device_throughput(batch: int = ONE_P40[0], blocks: int = 5, channels: int = 64,
                          device: str = "tesla-p40") -> float:
    """Samples/s of U-Net (B, C) trained on one device without a pipeline, as the counter prices it: one
    forward, one backward and the optimizer step per mini-batch of ``batch`` samples."""
    costs = counted_costs(blocks, channels, device)
    forward, backward = costs.layer_seconds(batch)
    return batch / float(forward.sum() + backward.sum() + costs.update_seconds((len(forward),))[0])
