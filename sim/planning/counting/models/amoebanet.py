"""AmoebaNet-D (L, D) as an ``nn.Sequential`` of cells: the image classifier GPipe and torchgpipe scale.

Real et al. (2019), "Regularized Evolution for Image Classifier Architecture Search", found the cells;
GPipe (Huang et al., 2019) scales the network by ``L`` normal cells and ``D`` filters. Layout for a
224x224 input::

    stem            relu, conv 3x3 stride 2, batch norm             D/4 channels, 112x112
    2 reduction cells                                               D/2 then D,   28x28
    L/3 normal cells, reduction, L/3 normal, reduction, L/3 normal  D, 2D, 4D,    7x7
    classifier      global average pool, linear

A cell takes the two previous cell outputs ``(prev, prev_prev)`` as a tuple and returns
``(out, prev)`` (see :mod:`sim.planning.counting.models.layers`). Inside, both inputs are brought to the cell's
channels (relu-conv 1x1-bn, or a factorised reduction after a reduction cell), then five nodes each
add two operations of earlier states, and the output concatenates some states. The genotype is
AmoebaNet-D's as in TensorFlow's reference implementation (``tensorflow/tpu``, ``amoeba_net``), which
concatenates states ``[0, 3, 4, 6]`` in the normal cell; with it the parameter counts come out as
GPipe's Table 1 and torchgpipe's (81.5M for (18, 208)).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import nn

from sim.planning.counting.models.limits import check_amoebanet_size

__all__ = ["Cell", "amoebanet", "amoebanet_sample", "check_amoebanet"]


def _relu_conv_bn(c_in: int, c_out: int, kernel: int | tuple[int, int] = 1,
                  stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(c_in, c_out, kernel, stride, padding, bias=False), nn.BatchNorm2d(c_out))


class FactorizedReduce(nn.Module):
    """Halves the resolution with two offset strided 1x1 convolutions, each giving half the channels."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.even = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.odd = nn.Conv2d(c_in, c_out - c_out // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        shifted = nn.functional.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.even(x), self.odd(shifted)], dim=1))


# -- the operations of the search space, each (channels, stride) -> module --------------------------

def _identity(c: int, stride: int) -> nn.Module:
    return nn.Identity() if stride == 1 else FactorizedReduce(c, c)


def _avg3(c: int, stride: int) -> nn.Module:
    return nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)


def _max3(c: int, stride: int) -> nn.Module:
    return nn.MaxPool2d(3, stride=stride, padding=1)


def _max2(c: int, stride: int) -> nn.Module:
    return nn.MaxPool2d(2, stride=stride)


def _conv1(c: int, stride: int) -> nn.Module:
    return _relu_conv_bn(c, c, 1, stride)


def _conv3(c: int, stride: int) -> nn.Module:
    """Bottlenecked 3x3: 1x1 to c/4, 3x3, 1x1 back to c."""
    q = c // 4
    return nn.Sequential(_relu_conv_bn(c, q), _relu_conv_bn(q, q, 3, stride, 1), _relu_conv_bn(q, c))


def _conv17_71(c: int, stride: int) -> nn.Module:
    """Bottlenecked factorised 7x7: 1x1 to c/4, 1x7, 7x1, 1x1 back to c."""
    q = c // 4
    return nn.Sequential(_relu_conv_bn(c, q), _relu_conv_bn(q, q, (1, 7), (1, stride), (0, 3)),
                         _relu_conv_bn(q, q, (7, 1), (stride, 1), (3, 0)), _relu_conv_bn(q, c))


Op = Callable[[int, int], nn.Module]

# (input state, operation) pairs; node k (state k + 2) adds pair 2k and pair 2k + 1.
NORMAL: tuple[tuple[int, Op], ...] = (
    (1, _conv1), (1, _max3),
    (1, _identity), (0, _conv17_71),
    (0, _conv1), (0, _conv17_71),
    (2, _max3), (2, _identity),
    (1, _avg3), (5, _conv1),
)
NORMAL_CONCAT = (0, 3, 4, 6)
REDUCTION: tuple[tuple[int, Op], ...] = (
    (0, _max2), (0, _max3),
    (2, _identity), (1, _conv3),
    (2, _conv17_71), (2, _max3),
    (3, _identity), (1, _max2),
    (2, _avg3), (3, _conv1),
)
REDUCTION_CONCAT = (4, 5, 6)


