"""What :func:`~sim.planning.counting.flops.count_layers` returns: per-layer FLOP and byte tables, affine in the batch.

Every count is stored as ``fixed + per_sample * batch`` (Note [affine in the batch] in
:mod:`sim.planning.counting.flops`), so one count serves every micro-batch size of a sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ALL_GATHER", "ALL_REDUCE", "ALL_TO_ALL", "COLLECTIVE", "COLLECTIVE_NAMES", "CONVOLUTION", "MATMUL",
           "MEMORY_BOUND", "REDUCE_SCATTER", "VECTOR_MATH", "AttentionCore", "Held", "LayerCount", "LayerProfile",
           "ModelProfile", "OpTable"]

#: What bounds a counted kernel (``OpTable.kinds``): memory-bound (bytes at bandwidth), a matrix multiply
#: (``mm``, ``addmm``, ``bmm``, ...) or a convolution (an implicit GEMM), both compute-bound by their shape, or a
#: memory-bound kernel with arithmetic per element (activations such as GELU, softmax, normalisations, pooling,
#: losses), priced by its bytes at its own fraction of the bandwidth (Note [vector math] in
#: :mod:`sim.planning.counting.operators`), or a collective among tensor- or expert-parallel ranks (which one:
#: ``OpTable.collectives``), priced on the tensor-parallel link (:mod:`sim.planning.counting.tensor_parallel`).
MEMORY_BOUND, MATMUL, CONVOLUTION, VECTOR_MATH, COLLECTIVE = 0, 1, 2, 3, 4

#: Which collective a :data:`COLLECTIVE` operator is (``OpTable.collectives``; 0 for every other operator). Its bytes
#: are the whole message: the tensor an all-reduce sums, a reduce-scatter's input, an all-gather's output, the rows
#: one rank sends in an all-to-all (among the expert-parallel ranks, not the tensor-parallel ones: Note [all-to-all]
#: in :mod:`sim.planning.counting.expert_parallel`).
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL = 1, 2, 3, 4
#: Each collective's name, for messages.
COLLECTIVE_NAMES = {ALL_REDUCE: "all-reduce", REDUCE_SCATTER: "reduce-scatter", ALL_GATHER: "all-gather",
                    ALL_TO_ALL: "all-to-all"}


@dataclass(frozen=True, eq=False)
class OpTable:
    """The operators of one pass of one layer, each as ``fixed + per_sample * batch`` FLOPs and bytes.

    Attributes:
        flops: shape ``(ops, 2)``: fixed and per-sample FLOPs of each operator.
        bytes: shape ``(ops, 2)``: fixed and per-sample bytes each operator reads and writes.
        kinds: shape ``(ops,)``: :data:`MEMORY_BOUND`, :data:`MATMUL`, :data:`CONVOLUTION`,
            :data:`VECTOR_MATH` or :data:`COLLECTIVE`; ``None`` (a table
            built by hand): an operator with FLOPs is a matrix multiply, one without is memory-bound.
        dims: shape ``(ops, 3, 2)``: fixed and per-sample GEMM dimensions ``M, N, K`` of each compute-bound
            operator (a convolution's implicit GEMM); 0 where unknown or not a GEMM. ``None``: all unknown.
        collectives: shape ``(ops,)``: :data:`ALL_REDUCE`, :data:`REDUCE_SCATTER`, :data:`ALL_GATHER` or
            :data:`ALL_TO_ALL` for each
            :data:`COLLECTIVE` operator, 0 for the others; ``None``: every collective an all-reduce.
        linear: shape ``(ops,)``: True for a 2-D matrix product (``mm``, ``addmm``: a Linear layer's forward and
            gradients; Note [linear products] in :mod:`sim.planning.counting.operators`), the products FP8 training runs
            in FP8; ``None``: none is known to be one.
        modules: shape ``(ops,)``: the bits of the marked modules each operator of a forward ran in (Note [recompute
            modules] in :mod:`sim.planning.counting.modules`); ``None``: none.
    """

    flops: np.ndarray
    bytes: np.ndarray
    kinds: np.ndarray | None = None
    dims: np.ndarray | None = None
    collectives: np.ndarray | None = None
    linear: np.ndarray | None = None
    modules: np.ndarray | None = None

    def kinds_or_default(self) -> np.ndarray:
        """:attr:`kinds`, or for a table built by hand: matrix multiply where it has FLOPs, else memory-bound."""
        if self.kinds is not None:
            return self.kinds
        return np.where(self.flops.any(axis=1), MATMUL, MEMORY_BOUND).astype(np.int8)

    def dims_or_default(self) -> np.ndarray:
        """:attr:`dims`, or zeros (every dimension unknown)."""
        return self.dims if self.dims is not None else np.zeros((self.kernels, 3, 2))

    def collectives_or_default(self) -> np.ndarray:
        """:attr:`collectives`, or :data:`ALL_REDUCE` for every :data:`COLLECTIVE` operator and 0 for the others."""
        if self.collectives is not None:
            return self.collectives
        return np.where(self.kinds_or_default() == COLLECTIVE, ALL_REDUCE, 0).astype(np.int8)

    def linear_or_default(self) -> np.ndarray:
        """:attr:`linear`, or False for every operator."""
        return self.linear if self.linear is not None else np.zeros(self.kernels, dtype=bool)

    def modules_or_default(self) -> np.ndarray:
        """:attr:`modules`, or 0 for every operator."""
        return self.modules if self.modules is not None else np.zeros(self.kernels, dtype=np.int8)

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



@dataclass(frozen=True)
class Held:
    """Saved bytes of one layer that the same marked modules produced (Note [recompute modules] in
    :mod:`sim.planning.counting.modules`; Note [fp8 saved] in :mod:`sim.planning.counting.saved`).

    Attributes:
        modules: the bits of the modules that produced them (0: none, kept whatever the recompute).
        bf16: ``(fixed, per_sample)`` bytes as the layer keeps them (part of ``LayerProfile.saved_bytes``).
        fp8: ``(fixed, per_sample)`` bytes under FP8 training, the Linears' inputs in FP8.
    """

    modules: int
    bf16: tuple[float, float]
    fp8: tuple[float, float]


@dataclass(frozen=True, eq=False)
class LayerProfile:
    """What one layer costs, for any batch size (Note [affine in the batch] in :mod:`sim.planning.counting.flops`).

    Attributes:
        name: the layer's name in the sequential (``"3"`` or ``"layer1_0_conv1"``).
        kind: the layer's class name.
        forward: operators of the forward pass.
        backward: operators of the backward pass (input and weight gradients, gradient accumulation).
        input_backward: operators of the backward that takes the input's gradient alone (a split backward's
            ``B``; Note [split backward] in :mod:`sim.planning.counting.flops`); ``None``: not counted apart.
        output_bytes: ``(fixed, per_sample)`` bytes of the layer's output.
        input_bytes: ``(fixed, per_sample)`` bytes of the layer's input.
        saved_bytes: ``(fixed, per_sample)`` bytes first saved for backward by this layer.
        input_saved_bytes: ``(fixed, per_sample)`` bytes of this layer's input that it saves and an
            earlier layer saved already; a stage that starts here keeps them too.
        parameters: parameter count (shared parameters at their first layer only).
        parameter_bytes: bytes of those parameters.
        parameter_tensors: how many parameter tensors those are (an optimizer runs a kernel per tensor).
        new_output_bytes: ``(fixed, per_sample)`` bytes of the output the layer allocates (tensors of its
            output that are not tensors of its input, such as the skips a tuple passes through);
            ``None``: all of ``output_bytes``.
        expert_parameters: how many of ``parameters`` are routed experts' (this rank's shard of them), whose
            optimizer state and gradients belong to the expert-data-parallel group (Note [mixture of experts] in
            :mod:`sim.planning.counting.models.moe_config`); 0 for a layer without experts.
        held: ``saved_bytes`` told apart by the modules that produced them, with their FP8 training bytes (one
            :class:`Held` per set of modules); empty: not counted apart (a profile built by hand).
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
    input_backward: OpTable | None = None
    new_output_bytes: tuple[float, float] | None = None
    expert_parameters: int = 0
    held: tuple[Held, ...] = ()

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
class AttentionCore:
    """What a decoder block's attention core is, for selective recompute (:mod:`sim.planning.parallel.recompute`).

    The core is ``QK^T``, scale, causal mask, softmax, dropout and ``@ V`` on one rank's heads.

    Attributes:
        heads: attention heads of one rank (``a / t``).
        seq: tokens per sample (``s``).
        saved_bytes: bytes per sample the core saves for backward in one block: softmax output, dropout mask and
            dropout output, ``5 a s^2 / t`` in 16 bits with dropout (Korthikanti et al., 2022).
    """

    heads: int
    seq: int
    saved_bytes: float


