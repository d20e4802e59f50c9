"""Per-layer FLOPs and bytes of an ``nn.Sequential``, counted on the ``meta`` device without allocating.

Each layer runs forward and then its real backward (``torch.autograd.grad``) on meta tensors, under a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that records every ATen operator it sees, and
under :func:`torch.autograd.graph.saved_tensors_hooks` that record what autograd keeps for backward.
Nothing is allocated, so a 175B-parameter model counts in a few seconds. Per operator::

    flops   torch.utils.flop_counter's formula (mm, addmm, bmm, baddbmm, convolution and their
            backward); 0 for everything else
    bytes   bytes read and written: every tensor argument plus every output (views are free)

An operator that a GPU runs as several kernels, or in several passes over its input, is recorded as
those kernels (Note [one operator, several kernels]).

Per layer: parameters (count, bytes; a shared parameter counts once, at its first layer), output
bytes (what a stage boundary after this layer sends), and the bytes saved for backward, parameters
excluded, each storage counted once (at the first layer that saves it).

Note [affine in the batch]: every count is taken at batch sizes 2 and 4 (the sample's other dimensions
kept) and stored as ``fixed + per_sample * batch``, so one count serves every micro-batch size of a
sweep. The fixed part holds what does not grow with the batch (reading weights, accumulating weight
gradients). Batch 1 is avoided because some views are contiguous only there, which changes the
operators a layer runs.

Note [dropout on meta]: on CPU and meta, ``F.dropout`` multiplies by a mask in the input's dtype; on a
GPU it runs ``native_dropout``, which keeps a one-byte mask. Counting runs ``native_dropout`` so the
bytes saved are a GPU's (and Korthikanti et al.'s accounting).

Note [one operator, several kernels]: an ATen operator is not always one kernel, and a kernel does not
always read its input once. Two cases matter for convolutional networks, and the counter splits them
into the kernels a GPU runs:

- ``convolution_backward`` is one operator on meta but two or three kernels on a GPU (cuDNN's
  backward-data, backward-filter and backward-bias): one pass each over the output gradient, each with
  its own FLOPs (the two halves of ``flop_registry``'s count), its own bytes and its own launch. Counted
  as one operator it reads the output gradient once and takes one roofline ``max`` over work that runs
  as separate, differently bound kernels.
- batch norm in training normalises every element by statistics over the whole ``(N, H, W)`` slice of
  its channel, so no output can be written before the whole input has been read: the forward reads the
  input twice (statistics, then normalisation) and the backward reads the input and the output gradient
  twice (the two reductions, then the input gradient). The count records a reduction pass and an
  elementwise pass, each as a kernel (PyTorch's CUDA forward runs them as two kernels; a backward that
  fuses them into one kernel still reads twice, and pays one launch less than counted). The second
  read comes from DRAM when the tensor is larger than the L2 cache, which the count assumes: true for
  training batches on a P40 or V100 (3 and 6 MB of L2; a ResNet-101 activation is 0.4-3.2 MB per
  sample in fp32), an upper bound where a small tensor fits the 40-50 MB of an A100 or H100. Batch
  norm in evaluation, and layer norm (whose statistics are over one row, which a thread block keeps
  on chip), stay one pass.

FLOPs are unchanged by the split; bytes and kernels grow.

Note [attention on meta]: ``F.scaled_dot_product_attention`` has no fused kernel on meta; it
decomposes into its math form, two ``bmm`` per head and a softmax, which the counter sees as matrix
products: 4·b·s²·h FLOPs forward, twice that backward, the same as a fused kernel does without
recomputation. What it saves for backward is the math form's (the s×s probabilities), an upper bound
for a flash kernel's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

__all__ = ["LayerCount", "LayerProfile", "ModelProfile", "OpTable", "count_layers"]

_COUNT_BATCH = 2  # counts at 2 and 4 samples (see Note [affine in the batch])
_FREE_PREFIXES = ("empty", "new_empty", "detach", "alias", "lift_fresh", "_unsafe_view", "set_")


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class _Recorder(TorchDispatchMode):
    """Appends ``(flops, bytes)`` of every non-free ATen operator to ``ops``."""

    def __init__(self, ops: list[tuple[float, float]]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        if func.is_view or name.startswith(_FREE_PREFIXES):
            return out
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        packet = func._overloadpacket
        kernels = _kernels(packet, args, kwargs, out)
        if kernels is not None:  # Note [one operator, several kernels]
            self.ops.extend(kernels)
            return out
        flops = 0
        if packet in flop_registry:
            flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
        elif not func._schema.is_mutable:
            in_keys = {_storage_key(t) for t in inputs}
            if outputs and all(_storage_key(o) in in_keys for o in outputs):
                return out  # returns an alias of an input: no kernel
        traffic = sum(_tensor_bytes(t) for t in inputs) + sum(_tensor_bytes(t) for t in outputs)
        self.ops.append((float(flops), float(traffic)))
        return out


_aten = torch.ops.aten
_BATCH_NORM = {_aten.native_batch_norm, _aten._native_batch_norm_legit, _aten._native_batch_norm_legit_functional}


def _arg(args: Any, kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs[name]


def _kernels(packet: Any, args: Any, kwargs: dict[str, Any], out: Any) -> list[tuple[float, float]] | None:
    """The kernels a GPU runs for one operator that is not one single-pass kernel, as ``(flops, bytes)``;
    ``None`` for every other operator (Note [one operator, several kernels])."""
    if packet is _aten.convolution_backward:
        grad_out, x, w = (_arg(args, kwargs, k, name) for k, name in enumerate(("grad_output", "input", "weight")))
        mask = list(_arg(args, kwargs, 10, "output_mask"))
        reads = ((grad_out, w), (grad_out, x), (grad_out,))  # backward-data, backward-filter, backward-bias
        kernels = []
        for k in range(3):
            if not mask[k] or not isinstance(out[k], torch.Tensor):
                continue
            flops = 0.0
            if k < 2:  # the bias gradient is a reduction: no FLOPs in the count, as in the forward
                only_args, only_kwargs = list(args), dict(kwargs)
                only = [i == k for i in range(3)]
                if len(only_args) > 10:
                    only_args[10] = only
                else:
                    only_kwargs["output_mask"] = only
                flops = float(flop_registry[packet](*only_args, **only_kwargs, out_val=out))
            kernels.append((flops, float(sum(map(_tensor_bytes, reads[k])) + _tensor_bytes(out[k]))))
        return kernels
    if packet not in _BATCH_NORM and packet is not _aten.native_batch_norm_backward:
        return None
    single_pass = sum(map(_tensor_bytes, _tensors((args, kwargs)))) + sum(map(_tensor_bytes, _tensors(out)))
    if packet in _BATCH_NORM and _arg(args, kwargs, 5, "training"):
        x = _arg(args, kwargs, 0, "input")
        return [(0.0, float(_tensor_bytes(x))), (0.0, float(single_pass))]  # statistics, then normalisation
    if packet is _aten.native_batch_norm_backward and _arg(args, kwargs, 7, "train"):
        grad_out, x = _arg(args, kwargs, 0, "grad_out"), _arg(args, kwargs, 1, "input")
        return [(0.0, float(_tensor_bytes(grad_out) + _tensor_bytes(x))), (0.0, float(single_pass))]
    return None


class _GpuDropout(TorchFunctionMode):
    """Runs ``F.dropout`` in training as ``native_dropout`` (see Note [dropout on meta])."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.dropout:
            names = ("input", "p", "training", "inplace")
            bound = dict(zip(names, args, strict=False)) | kwargs
            p = float(bound.get("p", 0.5))
            if bound.get("training", True) and 0.0 < p < 1.0:
                return torch.native_dropout(bound["input"], p, True)[0]
        return func(*args, **kwargs)


