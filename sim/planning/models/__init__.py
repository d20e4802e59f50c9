"""Built-in models as real ``nn.Sequential`` modules, and a registry that names them.

Specs::

    gpt:1.3b          a GPT-3 size (125m, 350m, 760m, 1.3b, 2.7b, 6.7b, 13b, 175b)
    resnet101         ResNet-101 in torchgpipe's 370-layer flattening
    unet:B,C          U-Net (B, C): B convolutions per block, C channels at the top (unet = unet:5,64)
    amoebanet:L,D     AmoebaNet-D (L, D): L normal cells, D filters (amoebanet = amoebanet:18,256)

:func:`get_model` returns a :class:`ModelSpec`, which builds the module (on the meta device by
default, so a 175B model costs nothing) and a sample input of any batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from sim.planning.models.amoebanet import amoebanet, amoebanet_sample, check_amoebanet
from sim.planning.models.gpt import CONFIGS, gpt, gpt_config, gpt_sample
from sim.planning.models.resnet import resnet101, resnet_sample
from sim.planning.models.unet import check_unet, unet, unet_sample

__all__ = ["KNOWN", "ModelSpec", "get_model"]

#: The spec forms :func:`get_model` understands, for messages and ``--help``.
KNOWN = ("gpt:" + "|".join(CONFIGS), "resnet101", "unet:B,C", "amoebanet:L,D")


@dataclass(frozen=True)
class ModelSpec:
    """A named model: how to build it and how to make an input for it.

    Attributes:
        name: the canonical spec (``"gpt:1.3b"``, ``"unet:5,64"``).
        description: for display.
        builder: builds the module under the current default device.
        sampler: ``(batch, device) -> input``.
    """

    name: str
    description: str
    builder: Callable[[], nn.Sequential]
    sampler: Callable[[int, str], torch.Tensor]

    def module(self, device: str | torch.device = "meta", dtype: torch.dtype | None = None) -> nn.Sequential:
        """Build the model on ``device`` (meta by default: nothing is allocated), in ``dtype`` if given."""
        with torch.device(device):
            model = self.builder()
        return model.to(dtype) if dtype is not None else model

    def sample(self, batch: int, device: str | torch.device = "meta") -> torch.Tensor:
        """An input of ``batch`` samples (random on a real device, shapes only on meta)."""
        if batch < 1:
            raise ValueError(f"a batch needs at least one sample, got {batch}")
        return self.sampler(batch, str(device))


def _ints(spec: str, arg: str, names: tuple[str, str]) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in arg.split(","))
    except ValueError:
        raise KeyError(f"model {spec!r}: expected two integers {names[0]},{names[1]} after ':'") from None
    return a, b


def get_model(spec: str) -> ModelSpec:
    """Parse a model spec (see the module docstring) into a :class:`ModelSpec`.

    Raises:
        KeyError: an unknown model or size; the message lists the known specs.
        ValueError: known model, invalid sizes (e.g. ``unet:0,64``).
    """
    text = spec.strip().lower()
    family, _, arg = text.partition(":")
    if family == "gpt":
        cfg = gpt_config(arg or "125m")
        key = arg or "125m"
        return ModelSpec(f"gpt:{key}", f"GPT-3 {key.upper()} ({cfg.n_layer} layers, d_model {cfg.d_model}, "
                         f"{cfg.n_head} heads, {cfg.seq_len} tokens)",
                         lambda: gpt(cfg), lambda b, d: gpt_sample(cfg, b, d))
    if family in ("resnet101", "resnet") and arg in ("", "101"):
        return ModelSpec("resnet101", "ResNet-101, 370 layers (torchgpipe's flattening), 224x224 images",
                         resnet101, lambda b, d: resnet_sample(b, 224, d))
    if family == "unet":
        blocks, channels = _ints(spec, arg, ("B", "C")) if arg else (5, 64)
        check_unet(blocks, channels)
        return ModelSpec(f"unet:{blocks},{channels}", f"U-Net ({blocks}, {channels}), 192x192 images",
                         lambda: unet(blocks, channels), lambda b, d: unet_sample(b, 192, d))
    if family == "amoebanet":
        layers, filters = _ints(spec, arg, ("L", "D")) if arg else (18, 256)
        check_amoebanet(layers, filters)
        return ModelSpec(f"amoebanet:{layers},{filters}", f"AmoebaNet-D ({layers}, {filters}), 224x224 images",
                         lambda: amoebanet(layers, filters), lambda b, d: amoebanet_sample(b, 224, d))
    raise KeyError(f"unknown model {spec!r}; known: {', '.join(KNOWN)}")
