"""What one ATen operator costs, in FLOPs and bytes, when the counter (:mod:`~sim.planning.flops`) runs it on meta.

The counter runs each layer under :class:`_Recorder`, a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that records every ATen operator it sees. Per operator::

    flops   torch.utils.flop_counter's formula (mm, addmm, bmm, baddbmm, convolution and their
            backward); 0 for everything else
    bytes   bytes read and written: every tensor argument plus every output (views are free)

An operator that a GPU runs as several kernels, or in several passes over its input, is recorded as
those kernels (Note [one operator, several kernels]); dropout is counted as a GPU runs it (Note [dropout on meta]),
attention in its math form (Note [attention on meta]).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

__all__: list[str] = []  # the counter's walk (sim.planning.flops) is the only user of these

_FREE_PREFIXES = ("empty", "new_empty", "detach", "alias", "lift_fresh", "_unsafe_view", "set_")


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


# Note [attention on meta]: ``F.scaled_dot_product_attention`` has no fused kernel on meta; it
# decomposes into its math form, two ``bmm`` per head and a softmax, which the counter sees as matrix
# products: 4·b·s²·h FLOPs forward, twice that backward, the same as a fused kernel does without
# recomputation. What it saves for backward is the math form's (the s×s probabilities), an upper bound
# for a flash kernel's.
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


# Note [one operator, several kernels]: an ATen operator is not always one kernel, and a kernel does not always
# read its input once; for convolutional networks the counter splits two cases into the kernels a GPU runs (FLOPs
# unchanged; bytes and kernels grow). ``convolution_backward`` is one operator on meta but two or three kernels on a
# GPU (cuDNN's backward-data, backward-filter, backward-bias): one pass each over the output gradient, each with its
# own FLOPs (the two halves of ``flop_registry``'s count), bytes and launch, not one roofline ``max`` over
# differently bound kernels. Batch norm in training normalises by statistics over its channel's whole ``(N, H, W)``
# slice, so the forward reads the input twice and the backward the input and output gradient twice: a reduction
# kernel and an elementwise kernel (PyTorch's CUDA forward runs two; a fused backward reads twice, one launch less).
# The second read counts as DRAM traffic: true for training batches on a P40 or V100 (3 and 6 MB of L2), an upper
# bound where a small tensor fits an A100's or H100's 40-50 MB. Evaluation batch norm and layer norm stay one pass.
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


# Note [dropout on meta]: on CPU and meta, ``F.dropout`` multiplies by a mask in the input's dtype; on a
# GPU it runs ``native_dropout``, which keeps a one-byte mask. Counting runs ``native_dropout`` so the
# bytes saved are a GPU's (and Korthikanti et al.'s accounting).
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