@dataclass(frozen=True, eq=False)
class OpTable:
    """The operators of one pass of one layer, each as ``fixed + per_sample * batch`` FLOPs and bytes.

    Attributes:
        flops: shape ``(ops, 2)``: fixed and per-sample FLOPs of each operator.
        bytes: shape ``(ops, 2)``: fixed and per-sample bytes each operator reads and writes.
    """

    flops: np.ndarray
    bytes: np.ndarray

    @property
    def kernels(self) -> int:
        return int(self.flops.shape[0])

    def flops_at(self, batch: float) -> np.ndarray:
        """FLOPs of each operator at ``batch`` samples."""
        return np.maximum(self.flops[:, 0] + self.flops[:, 1] * batch, 0.0)

    def bytes_at(self, batch: float) -> np.ndarray:
        """Bytes each operator moves at ``batch`` samples."""
        return np.maximum(self.bytes[:, 0] + self.bytes[:, 1] * batch, 0.0)


@dataclass(frozen=True)
class LayerCount:
    """Totals of one layer at one batch size (FLOPs, bytes, operator counts)."""

    name: str
    forward_flops: int
    backward_flops: int
    forward_bytes: int
    backward_bytes: int
    forward_kernels: int
    backward_kernels: int
    output_bytes: int
    saved_bytes: int
    parameters: int
    parameter_bytes: int


