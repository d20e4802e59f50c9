"""What one ATen operator costs, in FLOPs and bytes, when the counter (:mod:`~sim.planning.counting.flops`) runs it on
meta.

The counter runs each layer under :class:`_Recorder`, a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that records every ATen operator it sees. Per operator::

    flops   torch.utils.flop_counter's formula (mm, addmm, bmm, baddbmm, convolution and their
            backward); 0 for everything else
    bytes   bytes read and written: every tensor argument plus every output (views are free)
    kind    what bounds it (sim.planning.counting.counts: MATMUL, CONVOLUTION, MEMORY_BOUND, VECTOR_MATH or COLLECTIVE)
    M N K   the GEMM shape of a compute-bound operator (Note [GEMM shape]); 0 otherwise
    linear  1 for a 2-D product (mm, addmm: a Linear layer and its gradients; Note [linear products]); 0 otherwise

An operator that is neither free, nor has a FLOP formula, nor is known to be memory-bound stops the count
(Note [no free operators]).

An operator that a GPU runs as several kernels, or in several passes over its input, is recorded as
those kernels (Note [one operator, several kernels]); dropout is counted as a GPU runs it (Note [dropout on meta]),
attention in its math form (Note [attention on meta]). A tensor-parallel collective's marker
(:mod:`sim.planning.counting.tensor_parallel`) is a COLLECTIVE whose bytes are its whole message; a fused kernel
of the ``gpipe_sim`` namespace is one kernel (Note [fused kernels]), FlashAttention's a matrix multiply with the
FLOPs it executes (Note [flash attention]).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from sim.planning.counting.counts import ALL_REDUCE, COLLECTIVE, CONVOLUTION, MATMUL, MEMORY_BOUND, VECTOR_MATH
from sim.planning.counting.expert_parallel import EXPERT_MARKERS
from sim.planning.counting.modules import produced
from sim.planning.counting.tensor_parallel import MARKERS

__all__ = ["FUSED_KERNELS", "LINEAR_PRODUCTS", "MEMORY_BOUND_OPERATORS", "VECTOR_MATH_OPERATORS",
           "UnknownOperatorError"]

#: One counted kernel: FLOPs, bytes, kind, GEMM dimensions M, N, K (0 where not a GEMM), and 1 for a linear product
#: (Note [linear products]), else 0. A collective's kind is :func:`collective_kind` of which one it is
#: (:func:`sim.planning.counting.flops.count_layers` splits it into the table's ``kinds`` and ``collectives``).
Op = tuple[float, float, float, float, float, float, float]

_FREE_PREFIXES = ("empty", "new_empty", "detach", "alias", "lift_fresh", "_unsafe_view", "set_")


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def collective_kind(which: int) -> float:
    """An :data:`Op`'s kind for a collective: :data:`~sim.planning.counting.counts.COLLECTIVE` for an all-reduce, one
    more for each later kind of :data:`~sim.planning.counting.counts.COLLECTIVE_NAMES` (so an all-reduce reads as
    before)."""
    return float(COLLECTIVE + which - ALL_REDUCE)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


# Note [linear products]: the counter marks each 2-D matrix product (``mm``, ``addmm``): a Linear layer's forward
# and its input and weight gradients, which PyTorch runs as 2-D GEMMs over the flattened tokens. Batched products
# (``bmm``, ``baddbmm``: attention's ``Q K^T`` and ``@ V``; FlashAttention) and convolutions are not marked. FP8
# training runs exactly the marked ones in FP8, as TransformerEngine's Linear layers do (Note [fp8 training] in
# :mod:`sim.planning.counting.fp8`).
#: The ATen products a Linear layer runs (Note [linear products]).
LINEAR_PRODUCTS = frozenset({torch.ops.aten.mm, torch.ops.aten.addmm})


# Note [attention on meta]: ``F.scaled_dot_product_attention`` has no fused kernel on meta; it
# decomposes into its math form, two ``bmm`` per head and a softmax, which the counter sees as matrix
# products: 4·b·s²·h FLOPs forward, twice that backward, the same as a fused kernel does without
# recomputation. What it saves for backward is the math form's (the s×s probabilities), an upper bound
# for a flash kernel's; the decoders' ``attention="flash"`` is FlashAttention itself (Note [flash attention]).
class _Recorder(TorchDispatchMode):
    """Appends an :data:`Op` for every non-free ATen operator to ``ops``; ``memory_bound``: names of operators
    to count as memory-bound besides :data:`MEMORY_BOUND_OPERATORS` (Note [no free operators]); ``groups``
    gathers the group size of every tensor-parallel collective seen, ``expert_groups`` every all-to-all's."""

    def __init__(self, ops: list[Op], memory_bound: frozenset[str] = frozenset(),
                 groups: set[int] | None = None, expert_groups: set[int] | None = None) -> None:
        super().__init__()
        self.ops = ops
        self.memory_bound = memory_bound
        self.groups = set() if groups is None else groups
        self.expert_groups = set() if expert_groups is None else expert_groups

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        produced(lambda: _tensors(out))  # Note [recompute modules] in sim.planning.counting.modules
        if func in MARKERS:  # the whole message; priced on the link (sim.planning.counting.tensor_parallel)
            self.groups.add(int(_arg(args, kwargs, 1, "group")))
            message = max(_tensor_bytes(_arg(args, kwargs, 0, "x")), _tensor_bytes(out))
            self.ops.append((0.0, float(message), collective_kind(MARKERS[func]), 0.0, 0.0, 0.0, 0.0))
            return out
        if func in EXPERT_MARKERS:  # the rows this rank sends (Note [all-to-all] in counting.expert_parallel)
            x = _arg(args, kwargs, 0, "x")
            self.expert_groups.add(int(_arg(args, kwargs, 1, "group")))
            message = int(_arg(args, kwargs, 2, "rows")) * x.shape[-1] * x.element_size()
            self.ops.append((0.0, float(message), collective_kind(EXPERT_MARKERS[func]), 0.0, 0.0, 0.0, 0.0))
            return out
        qualified = func._schema.name
        name = qualified.split("::")[-1]
        if func.is_view or name.startswith(_FREE_PREFIXES):
            return out
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        if qualified in FUSED_KERNELS:  # Note [fused kernels]
            traffic = float(sum(map(_tensor_bytes, inputs)) + sum(map(_tensor_bytes, outputs)))
            pass_ = _FLASH_PASSES.get(qualified)
            work = (0.0, 0.0, 0.0, 0.0)
            if pass_ is not None:
                work = _flash_attention(_arg(args, kwargs, 0, "q"), _arg(args, kwargs, 2, "v"), pass_)
            elif qualified == _GROUPED:
                work = _grouped_gemm(_arg(args, kwargs, 0, "a"), _arg(args, kwargs, 1, "b"))
            self.ops.append((work[0], traffic, FUSED_KERNELS[qualified], *work[1:], float(qualified == _GROUPED)))
            return out
        packet = func._overloadpacket
        kernels = _kernels(packet, args, kwargs, out)
        if kernels is not None:  # Note [one operator, several kernels]
            self.ops.extend(kernels)
            return out
        traffic = float(sum(_tensor_bytes(t) for t in inputs) + sum(_tensor_bytes(t) for t in outputs))
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
            conv = "conv" in name
            dims = _gemm_dims(outputs[0] if outputs else None, flops, conv, _groups(args, kwargs, conv))
            linear = float(packet in LINEAR_PRODUCTS)  # Note [linear products]
            self.ops.append((flops, traffic, CONVOLUTION if conv else MATMUL, *dims, linear))
            return out
        if not func._schema.is_mutable:
            in_keys = {_storage_key(t) for t in inputs}
            if outputs and all(_storage_key(o) in in_keys for o in outputs):
                return out  # returns an alias of an input: no kernel
        if not (torch.Tag.pointwise in func.tags or name in MEMORY_BOUND_OPERATORS or name in self.memory_bound):
            raise UnknownOperatorError(name)
        kind = VECTOR_MATH if name in VECTOR_MATH_OPERATORS else MEMORY_BOUND
        self.ops.append((0.0, traffic, kind, 0.0, 0.0, 0.0, 0.0))
        return out