class Cell(nn.Module):
    """One normal or reduction cell: ``(prev, prev_prev) -> (out, prev)`` (a bare tensor counts as both)."""

    def __init__(self, c_prev_prev: int, c_prev: int, c: int, reduction: bool, reduction_prev: bool) -> None:
        super().__init__()
        self.pre_prev = _relu_conv_bn(c_prev, c)
        self.pre_prev_prev: nn.Module
        if reduction_prev:
            self.pre_prev_prev = FactorizedReduce(c_prev_prev, c)
        elif c_prev_prev != c:
            self.pre_prev_prev = _relu_conv_bn(c_prev_prev, c)
        else:
            self.pre_prev_prev = nn.Identity()
        genotype, concat = (REDUCTION, REDUCTION_CONCAT) if reduction else (NORMAL, NORMAL_CONCAT)
        self.concat: tuple[int, ...] = concat
        self.inputs = tuple(i for i, _ in genotype)
        # in a reduction cell the operations on the two inputs (states 0, 1) stride by 2
        self.ops = nn.ModuleList(op(c, 2 if reduction and i < 2 else 1) for i, op in genotype)
        self.out_channels = c * len(self.concat)

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        prev, prev_prev = x if isinstance(x, tuple) else (x, x)
        states = [self.pre_prev(prev), self.pre_prev_prev(prev_prev)]
        for k in range(0, len(self.ops), 2):
            a, b = self.inputs[k], self.inputs[k + 1]
            states.append(self.ops[k](states[a]) + self.ops[k + 1](states[b]))
        return torch.cat([states[i] for i in self.concat], dim=1), prev

    def extra_repr(self) -> str:
        return f"inputs={self.inputs}, concat={self.concat}"


class Classifier(nn.Module):
    """Global average pool and a linear layer on the last cell's output."""

    def __init__(self, c_in: int, num_classes: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(x[0]), 1))


def check_amoebanet(layers: int, filters: int) -> None:
    """Raise ``ValueError`` unless L is a positive multiple of 3 and D a positive multiple of 16, both within the
    planner's caps (Note [size caps] in :mod:`sim.planning.counting.models.limits`)."""
    if layers < 3 or layers % 3 or filters < 16 or filters % 16:
        raise ValueError(f"AmoebaNet-D needs L a positive multiple of 3 and D a multiple of 16, "
                         f"got L={layers}, D={filters}")
    check_amoebanet_size(layers, filters)


def amoebanet(layers: int = 18, filters: int = 256, num_classes: int = 1000) -> nn.Sequential:
    """AmoebaNet-D (L, D): ``layers`` = L normal cells (a multiple of 3), ``filters`` = D.

    Raises:
        ValueError: see :func:`check_amoebanet`.
    """
    check_amoebanet(layers, filters)
    c = filters // 4
    seq: OrderedDict[str, nn.Module] = OrderedDict()
    seq["stem"] = _relu_conv_bn(3, c, 3, 2, 1)
    c_prev_prev = c_prev = c
    reduction_prev = False
    plan = ["reduction", "reduction"] + ["normal"] * (layers // 3) + ["reduction"] \
        + ["normal"] * (layers // 3) + ["reduction"] + ["normal"] * (layers // 3)
    counts = {"normal": 0, "reduction": 0}
    for kind in plan:
        reduction = kind == "reduction"
        if reduction:
            c *= 2
        cell = Cell(c_prev_prev, c_prev, c, reduction, reduction_prev)
        seq[f"{kind}{counts[kind]}"] = cell
        counts[kind] += 1
        c_prev_prev, c_prev, reduction_prev = c_prev, cell.out_channels, reduction
    seq["classifier"] = Classifier(c_prev, num_classes)
    return nn.Sequential(seq)


def amoebanet_sample(batch: int, size: int = 224, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of images, ``(batch, 3, size, size)``; random on a real device."""
    if str(device) == "meta":
        return torch.empty(batch, 3, size, size, device="meta")
    return torch.rand(batch, 3, size, size, device=device)
