"""Cutting a mini-batch into micro-batches and putting the outputs back together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gpipe.checks import check_positive

__all__ = ["as_tensors", "gather", "scatter", "sizes"]


def as_tensors(value: Any, what: str) -> tuple[bool, tuple[Tensor, ...]]:
    """``(was_tuple, tensors)``; a clear error for anything but a tensor or a tuple of tensors."""
    if isinstance(value, Tensor):
        return False, (value,)
    if isinstance(value, tuple) and value and all(isinstance(t, Tensor) for t in value):
        return True, value
    if isinstance(value, tuple):
        kinds = ", ".join(type(t).__name__ for t in value) or "empty"
        raise TypeError(f"{what} must be a tensor or a tuple of tensors, got a tuple of ({kinds}); pass other "
                        "values as tensors or keep them inside the layers")
    raise TypeError(f"{what} must be a tensor or a tuple of tensors, got {type(value).__name__}")


def sizes(batch: int, chunks: int) -> list[int]:
    """The micro-batch sizes :func:`scatter` cuts a batch of ``batch`` samples into, in order: they differ by at most
    one sample, the larger first, and their count is the step's ``m``.

    A batch smaller than ``chunks`` runs as that many micro-batches of one sample each, as torchgpipe's
    ``tensor.chunk`` does, so the last, short batch of an epoch trains; the schedule then has fewer
    micro-batches. Otherwise there are exactly ``chunks`` (``torch.chunk`` may return fewer pieces than asked even
    then, which would change the schedule behind the user's back).

    Raises:
        ValueError: an empty batch, or ``chunks`` below 1.
    """
    check_positive("chunks", chunks)
    if batch < 1:
        raise ValueError("the batch is empty (dim 0 has size 0): there is nothing to split into micro-batches; "
                         "skip empty batches before the pipeline")
    pieces = min(chunks, batch)
    return [batch // pieces + (1 if k < batch % pieces else 0) for k in range(pieces)]


def scatter(tensors: tuple[Tensor, ...], chunks: int) -> list[tuple[Tensor, ...]]:
    """Split every tensor along dim 0 into micro-batches of :func:`sizes` (views, as ``torch.split`` makes).

    Raises:
        ValueError: an empty batch, a 0-d tensor, unequal batch sizes, or a sparse or meta tensor.
    """
    for t in tensors:
        if t.is_sparse or t.layout != torch.strided:
            raise ValueError(f"inputs must be dense tensors, got a {t.layout} one: convert it with .to_dense() "
                             "before the pipeline, or keep it inside a layer")
        if t.is_meta:
            raise ValueError("inputs must hold data, got a tensor on the meta device: the executor runs real "
                             "tensors (the simulator's FLOP counting, sim.planning.counting.flops, takes meta tensors)")
    batches = {t.size(0) if t.dim() else None for t in tensors}
    if None in batches:
        raise ValueError("inputs need a batch dimension (dim 0) to be split into micro-batches; got a 0-d tensor")
    if len(batches) != 1:
        raise ValueError(f"every input tensor needs the same batch size (dim 0), got {sorted(map(str, batches))}")
    batch = batches.pop()
    assert batch is not None
    rows = sizes(batch, chunks)
    pieces = [torch.split(t, rows, dim=0) for t in tensors]
    return [tuple(p[i] for p in pieces) for i in range(len(rows))]


def gather(outputs: Sequence[tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """Concatenate the micro-batch outputs along dim 0, element by element."""
    width = len(outputs[0])
    for out in outputs:
        if len(out) != width:
            raise RuntimeError(f"the last partition returned {len(out)} tensors for one micro-batch and {width} "
                               "for another; it must return the same structure every time")
        for t in out:
            if t.dim() == 0:
                raise RuntimeError("the last partition returned a 0-d tensor: outputs need a batch dimension "
                                   "to be gathered; compute the loss outside the pipeline")
    if len(outputs) == 1:
        return outputs[0]
    return tuple(torch.cat([out[k] for out in outputs], dim=0) for k in range(width))
