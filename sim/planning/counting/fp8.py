"""FP8 training as NVIDIA TransformerEngine runs it: which counted kernels run in FP8, and the casts that feed them.

Reference: NVIDIA TransformerEngine's documentation ("Using FP8 with Transformer Engine": ``fp8_autocast``, the
``DelayedScaling`` recipe, E4M3 forward and E5M2 gradients in the ``HYBRID`` format); Micikevicius et al. (2022),
"FP8 Formats for Deep Learning"; Megatron-LM's ``--fp8-format hybrid``, which wraps its transformer layers in
``fp8_autocast``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.planning.counting.counts import MEMORY_BOUND, OpTable

__all__ = ["CAST_BYTES_PER_ELEMENT", "fp8_tables"]

# Note [fp8 training]: TransformerEngine runs a Linear layer's three GEMMs in FP8 (the forward's in E4M3, the two
# gradients' with E5M2 output gradients) and everything else in BF16: attention's batched products (FP8 attention is
# an option, off by default), softmax, normalisations, activations, and the layers outside ``fp8_autocast``, which in
# Megatron-LM are the embedding and the output layer. So under an FP8 policy (``Training.other_compute``):
#   1. every linear product (Note [linear products] in sim.planning.counting.operators) of every layer but
#      the sequential's first and last runs at ``peak_flops[compute]`` (``"fp8"``) times the roofline's fp8
#      matmul fraction;
#   2. every other kernel runs as under BF16 (products at ``peak_flops["bf16"]``);
#   3. before each FP8 product whose rows grow with the batch (the forward's, input ``x[M, K]``; the input
#      gradient's, output gradient ``dy[M, K]``) one cast kernel, memory-bound: it reads the BF16 tensor (2 bytes per
#      element) and writes its FP8 copy and the FP8 transpose (1 + 1), as TE's fused cast-transpose does; the weight
#      gradient's product reads those transposes and casts nothing. Amax comes with the cast (delayed scaling).
#   4. a weight is cast once per step (TE caches it over the micro-batches), priced in the optimizer step
#      (``Training.update_bytes``); its FP8 copy and transpose are model state (``Training.fp8_weight_bytes``).
# The products' own bytes stay BF16's (an upper bound for a memory-bound product). The activations kept for backward
# are TE's: a Linear's input as its FP8 copy (Note [fp8 saved] in sim.planning.counting.saved), in every layer but the
# first and last. Current scaling (amax before the cast) would add one read of the BF16 tensor per cast.
#: Bytes one cast kernel moves per element of its tensor (Note [fp8 training]): BF16 read, FP8 copy and transpose.
CAST_BYTES_PER_ELEMENT = 2 + 1 + 1


def _with_casts(table: OpTable) -> tuple[OpTable, np.ndarray]:
    """``table`` with a cast kernel before each linear product whose ``M`` grows with the batch, and the mask of its
    FP8 products (Note [fp8 training], steps 1 and 3)."""
    linear = table.linear_or_default()
    dims = table.dims_or_default()
    casts = linear & (dims[:, 0, 1] > 0) & (dims[:, 2, 1] == 0)  # x[M, K] or dy[M, K]: M per sample, K fixed
    if not casts.any():
        return table, linear
    order = np.argsort(np.concatenate([np.arange(table.kernels), np.flatnonzero(casts) - 0.5]), kind="stable")
    k = dims[casts, 2, 0]
    cast_bytes = CAST_BYTES_PER_ELEMENT * dims[casts, 0, :] * k[:, None]  # (fixed, per sample) elements of M x K
    n = int(casts.sum())
    kinds = table.kinds_or_default()
    cast_table = OpTable(
        flops=np.concatenate([table.flops, np.zeros((n, 2))])[order],
        bytes=np.concatenate([table.bytes, cast_bytes])[order],
        kinds=np.concatenate([kinds, np.full(n, MEMORY_BOUND, dtype=kinds.dtype)])[order],
        dims=np.concatenate([dims, np.zeros((n, 3, 2))])[order],
        collectives=np.concatenate([table.collectives_or_default(), np.zeros(n, dtype=np.int8)])[order],
        linear=np.concatenate([linear, np.zeros(n, dtype=bool)])[order],
    )
    return cast_table, cast_table.linear_or_default()


def fp8_tables(tables: Sequence[OpTable]) -> list[tuple[OpTable, np.ndarray]]:
    """Each layer's table of one pass as FP8 training runs it, with the mask of its kernels that run in FP8.

    ``tables`` are the whole sequential's, in order: the first and last layers keep BF16 (Note [fp8 training]).
    """
    out = []
    for i, table in enumerate(tables):
        if 0 < i < len(tables) - 1:
            out.append(_with_casts(table))
        else:
            out.append((table, np.zeros(table.kernels, dtype=bool)))
    return out
