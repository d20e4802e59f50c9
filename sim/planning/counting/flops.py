"""Per-layer FLOPs and bytes of an ``nn.Sequential``, counted on the ``meta`` device without allocating.

Each layer runs forward and then its real backward (``torch.autograd.grad``) on meta tensors, under a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that records every ATen operator it sees, and
under :func:`torch.autograd.graph.saved_tensors_hooks` that record what autograd keeps for backward.
Nothing is allocated, so a 175B-parameter model counts in a few seconds. What each operator costs is
:mod:`sim.planning.counting.operators`' (with Notes [one operator, several kernels], [dropout on meta] and [attention on
meta]); the tables this module returns are :mod:`sim.planning.counting.counts`'.

Per layer: parameters (count, bytes; a shared parameter counts once, at its first layer), output
bytes (what a stage boundary after this layer sends), and the bytes saved for backward, parameters
excluded, each storage counted once (at the first layer that saves it), told apart by the marked modules that
produced them and with their FP8 training bytes (:mod:`sim.planning.counting.modules`,
:mod:`sim.planning.counting.saved`).

Note [identical layers]: a repeated block is counted once per distinct input and the others take that count
(:mod:`sim.planning.counting.reuse`).

Note [affine in the batch]: every count is taken at batch sizes 2 and 4 (the sample's other dimensions
kept) and stored as ``fixed + per_sample * batch``, so one count serves every micro-batch size of a
sweep. The fixed part holds what does not grow with the batch (reading weights, accumulating weight
gradients). Batch 1 is avoided because some views are contiguous only there, which changes the
operators a layer runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_map

from sim.planning.counting.counts import (
    ALL_GATHER,
    ALL_REDUCE,
    COLLECTIVE,
    REDUCE_SCATTER,
    LayerCount,
    LayerProfile,
    ModelProfile,
    OpTable,
)
from sim.planning.counting.expert_parallel import is_expert
from sim.planning.counting.modules import recording
from sim.planning.counting.operators import (
    Op,
    UnknownOperatorError,
    _GpuDropout,
    _Recorder,
    _storage_key,
    _tensor_bytes,
    _tensors,
)
from sim.planning.counting.reuse import Counted, LayerPass, replay, replayable, signature
from sim.planning.counting.saved import held, kept

__all__ = ["CountError", "LayerCount", "LayerProfile", "ModelProfile", "OpTable", "UnknownOperatorError",
           "count_layers"]

_COUNT_BATCH = 2  # counts at 2 and 4 samples (see Note [affine in the batch])
#: The group sizes a count's collectives run among: the tensor-parallel ones', the all-to-alls'.
_Groups = tuple[set[int], set[int]]


def _affine(q1: float, q2: float, b: int) -> tuple[float, float]:
    slope = (q2 - q1) / b
    return q1 - slope * b, slope


# -- counting ----------------------------------------------------------------------------------------


def _dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def _to_meta(x: Any, batch: int | None, dtype: torch.dtype | None) -> Any:
    """A meta copy of every tensor in ``x`` (first dimension ``batch`` if given, floats in ``dtype`` if given)."""

    def conv(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        shape = tuple(t.shape) if batch is None or t.dim() == 0 else (batch, *t.shape[1:])
        return torch.empty(shape, dtype=_dtype(t, dtype), device="meta")

    return tree_map(conv, x)


def _check_batched(x: Any) -> None:
    ts = _tensors(x)
    if not ts or any(t.dim() == 0 for t in ts):
        raise ValueError("the sample input needs tensors with a batch dimension (dimension 0)")


class CountError(RuntimeError):
    """A layer failed while it was counted on the meta device (its shapes do not chain with the layer before it,
    or it runs a data-dependent operator).

    Attributes:
        layer: the layer's index in the ``nn.Sequential``.
        error: what it raised, with its traceback.
    """

    def __init__(self, layer: int, name: str, error: BaseException) -> None:
        super().__init__(f"counting on the meta device failed at layer {name}: {error}")
        self.layer, self.error = layer, error


# Note [split backward]: a schedule with W tasks runs a layer's backward as B, the gradient of its input alone,
# and W, the rest (weight gradients, accumulation): what zero-bubble schedules assume of an ideal split, each
# operator computed once. So each layer's backward is also counted with the input's gradient alone (autograd
# prunes the weight-gradient products, and a convolution's backward masks its filter and bias kernels); W is
# the whole backward less that. A layer without parameters is all B; a first layer, whose input needs no
# gradient, all W.
def _run_layer(layer: nn.Module, x: Any, first: bool, seen: dict[int, int], keep: list[Any],
               params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
               shared_param_keys: set[int], memory_bound: frozenset[str], groups: _Groups) -> LayerPass:
    """Forward and backward of one layer on meta inputs ``x``; ``seen`` maps saved storages to owners, ``groups``
    gathers the group sizes of the collectives it runs."""
    if first:
        x_in = x
    else:
        x_in = tree_map(lambda t: t.detach().requires_grad_(t.is_floating_point())
                        if isinstance(t, torch.Tensor) else t, x)
    inputs = _tensors(x_in)
    input_keys = {_storage_key(t) for t in inputs}
    saved_new = 0
    saved_input = 0
    local: set[int] = set()
    new_keys: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved_new, saved_input
        key = _storage_key(t)
        if key in shared_param_keys or key in local:
            return t
        local.add(key)
        nbytes = int(t.untyped_storage().nbytes())
        if key in seen:
            if key in input_keys:
                saved_input += nbytes
        else:
            seen[key] = nbytes
            saved_new += nbytes
            new_keys[key] = nbytes
            keep.append(t)
        return t

    fwd: list[Op] = []
    bwd: list[Op] = []
    bwd_in: list[Op] = []
    state = {**params, **buffers}
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, _GpuDropout(), recording(fwd) as marks, _Recorder(fwd, memory_bound, *groups):
        out = torch.func.functional_call(layer, state, (x_in,))
    outputs = _tensors(out)
    roots = [o for o in outputs if o.requires_grad]
    by_module = kept(roots, new_keys, marks.produced)
    wrt_in = [t for t in inputs if t.requires_grad]
    wrt_params = [p for p in params.values() if p.requires_grad]
    if roots and wrt_in + wrt_params:
        grads = [torch.empty_like(o) for o in roots]
        if wrt_in and wrt_params:  # Note [split backward]: the input's gradient alone, then the whole backward
            with _Recorder(bwd_in, memory_bound, *groups):
                torch.autograd.grad(roots, wrt_in, grads, retain_graph=True, allow_unused=True)
        with _Recorder(bwd, memory_bound, *groups):
            torch.autograd.grad(roots, wrt_in + wrt_params, grads, allow_unused=True)
        if wrt_in and not wrt_params:
            bwd_in = list(bwd)
    for p in params.values():  # accumulating into .grad: read both, write one
        if p.requires_grad:
            bwd.append((0.0, 3.0 * _tensor_bytes(p), 0.0, 0.0, 0.0, 0.0, 0.0))  # memory-bound
    keep.extend(inputs)
    new = sum(_tensor_bytes(t) for t in outputs if _storage_key(t) not in input_keys)
    return LayerPass(fwd, bwd, bwd_in, sum(map(_tensor_bytes, outputs)), sum(map(_tensor_bytes, inputs)),
                 saved_new, saved_input, out, new, by_module, marks.op_bits)


def _meta_state(layer: nn.Module, dtype: torch.dtype | None
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Fresh meta leaves standing in for the layer's parameters and buffers."""
    params = {name: torch.empty(p.shape, dtype=_dtype(p, dtype), device="meta").requires_grad_(p.requires_grad)
              for name, p in layer.named_parameters(remove_duplicate=False)}
    buffers = {name: torch.empty(b.shape, dtype=_dtype(b, dtype), device="meta")
               for name, b in layer.named_buffers(remove_duplicate=False)}
    return params, buffers


