"""Counting a repeated layer once: Note [identical layers], the record of a counted pass that a repeat of the layer
takes, and the key it is reused under (the counter: :mod:`sim.planning.counting.flops`).

Note [identical layers]: a decoder's blocks are one module repeated, so counting each of them (96 in GPT-3 175B)
repeats the same work. A caller that knows which layers are the same computation (same class, parameter shapes and
code path: the built-in decoders' blocks) names them in ``identical``; a member is then counted once per distinct
input and the others take that count. A layer's count depends on itself and on its input: the input's tree, each
tensor's shape, strides, dtype and storage, and which of those storages earlier layers saved already (what it
saves again is not new). That is the key a count is reused under, so a repeat whose input differs (the first block
after an embedding that saves its output) is counted afresh. A reused layer's output is made again (fresh tensors
of the same layout, marked saved where the counted layer's were), which needs outputs that are fresh storages of
their own or tensors of the input passed on whole (the repeat passes its own input's); a layer whose output is
otherwise an input's storage or shares one is always counted. Nothing is reused for layers
the caller does not name: a user's module may read state the counter cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from sim.planning.counting.operators import Op, _storage_key, _tensors

__all__ = ["Counted", "LayerPass", "replay", "replayable", "signature"]


@dataclass
class LayerPass:
    """One layer's counted pass: its operators each way, its bytes in, out and saved, its output, and which
    operators and saved bytes belong to a module a policy may recompute (:mod:`sim.planning.counting.modules`)."""

    forward: list[Op]
    backward: list[Op]
    input_backward: list[Op]
    output_bytes: int
    input_bytes: int
    saved_bytes: int
    input_saved_bytes: int
    output: Any
    new_output_bytes: int
    marks: dict[int, tuple[int, int]]
    op_bits: list[int]


@dataclass(frozen=True)
class _Fresh:
    """An output tensor to make again: its layout, and the bytes saved of its storage (``None``: not saved)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    saved: int | None


@dataclass(frozen=True)
class _Passed:
    """An output tensor that is the input's tensor at ``index`` (of the input's leaves), passed on whole."""

    index: int


@dataclass(frozen=True)
class Counted:
    """A counted layer, for a repeat of it (Note [identical layers]): its pass and how to make its output again."""

    step: LayerPass
    spec: TreeSpec
    leaves: tuple[Any, ...]  # non-tensors as they are, tensors as _Fresh or _Passed


def signature(x: Any, seen: dict[int, int]) -> tuple[Any, ...] | None:
    """What a layer's count depends on in its input (Note [identical layers]); ``None``: not comparable. Not
    ``requires_grad``: every layer but the first takes a detached input that requires a gradient."""
    leaves, spec = tree_flatten(x)
    first: dict[int, int] = {}
    key: list[Any] = [spec]
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            storage = _storage_key(leaf)
            key.append((tuple(leaf.shape), leaf.stride(), leaf.storage_offset(), leaf.dtype, leaf.device.type,
                        int(leaf.untyped_storage().nbytes()), first.setdefault(storage, i), seen.get(storage)))
        else:
            try:
                hash(leaf)
            except TypeError:
                return None
            key.append((type(leaf), leaf))
    return tuple(key)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same tensor: one storage, one layout (a detached copy of an input is)."""
    return (_storage_key(a) == _storage_key(b) and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset() and a.dtype == b.dtype)


def replayable(step: LayerPass, x: Any, seen: dict[int, int]) -> Counted | None:
    """The record that makes ``step``'s output again; ``None`` if an output is neither a fresh storage of its own nor
    a tensor of the input passed on whole (the token ids a decoder with MTP modules carries to them)."""
    inputs = {_storage_key(t) for t in _tensors(x)}
    given = tree_flatten(x)[0]
    leaves, spec = tree_flatten(step.output)
    storages: set[int] = set()
    record: list[Any] = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            record.append(leaf)
            continue
        passed = next((i for i, t in enumerate(given) if isinstance(t, torch.Tensor) and same(t, leaf)), None)
        if passed is not None:
            record.append(_Passed(passed))
            continue
        storage = _storage_key(leaf)
        again = torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device="meta")
        if (storage in inputs or storage in storages or leaf.device.type != "meta" or leaf.storage_offset()
                or again.untyped_storage().nbytes() != leaf.untyped_storage().nbytes()):
            return None
        storages.add(storage)
        record.append(_Fresh(tuple(leaf.shape), leaf.stride(), leaf.dtype, seen.get(storage)))
    return Counted(step, spec, tuple(record))


def replay(counted: Counted, x: Any, seen: dict[int, int], keep: list[Any]) -> LayerPass:
    """``counted``'s pass on ``x`` with its output made again, each tensor saved where the counted layer's was and
    each tensor of the input passed on as it was."""
    given = tree_flatten(x)[0]
    leaves = []
    for leaf in counted.leaves:
        if isinstance(leaf, _Passed):
            leaves.append(given[leaf.index])
            continue
        if not isinstance(leaf, _Fresh):
            leaves.append(leaf)
            continue
        t = torch.empty_strided(leaf.shape, leaf.stride, dtype=leaf.dtype, device="meta")
        if leaf.saved is not None:
            seen[_storage_key(t)] = leaf.saved
        keep.append(t)  # alive, so no later storage takes its key
        leaves.append(t)
    return replace(counted.step, output=tree_unflatten(leaves, counted.spec))
