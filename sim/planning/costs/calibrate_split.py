"""Measure what the executor's split backward adds on this CPU (Note [split overhead] in
:mod:`sim.planning.hardware.roofline`).

A middle stage of small layers (``LAYERS`` linear layers of ``WIDTH`` features and their ReLUs, ``ROWS`` rows: the
host-bound regime where the overhead shows) runs one whole backward, and the executor's ``B`` then ``W``
(:func:`gpipe.autograd.split_backward.backward_input` with its plans learnt, as a step reuses them), in turn for
``repeats`` rounds; each is the thread's CPU time, its median over the rounds. The counted model says which share of the
whole backward is ``B``'s kernels; what ``B`` and ``W`` take beyond their shares of the measured whole backward, per
parameter tensor, is the device's :attr:`~sim.planning.hardware.roofline.Roofline.split_input_seconds` and
:attr:`~sim.planning.hardware.roofline.Roofline.split_weight_seconds`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import torch
from torch import nn

from gpipe.autograd.split_backward import SplitPlans, backward_input
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import count_layers
from sim.planning.hardware.catalog import DeviceSpec

__all__ = ["LAYERS", "ROWS", "WIDTH", "SplitOverhead", "measure_split", "with_split_overhead"]

#: The measured stage: layers with parameters, their width, and the rows of one micro-batch.
LAYERS, WIDTH, ROWS = 16, 64, 8


@dataclass(frozen=True)
class SplitOverhead:
    """What one measurement found: seconds of the whole backward, of ``B`` and of ``W``, the counted share of
    ``B``, the stage's parameter tensors, and the overhead per tensor for ``B`` and for ``W``."""

    backward: float
    input: float
    weight: float
    input_share: float
    tensors: int
    input_seconds: float
    weight_seconds: float


def measure_split(device: DeviceSpec, repeats: int = 50, seed: int = 0) -> SplitOverhead:
    """Time the whole backward and ``B`` + ``W`` of the module docstring's stage, on the calling thread.

    ``device`` (a roofline without split seconds, as fitted) counts the stage's ``B`` share.

    Raises:
        ValueError: ``repeats`` below 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    torch.manual_seed(seed)
    stage = nn.Sequential(*(m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())))
    x = torch.randn(ROWS, WIDTH)
    params = [p for p in stage.parameters() if p.requires_grad]
    plans = SplitPlans(params)
    grad = torch.randn(ROWS, WIDTH)

    def whole() -> tuple[float, float]:
        out = stage(x.detach().requires_grad_())
        start = time.thread_time()
        torch.autograd.backward([out], [grad])
        return time.thread_time() - start, 0.0

    def split() -> tuple[float, float]:
        leaf = x.detach().requires_grad_()
        out = stage(leaf)
        start = time.thread_time()
        _, kept = backward_input([out], [grad], [leaf], params, plans)
        middle = time.thread_time()
        kept.accumulate()
        return middle - start, time.thread_time() - middle

    for run in (whole, split, whole, split):  # warm-up; the plan is learnt here
        run()
    samples: dict[str, list[tuple[float, float]]] = {"whole": [], "split": []}
    for _ in range(repeats):
        samples["whole"].append(whole())
        samples["split"].append(split())
    stage.zero_grad(set_to_none=True)
    backward = statistics.median(b for b, _ in samples["whole"])
    b_seconds = statistics.median(b for b, _ in samples["split"])
    w_seconds = statistics.median(w for _, w in samples["split"])
    costs = FlopCosts(count_layers(stage, x), device)
    counted_b, counted_w = (float(a.sum()) for a in costs.split_backward_seconds(ROWS))
    share = counted_b / (counted_b + counted_w) if counted_b + counted_w > 0 else 0.5
    tensors = len(params)
    return SplitOverhead(backward, b_seconds, w_seconds, share, tensors,
                         max(b_seconds - share * backward, 0.0) / tensors,
                         max(w_seconds - (1 - share) * backward, 0.0) / tensors)


def with_split_overhead(device: DeviceSpec, overhead: SplitOverhead) -> DeviceSpec:
    """``device`` with ``overhead``'s seconds per tensor in its roofline (unchanged without a roofline)."""
    if device.roofline is None:
        return device
    roofline = replace(device.roofline, split_input_seconds=overhead.input_seconds,
                       split_weight_seconds=overhead.weight_seconds)
    return replace(device, roofline=roofline)
