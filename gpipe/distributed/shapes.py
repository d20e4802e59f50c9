"""A dry run of the whole model on fake tensors: a shape mismatch between stages refused before anything is sent.

Note [a dry run on fake tensors]: every rank holds the whole ``nn.Sequential`` (its own layers real, the others
as built, real or on ``meta``), so every rank can run it end to end under ``FakeTensorMode``: tensors that carry
a shape, a dtype and a device and no data, cheap whatever the model's size. It runs once per structure of the
first micro-batch, in eval mode (no buffer moves, no random draw) and restores every module's mode after. A
layer that fails at the first layer of a stage, fed what the stage before it made, is a mismatch between stages:
the step is refused on every rank (each finds it alike) with both shapes. Anything else the dry run cannot follow
(an operator fake tensors do not support, data-dependent shapes, an error inside a stage) ends the dry run
quietly, and the real step reports what happens. Each layer's forward thus runs once more, on fake tensors, on
every rank: ``DistributedGPipe(check_shapes=False)`` for a forward that must not (side effects on real data).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gpipe.transport.structure import Structure, describe, structure_of

__all__ = ["check_boundaries"]


def check_boundaries(layers: Sequence[nn.Module], balance: Sequence[int], structure: Structure) -> None:
    """Run ``layers`` on fake tensors of the first micro-batch's ``structure`` (Note [a dry run on fake tensors]).

    Raises:
        ValueError: the first layer of a stage cannot take what the stage before it outputs.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    starts = {sum(balance[:j]): j for j in range(1, len(balance))}
    modes = [(m, m.training) for layer in layers for m in layer.modules()]
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, quiet.disabled = quiet.disabled, True
    try:
        for layer in layers:
            layer.train(False)
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            is_tuple, entries = structure
            made = tuple(None if e is None else torch.empty(e[1], dtype=e[0], device=_device(layers[0]))
                         for e in entries)
            x: Any = made if is_tuple else made[0]
            for index, layer in enumerate(layers):
                x = _to(x, _device(layer))
                try:
                    x = layer(x)
                except Exception as error:  # noqa: BLE001 - see Note [a dry run on fake tensors]
                    if index in starts and isinstance(error, (RuntimeError, ValueError, TypeError, IndexError)) \
                            and type(error).__module__ == "builtins":
                        j = starts[index]
                        made = x if isinstance(x, tuple) else (x,)
                        given = describe(structure_of(list(made), isinstance(x, tuple)))
                        raise ValueError(
                            f"shape mismatch between stages {j - 1} and {j}: stage {j - 1} outputs {given}, and "
                            f"stage {j}'s first layer (layer {index}, {type(layer).__name__}) cannot take it: "
                            f"{type(error).__name__}: {str(error).splitlines()[0]} (fix the layers at the boundary, "
                            "or move it with the balance)") from None
                    return
    finally:
        quiet.disabled = was_disabled
        for module, training in modes:
            module.training = training


def _device(layer: nn.Module) -> torch.device:
    for t in (*layer.parameters(), *layer.buffers()):
        return t.device
    return torch.device("cpu")


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, Tensor):
        return x if x.device == device else x.to(device)
    if isinstance(x, tuple):
        return tuple(_to(t, device) for t in x)
    return x