def _count_pass(module: nn.Sequential, sample: Any, dtype: torch.dtype | None, memory_bound: frozenset[str],
                groups: _Groups, group_of: dict[int, int]) -> list[tuple[LayerPass, list[nn.Parameter], int]]:
    """Each layer's pass, its new parameters, and the index of the layer whose count it is (itself, or the
    identical layer it repeats: Note [identical layers])."""
    seen: dict[int, int] = {}
    keep: list[Any] = []
    owners: set[int] = set()
    counted: dict[tuple[int, tuple[Any, ...]], tuple[Counted, int]] = {}
    x = sample
    result = []
    for k, layer in enumerate(module):
        new = [p for p in layer.parameters() if id(p) not in owners]  # parameters() dedupes within a layer
        owners.update(id(p) for p in new)
        given = signature(x, seen) if k in group_of and k > 0 else None
        key = None if given is None else (group_of[k], given)
        if key is not None and key in counted:
            record, source = counted[key]
            step = replay(record, x, seen, keep)
            result.append((step, new, source))
            x = step.output
            continue
        params, buffers = _meta_state(layer, dtype)
        param_keys = {_storage_key(t) for t in (*params.values(), *buffers.values())}
        try:
            step = _run_layer(layer, x, k == 0, seen, keep, params, buffers, param_keys, memory_bound, groups)
        except (RuntimeError, NotImplementedError) as exc:
            raise CountError(k, next(name for name, child in module.named_children() if child is layer), exc) from exc
        keep.extend(params.values())
        if key is not None:
            record_ = replayable(step, x, seen)
            if record_ is not None:
                counted[key] = (record_, k)
        result.append((step, new, k))
        x = step.output
    return result