# Note [no free operators]: an ATen operator the counter has no FLOP formula for and does not know to be
# memory-bound would otherwise be timed by its bytes alone, silently: right for an elementwise kernel, free for a
# new compute-heavy one. So the counter knows three lists (flop_counter's formulas, ATen's ``pointwise`` tag, and
# the memory-bound operators below, each seen in the catalog's models) and stops at any other operator, naming it
# and the two ways to add it.
#: ATen operators (names without ``aten::``) counted as memory-bound: their bytes at bandwidth, one kernel each.
MEMORY_BOUND_OPERATORS = frozenset({
    "native_dropout", "native_dropout_backward", "native_layer_norm", "native_layer_norm_backward",
    "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional", "_softmax", "_softmax_backward_data", "_log_softmax",
    "_log_softmax_backward_data", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
    "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
    "adaptive_avg_pool2d", "mean", "sum", "cat", "clone", "copy_", "_to_copy", "embedding",
    "embedding_dense_backward", "index", "index_put_", "index_select", "gather", "scatter", "scatter_add",
    "fill_", "zero_", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "zeros",
    "ones", "full", "constant_pad_nd", "upsample_nearest2d", "upsample_nearest2d_backward",
    "upsample_bilinear2d", "upsample_bilinear2d_backward", "nll_loss_forward", "nll_loss_backward",
    "select_backward", "slice_backward", "expand_backward", "repeat", "stack", "split_with_sizes_copy",
    "tril", "triu", "masked_fill", "masked_fill_", "where", "amax", "var_mean", "std_mean",
    "max_pool3d_with_indices", "arange", "_unsafe_index", "threshold_backward", "sort", "topk", "cumsum",
    "bernoulli_", "bernoulli", "uniform_", "normal_", "rand_like", "randn_like", "native_group_norm",
    "searchsorted", "index_put", "index_add",
    "native_group_norm_backward", "max", "min", "var", "std", "norm", "linalg_vector_norm", "prod", "any", "all",
    "leaky_relu_backward", "gelu_backward", "silu_backward", "tanh_backward", "sigmoid_backward", "elu_backward",
    "hardtanh_backward", "softplus_backward", "hardswish_backward", "hardsigmoid_backward", "mish_backward",
    "log_sigmoid_forward", "log_sigmoid_backward", "mse_loss", "mse_loss_backward", "relu_", "scalar_tensor",
    "_safe_softmax", "logical_not", "bitwise_not", "expand_copy", "_to_dtype", "lift_fresh_copy",
})