def _affine(q1: float, q2: float, b: int) -> tuple[float, float]:
    slope = (q2 - q1) / b
    return q1 - slope * b, slope


@dataclass(frozen=True, eq=False)
class LayerProfile:
    """What one layer costs, for any batch size (see Note [affine in the batch]).

    Attributes:
        name: the layer's name in the sequential (``"3"`` or ``"layer1_0_conv1"``).
        kind: the layer's class name.
        forward: operators of the forward pass.
        backward: operators of the backward pass (input and weight gradients, gradient accumulation).
        output_bytes: ``(fixed, per_sample)`` bytes of the layer's output.
        input_bytes: ``(fixed, per_sample)`` bytes of the layer's input.
        saved_bytes: ``(fixed, per_sample)`` bytes first saved for backward by this layer.
        input_saved_bytes: ``(fixed, per_sample)`` bytes of this layer's input that it saves and an
            earlier layer saved already; a stage that starts here keeps them too.
        parameters: parameter count (shared parameters at their first layer only).
        parameter_bytes: bytes of those parameters.
        parameter_tensors: how many parameter tensors those are (an optimizer runs a kernel per tensor).
    """

    name: str
    kind: str
    forward: OpTable
    backward: OpTable
    output_bytes: tuple[float, float]
    input_bytes: tuple[float, float]
    saved_bytes: tuple[float, float]
    input_saved_bytes: tuple[float, float]
    parameters: int
    parameter_bytes: int
    parameter_tensors: int

    def at(self, batch: int) -> LayerCount:
        """The layer's totals at ``batch`` samples."""

        def ev(q: tuple[float, float]) -> int:
            return max(int(round(q[0] + q[1] * batch)), 0)

        return LayerCount(
            self.name,
            int(self.forward.flops_at(batch).sum()),
            int(self.backward.flops_at(batch).sum()),
            int(self.forward.bytes_at(batch).sum()),
            int(self.backward.bytes_at(batch).sum()),
            self.forward.kernels,
            self.backward.kernels,
            ev(self.output_bytes),
            ev(self.saved_bytes),
            self.parameters,
            self.parameter_bytes,
        )


@dataclass(frozen=True)
class ModelProfile:
    """The per-layer profiles of a whole sequential, in layer order.

    Attributes:
        layers: one :class:`LayerProfile` per layer.
        dtype: the floating dtype of the parameters (``torch.float16`` for mixed precision).
    """

    layers: tuple[LayerProfile, ...]
    dtype: torch.dtype

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def parameters(self) -> int:
        return sum(layer.parameters for layer in self.layers)

    @property
    def parameter_bytes(self) -> int:
        return sum(layer.parameter_bytes for layer in self.layers)

    def at(self, batch: int) -> list[LayerCount]:
        """Every layer's totals at ``batch`` samples."""
        return [layer.at(batch) for layer in self.layers]


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


@dataclass
class _Pass:
    forward: list[tuple[float, float]]
    backward: list[tuple[float, float]]
    output_bytes: int
    input_bytes: int
    saved_bytes: int
    input_saved_bytes: int
    output: Any


def _run_layer(layer: nn.Module, x: Any, first: bool, seen: dict[int, int], keep: list[Any],
               params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
               shared_param_keys: set[int]) -> _Pass:
    """Forward and backward of one layer on meta inputs ``x``; ``seen`` maps saved storages to owners."""
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
            keep.append(t)
        return t

    fwd: list[tuple[float, float]] = []
    bwd: list[tuple[float, float]] = []
    state = {**params, **buffers}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _GpuDropout(), _Recorder(fwd):
        out = torch.func.functional_call(layer, state, (x_in,))
    outputs = _tensors(out)
    roots = [o for o in outputs if o.requires_grad]
    wrt = [t for t in inputs if t.requires_grad] + [p for p in params.values() if p.requires_grad]
    if roots and wrt:
        grads = [torch.empty_like(o) for o in roots]
        with _Recorder(bwd):
            torch.autograd.grad(roots, wrt, grads, allow_unused=True)
    for p in params.values():  # accumulating into .grad: read both, write one
        if p.requires_grad:
            bwd.append((0.0, 3.0 * _tensor_bytes(p)))
    keep.extend(inputs)
    return _Pass(fwd, bwd, sum(map(_tensor_bytes, outputs)), sum(map(_tensor_bytes, inputs)),
                 saved_new, saved_input, out)