def _groups_of(identical: Iterable[Collection[int]], layers: int) -> dict[int, int]:
    """Layer index -> its group's number, for the groups of ``identical`` (Note [identical layers])."""
    group_of: dict[int, int] = {}
    for g, members in enumerate(identical):
        for k in members:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < layers:
                raise ValueError(f"identical names layer {k!r}; the sequential has layers 0 to {layers - 1}")
            if k in group_of:
                raise ValueError(f"identical names layer {k} in two groups")
            group_of[k] = g
    return group_of


def _table(ops1: Sequence[Op], ops2: Sequence[Op], b: int, what: str) -> OpTable:
    a1 = np.asarray(ops1, dtype=np.float64).reshape(-1, 7)
    a2 = np.asarray(ops2, dtype=np.float64).reshape(-1, 7)
    if len(a1) != len(a2) or not np.array_equal(a1[:, 2], a2[:, 2]):
        raise RuntimeError(f"{what} runs {len(ops1)} operators at batch {b} but {len(ops2)} at batch {2 * b}; "
                           "counts need the same operators at every batch size")
    slope = (a2 - a1) / b
    fixed = a1 - slope * b
    dims = np.stack([fixed[:, 3:6], slope[:, 3:6]], axis=2)  # (ops, 3, 2): M, N, K as fixed + per-sample
    kinds = a1[:, 2].astype(np.int8)  # a collective's says which one (operators.collective_kind)
    collectives = np.where(kinds >= COLLECTIVE, kinds - COLLECTIVE + ALL_REDUCE, 0).astype(np.int8)
    return OpTable(np.stack([fixed[:, 0], slope[:, 0]], axis=1), np.stack([fixed[:, 1], slope[:, 1]], axis=1),
                   np.minimum(kinds, COLLECTIVE).astype(np.int8), dims, collectives, a1[:, 6] > 0)