# Note [vector math]: a memory-bound operator moves its bytes once, but some do arithmetic per element that one CPU
# core cannot finish at memory speed (GELU's erf, softmax's exp, a normalisation's two passes and division,
# pooling's window): on this machine they reach a fifth of what an add does. So the counter marks them VECTOR_MATH,
# priced by their bytes at the roofline's own fraction of the bandwidth; a GPU streams them like any other
# memory-bound kernel (the catalog gives both fractions the same value).
#: Memory-bound ATen operators with arithmetic per element (counted as
#: :data:`~sim.planning.counting.counts.VECTOR_MATH`).
VECTOR_MATH_OPERATORS = frozenset({
    "gelu", "gelu_backward", "silu", "silu_backward", "tanh", "tanh_backward", "sigmoid", "sigmoid_backward",
    "elu", "elu_backward", "softplus", "softplus_backward", "mish", "mish_backward", "log_sigmoid_forward",
    "log_sigmoid_backward", "exp", "log", "erf", "_softmax", "_softmax_backward_data", "_safe_softmax",
    "_log_softmax", "_log_softmax_backward_data", "native_layer_norm", "native_layer_norm_backward",
    "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional", "native_group_norm", "native_group_norm_backward",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices", "avg_pool2d",
    "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "mse_loss", "mse_loss_backward",
    "nll_loss_forward", "nll_loss_backward",
})


# Note [fused kernels]: a fused kernel (Megatron-LM's, Megatron-Core's and TransformerEngine's, Note [fused kernels]
# in :mod:`sim.planning.counting.models.decoder_layers`) is a custom
# operator, so the counter sees it whole: one kernel that reads each tensor argument and writes each output once,
# whatever it computes inside (the scores' scale, mask and softmax in one pass). Its backward is another such
# operator, or ATen's (dropout's backward, the bias gradient's sum). Each is named here with what bounds it, as the
# ATen operators it replaces are: a normalisation and the exp of softmax, GELU and SiLU are vector math; RoPE's
# products and sums, and the dropout-add, are memory-bound. None has a FLOP formula: its FLOPs are 0, as those of
# the elementwise ATen operators it replaces.
#: Fused kernels (qualified operator names) the counter knows, each with its kind.
FUSED_KERNELS = {
    "gpipe_sim::causal_softmax": VECTOR_MATH, "gpipe_sim::causal_softmax_backward": VECTOR_MATH,
    "gpipe_sim::bias_gelu": VECTOR_MATH, "gpipe_sim::bias_gelu_backward": VECTOR_MATH,
    "gpipe_sim::bias_dropout_add": MEMORY_BOUND,
    "gpipe_sim::rms_norm": VECTOR_MATH, "gpipe_sim::rms_norm_backward": VECTOR_MATH,
    "gpipe_sim::swiglu": VECTOR_MATH, "gpipe_sim::swiglu_backward": VECTOR_MATH,
    "gpipe_sim::rope": MEMORY_BOUND, "gpipe_sim::rope_backward": MEMORY_BOUND,
    "gpipe_sim::flash_attention": MATMUL, "gpipe_sim::flash_attention_backward": MATMUL,
    "gpipe_sim::grouped_mm": MATMUL,
}
_GROUPED = "gpipe_sim::grouped_mm"


