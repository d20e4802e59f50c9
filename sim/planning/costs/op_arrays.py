"""Every operator of a counted model's layers in one set of arrays, for the vectorised timing of
:class:`sim.planning.costs.from_flops.FlopCosts`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.planning.counting.counts import COLLECTIVE, MEMORY_BOUND, OpTable
from sim.planning.counting.fp8 import fp8_tables
from sim.planning.parallel.context_parallel import attention_kernels

__all__ = ["OpArrays", "op_arrays"]


@dataclass(frozen=True, eq=False)
class OpArrays:
    """Every operator of every layer in one array, for vectorised timing."""

    flops: np.ndarray  # (ops, 2)
    bytes: np.ndarray  # (ops, 2)
    starts: np.ndarray  # first operator of each layer
    empty: np.ndarray  # layers without operators
    kinds: np.ndarray  # (ops,) MEMORY_BOUND, MATMUL, CONVOLUTION or VECTOR_MATH (COLLECTIVE: in collective)
    collective: np.ndarray  # (ops,) ALL_REDUCE, REDUCE_SCATTER or ALL_GATHER where a tensor-parallel collective, else 0
    dims: np.ndarray  # (ops, 3, 2) GEMM M, N, K as fixed + per-sample
    fp8: np.ndarray  # (ops,) a product that runs in FP8 (Note [fp8 training] in sim.planning.counting.fp8)
    attention: np.ndarray  # (ops,) a FlashAttention kernel (sim.planning.parallel.context_parallel.attention_kernels)


def op_arrays(tables: Sequence[OpTable], fp8: bool = False) -> OpArrays:
    """The operators of ``tables`` (one per layer, in order) in one array; ``fp8``: as FP8 training runs them."""
    pairs = fp8_tables(tables) if fp8 else [(t, np.zeros(t.kernels, dtype=bool)) for t in tables]
    tables = [t for t, _ in pairs]
    counts = np.array([t.kernels for t in tables])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    flops = np.concatenate([t.flops for t in tables] + [np.zeros((1, 2))])
    nbytes = np.concatenate([t.bytes for t in tables] + [np.zeros((1, 2))])
    kinds = np.concatenate([t.kinds_or_default() for t in tables] + [np.zeros(1, dtype=np.int8)]).astype(np.int64)
    dims = np.concatenate([t.dims_or_default() for t in tables] + [np.zeros((1, 3, 2))])
    collective = np.concatenate([t.collectives_or_default() for t in tables] + [np.zeros(1, dtype=np.int8)])
    collective = np.where(kinds == COLLECTIVE, collective, 0).astype(np.int64)
    kinds[kinds == COLLECTIVE] = MEMORY_BOUND  # to index the roofline's tables; priced apart
    in_fp8 = np.concatenate([mask for _, mask in pairs] + [np.zeros(1, dtype=bool)])
    attention = np.concatenate([attention_kernels(t) for t in tables] + [np.zeros(1, dtype=bool)])
    return OpArrays(flops, nbytes, starts, counts == 0, kinds, collective, dims, in_fp8, attention)