def count_layers(module: nn.Sequential, sample: Any, dtype: torch.dtype | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 memory_bound: Collection[str] = (), identical: Iterable[Collection[int]] = ()) -> ModelProfile:
    """Count every layer of ``module`` on the meta device (see the module docstring).

    The module may live anywhere (its parameters are only looked at, never copied or changed); the
    sample gives shapes and dtypes and has the batch in dimension 0 (its batch size does not matter).

    Args:
        module: the model, as an ``nn.Sequential`` (each layer takes the previous layer's output;
            tuples of tensors may pass between layers).
        sample: an input for the first layer (a tensor, or a tuple of tensors).
        dtype: count as if every floating parameter, buffer and input had this dtype
            (``torch.float16`` for mixed precision); ``None`` keeps their own.
        progress: optional callback ``(done, total)`` called after each of the two counting passes.
        memory_bound: names of ATen operators (``"my_op"`` for ``aten::my_op``) to count as memory-bound,
            besides those the counter knows (Note [no free operators] in :mod:`sim.planning.counting.operators`).
        identical: groups of layer indices that are the same computation given the same input (the built-in
            decoders' blocks, :attr:`sim.planning.counting.models.ModelSpec.identical`): each group is counted once per
            distinct input and the count reused, exactly (Note [identical layers]). Name only layers you know to be
            identical: the counter trusts it.

    Returns:
        A :class:`ModelProfile`, one :class:`LayerProfile` per layer; its ``tensor_parallel`` is the group size of
        the tensor-parallel collectives the model runs (:mod:`sim.planning.counting.tensor_parallel`), 1 without any,
        and its ``sequence_parallel`` whether they include reduce-scatters or all-gathers.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: the sample has no batch dimension, the module has no layers, or its collectives run among
            groups of different sizes, or ``identical`` names a layer out of range or twice.
        CountError: a layer fails on meta tensors (its shapes do not chain, or a data-dependent operator); a
            ``RuntimeError`` that names the layer and holds its index.
        UnknownOperatorError: a layer runs an operator the counter does not know (the message names it).
    """
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"count_layers needs an nn.Sequential, got {type(module).__name__}")
    if len(module) == 0:
        raise ValueError("the sequential has no layers")
    _check_batched(sample)
    group_of = _groups_of(identical, len(module))
    b = _COUNT_BATCH
    passes = []
    groups: _Groups = (set(), set())
    for k, batch in enumerate((b, 2 * b)):
        with torch.no_grad():
            meta_sample = _to_meta(sample, batch, dtype)
        try:
            passes.append(_count_pass(module, meta_sample, dtype, frozenset(memory_bound), groups, group_of))
        except CountError:
            raise
        except (RuntimeError, NotImplementedError) as exc:
            raise RuntimeError(f"counting on the meta device failed: {exc}") from exc
        if progress is not None:
            progress(k + 1, 2)
    names = [name for name, _ in module.named_children()]
    layers = []
    tables: dict[tuple[int, int], tuple[OpTable, OpTable, OpTable]] = {}  # a repeat shares its source's tables
    for k, ((p1, new, s1), (p2, _, s2)) in enumerate(zip(*passes, strict=True)):
        what = f"layer {names[k]}"
        if (s1, s2) not in tables:
            bits = np.asarray(p1.op_bits, dtype=np.int8) if any(p1.op_bits) else None  # Note [recompute modules]
            tables[s1, s2] = (replace(_table(p1.forward, p2.forward, b, what + " (forward)"), modules=bits),
                              _table(p1.backward, p2.backward, b, what + " (backward)"),
                              _table(p1.input_backward, p2.input_backward, b, what + " (input gradient)"))
        forward, backward, input_backward = tables[s1, s2]
        layers.append(LayerProfile(
            names[k], type(module[k]).__name__, forward, backward,
            _affine(p1.output_bytes, p2.output_bytes, b), _affine(p1.input_bytes, p2.input_bytes, b),
            _affine(p1.saved_bytes, p2.saved_bytes, b), _affine(p1.input_saved_bytes, p2.input_saved_bytes, b),
            sum(p.numel() for p in new),
            sum(p.numel() * torch.empty((), dtype=_dtype(p, dtype)).element_size() for p in new), len(new),
            input_backward, _affine(p1.new_output_bytes, p2.new_output_bytes, b),
            sum(p.numel() for p in new if is_expert(p)),
            held(p1.marks, p2.marks, b),
        ))
    floats = [p.dtype for p in module.parameters() if p.is_floating_point()]
    counted = dtype if dtype is not None else floats[0] if floats else torch.float32
    tensor, expert = groups
    if len(expert) > 1:
        raise ValueError(f"the model's all-to-alls run among groups of {sorted(expert)} ranks; a count needs one "
                         "expert-parallel degree")
    if len(tensor) > 1:
        raise ValueError(f"the model's collectives run among groups of {sorted(tensor)} ranks; a count needs one "
                         "tensor-parallel degree")
    split = any(np.isin(t.collectives_or_default(), (REDUCE_SCATTER, ALL_GATHER)).any()
                for layer in layers for t in (layer.forward, layer.backward))
    return ModelProfile(tuple(layers), counted, tensor.pop() if tensor else 1, sequence_parallel=split,
                        expert_parallel=expert.pop() if expert else 1)