@dataclass(frozen=True)
class ModelProfile:
    """The per-layer profiles of a whole sequential, in layer order.

    Attributes:
        layers: one :class:`LayerProfile` per layer.
        dtype: the floating dtype of the parameters (``torch.float16`` for mixed precision).
        tensor_parallel: the ranks the model's collectives run among (Note [group on the marker] in
            :mod:`sim.planning.counting.tensor_parallel`); 1: a model without them, counted whole.
        sequence_parallel: the shard splits the tokens between its tensor-parallel regions over the ranks too
            (Korthikanti et al., 2022): it runs reduce-scatters and all-gathers, not all-reduces.
        attention_core: the blocks' attention core, for selective recompute; ``None``: the model has none the
            planner can find (a user's model, a fused attention).
        context_parallel: the ranks each sample's tokens are split over; the count is one rank's
            (:func:`sim.planning.parallel.context_parallel.split_sequence`); 1: the whole sequence.
        expert_parallel: the ranks the model's all-to-alls run among (Note [all-to-all] in
            :mod:`sim.planning.counting.expert_parallel`); 1: a model without them.
    """

    layers: tuple[LayerProfile, ...]
    dtype: torch.dtype
    tensor_parallel: int = 1
    attention_core: AttentionCore | None = None
    sequence_parallel: bool = False
    context_parallel: int = 1
    expert_parallel: int = 1

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def parameters(self) -> int:
        return sum(layer.parameters for layer in self.layers)

    @property
    def expert_parameters(self) -> int:
        """The routed experts' parameters of this rank (:attr:`LayerProfile.expert_parameters`)."""
        return sum(layer.expert_parameters for layer in self.layers)

    @property
    def parameter_bytes(self) -> int:
        return sum(layer.parameter_bytes for layer in self.layers)

    def at(self, batch: int) -> list[LayerCount]:
        """Every layer's totals at ``batch`` samples."""
        return [layer.at(batch) for layer in self.layers]