# Note [grouped GEMM]: the routed experts' products are one grouped GEMM each (``gpipe_sim::grouped_mm``: a batch of
# G independent products ``(M, K) @ (K, N)``, as TransformerEngine's GroupedLinear and Megatron-Core's grouped GEMM
# run them), its gradients two more. Unlike ``bmm``, whose batch the counter stacks into M (Note [GEMM shape]), it is
# recorded at one group's shape: M is the tokens one expert gets, so a fine-grained MoE's few tokens per expert show
# as a small GEMM, which the roofline prices at its lower rate. Its FLOPs are ``2·G·M·N·K``, and it is a linear
# product (Note [linear products]): FP8 training runs the experts in FP8, as DeepSeek-V3 did.
def _grouped_gemm(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float, float]:
    """FLOPs and one group's GEMM dimensions ``M, N, K`` of a grouped product of ``a`` (G, M, K) and ``b`` (G, K, N)
    (Note [grouped GEMM])."""
    g, m, k = (int(n) for n in a.shape)
    n = int(b.shape[-1])
    return 2.0 * g * m * n * k, float(m), float(n), float(k)


# Note [flash attention]: FlashAttention (Dao et al., 2022; FlashAttention-2, Dao, 2023) computes causal attention
# in tiles held on chip, one kernel each way (Note [flash attention] in
# :mod:`sim.planning.counting.models.decoder_layers`):   FLOPs     the kernel's own: 4·b·a·s²·d forward for the s×s
# score and output products (2·b·a·s²·(d + d_v) for values of another width, MLA's), halved, since the causal
#             kernel skips the tiles above the diagonal; backward 2.5 times that (five s×s-sized products to the
#             forward's two: the scores again, dV, dP, dQ, dK). FlashAttention's benchmarks count so
#             (``flops`` in its benchmarks/benchmark_flash_attention.py). PaLM's and Megatron-LM's MFU count the full
#             square, 4·b·s²·h forward, for a causal model too; the math form counts that. A decoder's counts then
#             sum to 6·N + 7·l·h·s FLOPs per token (l·h·s of it the backward's second pass over the scores), where
#             the math form's sum to PaLM's 6·N + 12·l·h·s.
#   bytes     reads q, k, v (and o, its gradient and the logsumexp in the backward), writes o, the logsumexp and the
#             dropout's seed (dq, dk, dv in the backward): no s×s tensor goes through memory.
#   rate      a matrix multiply of shape M = b·a·s query rows, N = s keys, K = d, as the math form's Q K^T ``bmm``
#             is recorded (Note [GEMM shape]), so the roofline prices it as those batched GEMMs per FLOP, no better.
#             On the catalog's tensor-core roofline (half_dim 128; Note [GEMM shape factor] in
# sim.planning.hardware.roofline)
#             a head width of 128 halves the rate: about 0.34 of peak, FlashAttention-2's on an H100 (35%, as
#             Shah et al., 2024, FlashAttention-3, report it), below its 50-73% on an A100 (Dao, 2023) and
#             FlashAttention-3's up to 75% on an H100. A lower bound for Hopper's own kernels, then; a roofline
#             calibrated on the device moves it with the GEMMs. The gain over the math form is the FLOPs, bytes and
#             kernels it skips.
#: What each FlashAttention kernel executes, in multiples of the forward's FLOPs (Note [flash attention]).
_FLASH_PASSES = {"gpipe_sim::flash_attention": 1.0, "gpipe_sim::flash_attention_backward": 2.5}


def _flash_attention(q: torch.Tensor, v: torch.Tensor, multiple: float) -> tuple[float, float, float, float]:
    """FLOPs and GEMM dimensions ``M, N, K`` of a FlashAttention kernel on ``q`` (B, T, A, d) and ``v`` (B, T, K,
    d_v), ``multiple`` times the causal forward's ``b·a·s²·(d + d_v)`` (``2·b·a·s²·d`` where d_v = d, as every head
    but MLA's; Note [flash attention]); K is the mean of the two widths."""
    b, s, a, d = (int(n) for n in q.shape)
    width = (d + int(v.shape[-1])) / 2.0
    return multiple * 2.0 * b * a * s * s * width, float(b * a * s), float(s), width


