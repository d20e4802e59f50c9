"""What the ranks tell each other at a step's start, as one fixed-size row of integers per rank.

Note [one exchange a step]: every step begins with the ranks checking each other's inputs (Note [a step's start]
in :mod:`gpipe.distributed.pipe`). That exchange is one ``all_gather`` of a row of int64 per rank, of a size
every rank knows from ``chunks``: whether the rank rejected its input, whether its stages may draw random
numbers, the first stage's micro-batch rows and a fingerprint of its input's structure, the last stage's target
rows. Pickled objects cost a collective for their sizes, another for the bytes, and the pickling on both ends,
at the start of every step (``benchmarks/distributed_speed.py`` times the steps; docs/benchmarks.md). A second
collective only for what is rare: a rejected input's text, an input structure not seen before
(:func:`structure_from`), the seed of a step whose stages may draw.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from gpipe.transport.structure import Structure

__all__ = ["Told", "exchange", "fingerprint", "seed_from", "structure_from"]

_FIXED = 6  # rejected, may_draw, input_is_tuple, target_rows, micro-batch count, fingerprint; then the rows


@dataclass(frozen=True)
class Told:
    """What one rank told the others at a step's start; what only the first or last stage's rank knows is ``None`` (0)
    on the others."""

    rejected: bool
    may_draw: bool
    rows: list[int] | None = None  # the first stage's rank: each micro-batch's rows
    fingerprint: int = 0  # the first stage's rank: :func:`fingerprint` of its input's structure
    input_is_tuple: bool = False
    target_rows: int | None = None  # the last stage's rank


def fingerprint(structure: Structure) -> int:
    """63 bits of a digest of ``structure``, the same in every process (Python's own ``hash`` of a string is not)."""
    digest = hashlib.blake2b(pickle.dumps(structure), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _row(told: Told, chunks: int) -> Tensor:
    rows = told.rows or []
    head = [int(told.rejected), int(told.may_draw), int(told.input_is_tuple),
            -1 if told.target_rows is None else told.target_rows, len(rows) if told.rows is not None else -1,
            told.fingerprint]
    return torch.tensor(head + rows + [0] * (chunks - len(rows)), dtype=torch.int64)


def _told(row: Tensor) -> Told:
    values = row.tolist()
    count = values[4]
    return Told(rejected=bool(values[0]), may_draw=bool(values[1]),
                rows=None if count < 0 else values[_FIXED:_FIXED + count], fingerprint=values[5],
                input_is_tuple=bool(values[2]), target_rows=None if values[3] < 0 else values[3])


def exchange(mine: Told, error: str | None, chunks: int, group: Any,
             world: int) -> tuple[list[Told], list[str | None]]:
    """Every rank's :class:`Told` (Note [one exchange a step]); the rejections' texts, gathered only when a rank
    rejected its input (else every entry ``None``). Every rank of ``group`` calls it with the same ``chunks``.

    Raises:
        ValueError: ``mine`` has more rows than ``chunks`` (the caller split the batch into more micro-batches).
    """
    if mine.rows is not None and len(mine.rows) > chunks:
        raise ValueError(f"{len(mine.rows)} micro-batches do not fit a start row made for {chunks}")
    row = _row(mine, chunks)
    rows = [torch.empty_like(row) for _ in range(world)]
    dist.all_gather(rows, row, group=group)
    told = [_told(r) for r in rows]
    texts: list[str | None] = [None] * world
    if any(t.rejected for t in told):
        dist.all_gather_object(texts, error, group=group)
    return told, texts


def seed_from(first: int, seed: int, group: Any) -> int:
    """The step's seed as the first stage's rank drew it (``seed`` there; anything on the other ranks)."""
    value = torch.tensor([seed], dtype=torch.int64)
    dist.broadcast(value, group=group, group_src=first)
    return int(value.item())


def structure_from(first: int, structure: Structure | None, group: Any) -> Structure:
    """The first stage's input structure, as that rank has it (``structure`` there; ``None`` on the others)."""
    value = [structure]
    dist.broadcast_object_list(value, group=group, group_src=first)
    assert value[0] is not None
    return value[0]
