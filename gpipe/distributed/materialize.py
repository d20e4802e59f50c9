"""Parameters of a model built on the ``meta`` device, made real layer by layer, the same on every rank.

Note [materialised weights]: a rank holds only its stages, so it cannot draw every layer's initial weights from
one stream of random numbers as a model built eagerly does. Instead layer ``k`` (the ``k``-th child of the
``nn.Sequential``) is initialised under a generator seeded from ``(seed, k)``: :func:`materialize` on the whole
model in one process gives exactly the weights that the ranks of a :class:`gpipe.distributed.DistributedGPipe`
with the same ``seed`` and device type give their layers, whatever the balance and the world size. It is not
the model ``torch.manual_seed(seed)`` then eager construction would give. Layers that are not on ``meta`` are
moved as they are. The caller's random state is left as it was.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn

from gpipe.autograd.rng import mix_seed

__all__ = ["Init", "materialize", "materialize_layer"]

Init = Callable[[nn.Module], None]
"""Fills a layer's parameters and buffers in place (called under the layer's own seed)."""


def materialize(module: nn.Sequential, device: torch.device | str = "cpu", seed: int = 0,
                init: Init | None = None) -> nn.Sequential:
    """Every layer of ``module`` on ``device``, a ``meta`` one initialised from ``(seed, k)`` (Note [materialised
    weights]); ``module`` is changed in place and returned."""
    for k, layer in enumerate(module):
        materialize_layer(layer, k, torch.device(device), seed, init)
    return module


def materialize_layer(layer: nn.Module, k: int, device: torch.device, seed: int, init: Init | None) -> None:
    """Layer ``k`` on ``device``: moved if real, made and initialised if on ``meta``.

    Raises:
        ValueError: a meta layer has parameters or buffers in a module without ``reset_parameters()`` and no
            ``init`` was given.
    """
    tensors = list(itertools.chain(layer.parameters(), layer.buffers()))
    if not any(t.is_meta for t in tensors):
        layer.to(device)
        return
    fill = init or _reset
    if init is None:
        _check_resettable(layer, k)
    layer.to_empty(device=device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(mix_seed(seed, k))
        fill(layer)


def _owns(module: nn.Module) -> bool:
    return bool(list(module.parameters(recurse=False)) or list(module.buffers(recurse=False)))


def _check_resettable(layer: nn.Module, k: int) -> None:
    for name, module in layer.named_modules():
        if _owns(module) and not callable(getattr(module, "reset_parameters", None)):
            where = f"layer {k}" + (f" ({name})" if name else "")
            raise ValueError(f"{where} is a {type(module).__name__} on the meta device with parameters or buffers "
                             "but no reset_parameters() to initialise them: give DistributedGPipe(init=fn), fn(layer) "
                             "filling a layer in place, or build that layer on a real device")


def _reset(layer: nn.Module) -> None:
    for module in layer.modules():
        if _owns(module):
            module.reset_parameters()  # type: ignore[operator]
