"""ResNet-101 (He et al., 2016) as a flat ``nn.Sequential`` of 370 layers, the layout torchgpipe benchmarks.

The published pipeline balances (``[135, 235]``, ``[44, 92, 124, 110]``, ...) count these layers, so
the layout is the one torchgpipe's benchmark builds: the stem as four layers, every bottleneck as
eleven, and the classifier as three::

    conv1 bn1 relu maxpool                                        4
    per bottleneck (3 + 4 + 23 + 3 = 33 of them):                 33 x 11 = 363
        fork  conv1 bn1 relu1  conv2 bn2 relu2  conv3 bn3  residual relu3
    avgpool flatten fc                                            3
                                                                  -----
                                                                  370

``fork`` starts the skip connection (see :mod:`sim.planning.counting.models.layers`); ``residual`` adds the carried
input, through a strided 1x1 convolution and batch norm where the shape changes (the downsample).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from sim.planning.counting.models.layers import Fork, OnFirst

__all__ = ["Residual", "resnet", "resnet101", "resnet_sample"]


class Residual(nn.Module):
    """Ends a skip: ``(x, identity) -> x + downsample(identity)``."""

    def __init__(self, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.downsample = downsample if downsample is not None else nn.Identity()

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out, identity = x
        return out + self.downsample(identity)


def _bottleneck(prefix: str, inplanes: int, planes: int, stride: int) -> list[tuple[str, nn.Module]]:
    """The eleven layers of one bottleneck (1x1 reduce, 3x3, 1x1 expand by 4, residual add)."""
    out = planes * 4
    downsample = None
    if stride != 1 or inplanes != out:
        downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
    return [
        (f"{prefix}_fork", Fork()),
        (f"{prefix}_conv1", OnFirst(nn.Conv2d(inplanes, planes, 1, bias=False))),
        (f"{prefix}_bn1", OnFirst(nn.BatchNorm2d(planes))),
        (f"{prefix}_relu1", OnFirst(nn.ReLU())),
        (f"{prefix}_conv2", OnFirst(nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False))),
        (f"{prefix}_bn2", OnFirst(nn.BatchNorm2d(planes))),
        (f"{prefix}_relu2", OnFirst(nn.ReLU())),
        (f"{prefix}_conv3", OnFirst(nn.Conv2d(planes, out, 1, bias=False))),
        (f"{prefix}_bn3", OnFirst(nn.BatchNorm2d(out))),
        (f"{prefix}_residual", Residual(downsample)),
        (f"{prefix}_relu3", nn.ReLU()),
    ]


def resnet(blocks: Sequence[int] = (3, 4, 23, 3), width: int = 64, num_classes: int = 1000) -> nn.Sequential:
    """A bottleneck ResNet as a flat sequential (``blocks=(3, 4, 23, 3)`` is ResNet-101).

    Args:
        blocks: bottlenecks in each of the four stages.
        width: channels of the stem (64 in the paper); a small value makes a tiny model for tests.
        num_classes: outputs of the classifier.

    Raises:
        ValueError: not four stages, a stage without blocks, or a width below 1.
    """
    if len(blocks) != 4 or min(blocks) < 1 or width < 1:
        raise ValueError(f"need four stages of >= 1 blocks and width >= 1, got blocks={tuple(blocks)}, width={width}")
    layers: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)),
        ("bn1", nn.BatchNorm2d(width)),
        ("relu", nn.ReLU()),
        ("maxpool", nn.MaxPool2d(3, stride=2, padding=1)),
    ]
    inplanes = width
    for stage, count in enumerate(blocks):
        planes = width * 2**stage
        for b in range(count):
            stride = 2 if stage > 0 and b == 0 else 1
            layers += _bottleneck(f"layer{stage + 1}_{b}", inplanes, planes, stride)
            inplanes = planes * 4
    layers += [
        ("avgpool", nn.AdaptiveAvgPool2d(1)),
        ("flatten", nn.Flatten()),
        ("fc", nn.Linear(inplanes, num_classes)),
    ]
    return nn.Sequential(OrderedDict(layers))


def resnet101(num_classes: int = 1000) -> nn.Sequential:
    """ResNet-101: 370 layers, 44.5M parameters."""
    return resnet((3, 4, 23, 3), 64, num_classes)


def resnet_sample(batch: int, size: int = 224, device: torch.device | str = "meta") -> torch.Tensor:
    """A batch of images, ``(batch, 3, size, size)``; random on a real device (fake data, as torchgpipe)."""
    if str(device) == "meta":
        return torch.empty(batch, 3, size, size, device="meta")
    return torch.rand(batch, 3, size, size, device=device)