class UnknownOperatorError(ValueError):
    """An operator the counter does not know (Note [no free operators]); the message says what to add."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the counter does not know the operator aten::{name}: it has no FLOP formula and is not known to be "
            f"memory-bound, so it cannot be timed (it would count as free). If it moves bytes and does little "
            f"arithmetic, pass memory_bound={{'{name}'}} to count_layers (or add it to "
            f"sim.planning.counting.operators.MEMORY_BOUND_OPERATORS); if it computes, register its FLOP formula in "
            f"torch.utils.flop_counter.flop_registry")
        self.operator = name


def _groups(args: Any, kwargs: dict[str, Any], conv: bool) -> int:
    if not conv:
        return 1
    for index, key in ((8, "groups"), (9, "groups")):  # convolution(..., groups); convolution_backward(..., groups)
        value = args[index] if len(args) > index else kwargs.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 1


# Note [GEMM shape]: a matrix multiply or convolution runs as a GEMM, ``C[M, N] += A[M, K] B[K, N]``, whose
# achievable rate depends on its shape (:mod:`sim.planning.hardware.roofline`). The counter reads it off the output:
# ``N`` is the output's last dimension (a matrix product; ``bmm`` stacks its batch into ``M``) or its channels
# (a convolution's implicit GEMM, ``M`` = batch x output pixels), and ``K = flops / (2 M N)``. Grouped
# convolutions (depthwise ones) run as direct kernels, not GEMMs: their shape is left unknown (0).
def _gemm_dims(out: torch.Tensor | None, flops: float, conv: bool, groups: int = 1) -> tuple[float, float, float]:
    """``(M, N, K)`` of the GEMM that produces ``out`` with ``flops`` FLOPs (Note [GEMM shape]); zeros if unknown."""
    if out is None or out.dim() < 2 or flops <= 0 or groups != 1:
        return 0.0, 0.0, 0.0
    n = int(out.shape[1] if conv else out.shape[-1])
    m = out.numel() // max(n, 1)
    if n <= 0 or m <= 0:
        return 0.0, 0.0, 0.0
    return float(m), float(n), flops / (2.0 * m * n)


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
def _kernels(packet: Any, args: Any, kwargs: dict[str, Any], out: Any) -> list[Op] | None:
    """The kernels a GPU runs for one operator that is not one single-pass kernel, as :data:`Op`;
    ``None`` for every other operator (Note [one operator, several kernels])."""
    if packet is _aten.convolution_backward:
        grad_out, x, w = (_arg(args, kwargs, k, name) for k, name in enumerate(("grad_output", "input", "weight")))
        mask = list(_arg(args, kwargs, 10, "output_mask"))
        reads = ((grad_out, w), (grad_out, x), (grad_out,))  # backward-data, backward-filter, backward-bias
        groups = int(_arg(args, kwargs, 9, "groups"))
        kernels: list[Op] = []
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
            traffic = float(sum(map(_tensor_bytes, reads[k])) + _tensor_bytes(out[k]))
            if k == 2:
                kernels.append((0.0, traffic, MEMORY_BOUND, 0.0, 0.0, 0.0, 0.0))
            elif k == 0:  # backward-data: a GEMM whose output is the input's gradient
                kernels.append((flops, traffic, CONVOLUTION, *_gemm_dims(out[0], flops, True, groups), 0.0))
            else:  # backward-filter: C[Cout, Cin·kh·kw], K over batch x output pixels
                wg = out[1]
                dims = (0.0, 0.0, 0.0) if groups != 1 or flops <= 0 else \
                    (float(wg.shape[0]), float(wg.numel() // wg.shape[0]), flops / (2.0 * wg.numel()))
                kernels.append((flops, traffic, CONVOLUTION, *dims, 0.0))
        return kernels
    if packet not in _BATCH_NORM and packet is not _aten.native_batch_norm_backward:
        return None
    single_pass = sum(map(_tensor_bytes, _tensors((args, kwargs)))) + sum(map(_tensor_bytes, _tensors(out)))
    if packet in _BATCH_NORM and _arg(args, kwargs, 5, "training"):
        x = _arg(args, kwargs, 0, "input")
        return [(0.0, float(_tensor_bytes(x)), VECTOR_MATH, 0.0, 0.0, 0.0, 0.0),  # statistics, then normalisation
                (0.0, float(single_pass), VECTOR_MATH, 0.0, 0.0, 0.0, 0.0)]
    if packet is _aten.native_batch_norm_backward and _arg(args, kwargs, 7, "train"):
        grad_out, x = _arg(args, kwargs, 0, "grad_out"), _arg(args, kwargs, 1, "input")
        return [(0.0, float(_tensor_bytes(grad_out) + _tensor_bytes(x)), VECTOR_MATH, 0.0, 0.0, 0.0, 0.0),
                (0.0, float(single_pass), VECTOR_MATH, 0.0, 0.0, 0.0, 0.0)]
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

