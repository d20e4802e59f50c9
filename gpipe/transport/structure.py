"""A message's structure on the wire: the tuple flag, each entry's dtype and shape or ``None``, in a fixed header.

Note [structure once]: a receiver must allocate a buffer before it posts a receive, so it must know the shapes
in advance. The first message of each kind (producing stage, op and channel, for micro-batches of a number of
rows) between two ranks travels behind a header of :data:`HEADER` integers; both ranks cache the structure it
describes and later messages of that kind carry only their tensors. A sender whose tensors no longer match
the structure it declared fails with both structures in the error (the receiver's buffers are of the old one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["HEADER", "Structure", "decode", "describe", "encode", "structure_of"]

HEADER = 64  # int64 entries: is_tuple, count, then per entry: dtype code (-1 for None), ndim, dims...

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)

Entry = tuple[torch.dtype, tuple[int, ...]] | None
Structure = tuple[bool, tuple[Entry, ...]]
"""``(is_tuple, entries)``: what a receiver needs to allocate a message's buffers."""


def structure_of(tensors: Sequence[Tensor | None], is_tuple: bool) -> Structure:
    return is_tuple, tuple(None if t is None else (t.dtype, tuple(t.shape)) for t in tensors)


def describe(structure: Structure) -> str:
    """``(float32[2, 8], None)``: a structure as an error message shows it."""
    entries = ", ".join("None" if e is None else f"{str(e[0]).removeprefix('torch.')}{list(e[1])}"
                        for e in structure[1])
    return f"({entries})" + (" as a tuple" if structure[0] else "")


def encode(structure: Structure) -> Tensor:
    """The header of ``structure``: :data:`HEADER` int64 values.

    Raises:
        ValueError: a dtype the wire does not carry, or more dimensions than the header holds.
    """
    is_tuple, entries = structure
    values = [int(is_tuple), len(entries)]
    for entry in entries:
        if entry is None:
            values += [-1, 0]
            continue
        dtype, shape = entry
        if dtype not in _DTYPES:
            raise ValueError(f"a {dtype} tensor cannot cross between ranks: send one of "
                             f"{', '.join(str(d) for d in _DTYPES)}")
        values += [_DTYPES.index(dtype), len(shape), *shape]
    if len(values) > HEADER:
        raise ValueError(f"a message of {describe(structure)} has more entries and dimensions than a header holds "
                         f"({HEADER} integers): send fewer tensors, or flatten them")
    return torch.tensor(values + [0] * (HEADER - len(values)), dtype=torch.int64)


def decode(header: Tensor) -> Structure:
    values = header.tolist()
    is_tuple, count, k = bool(values[0]), values[1], 2
    entries: list[Entry] = []
    for _ in range(count):
        code, ndim = values[k], values[k + 1]
        k += 2
        entries.append(None if code < 0 else (_DTYPES[code], tuple(values[k:k + ndim])))
        k += ndim if code >= 0 else 0
    return is_tuple, tuple(entries)