def _meta_state(layer: nn.Module, dtype: torch.dtype | None
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Fresh meta leaves standing in for the layer's parameters and buffers."""
    params = {name: torch.empty(p.shape, dtype=_dtype(p, dtype), device="meta").requires_grad_(p.requires_grad)
              for name, p in layer.named_parameters(remove_duplicate=False)}
    buffers = {name: torch.empty(b.shape, dtype=_dtype(b, dtype), device="meta")
               for name, b in layer.named_buffers(remove_duplicate=False)}
    return params, buffers


def _count_pass(module: nn.Sequential, sample: Any, dtype: torch.dtype | None
                ) -> list[tuple[_Pass, list[nn.Parameter]]]:
    seen: dict[int, int] = {}
    keep: list[Any] = []
    owners: set[int] = set()
    x = sample
    result = []
    for k, layer in enumerate(module):
        params, buffers = _meta_state(layer, dtype)
        param_keys = {_storage_key(t) for t in (*params.values(), *buffers.values())}
        new = [p for p in layer.parameters() if id(p) not in owners]  # parameters() dedupes within a layer
        owners.update(id(p) for p in new)
        step = _run_layer(layer, x, k == 0, seen, keep, params, buffers, param_keys)
        keep.extend(params.values())
        result.append((step, new))
        x = step.output
    return result


def _table(ops1: Sequence[tuple[float, float]], ops2: Sequence[tuple[float, float]], b: int, what: str) -> OpTable:
    if len(ops1) != len(ops2):
        raise RuntimeError(f"{what} runs {len(ops1)} operators at batch {b} but {len(ops2)} at batch {2 * b}; "
                           "counts need the same operators at every batch size")
    a1 = np.asarray(ops1, dtype=np.float64).reshape(-1, 2)
    a2 = np.asarray(ops2, dtype=np.float64).reshape(-1, 2)
    slope = (a2 - a1) / b
    fixed = a1 - slope * b
    return OpTable(np.stack([fixed[:, 0], slope[:, 0]], axis=1), np.stack([fixed[:, 1], slope[:, 1]], axis=1))


def count_layers(module: nn.Sequential, sample: Any, dtype: torch.dtype | None = None,
                 progress: Callable[[int, int], None] | None = None) -> ModelProfile:
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

    Returns:
        A :class:`ModelProfile`, one :class:`LayerProfile` per layer.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: the sample has no batch dimension, or the module has no layers.
        RuntimeError: a layer fails on meta tensors (for instance a data-dependent operator).
    """
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"count_layers needs an nn.Sequential, got {type(module).__name__}")
    if len(module) == 0:
        raise ValueError("the sequential has no layers")
    _check_batched(sample)
    b = _COUNT_BATCH
    passes = []
    for k, batch in enumerate((b, 2 * b)):
        with torch.no_grad():
            meta_sample = _to_meta(sample, batch, dtype)
        try:
            passes.append(_count_pass(module, meta_sample, dtype))
        except (RuntimeError, NotImplementedError) as exc:
            raise RuntimeError(f"counting on the meta device failed: {exc}") from exc
        if progress is not None:
            progress(k + 1, 2)
    names = [name for name, _ in module.named_children()]
    layers = []
    for k, ((p1, new), (p2, _)) in enumerate(zip(*passes, strict=True)):
        what = f"layer {names[k]}"
        layers.append(LayerProfile(
            names[k], type(module[k]).__name__,
            _table(p1.forward, p2.forward, b, what + " (forward)"),
            _table(p1.backward, p2.backward, b, what + " (backward)"),
            _affine(p1.output_bytes, p2.output_bytes, b), _affine(p1.input_bytes, p2.input_bytes, b),
            _affine(p1.saved_bytes, p2.saved_bytes, b), _affine(p1.input_saved_bytes, p2.input_saved_bytes, b),
            sum(p.numel() for p in new),
            sum(p.numel() * torch.empty((), dtype=_dtype(p, dtype)).element_size() for p in new), len(new),
        ))
    floats = [p.dtype for p in module.parameters() if p.is_floating_point()]
    counted = dtype if dtype is not None else floats[0] if floats else torch.float32
    return ModelProfile(tuple(layers), counted)
