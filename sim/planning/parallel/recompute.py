"""Recompute policies of the planner: torchgpipe's per stage, Megatron-LM's per layer, and selective recompute.

::

    never, except_last, always   torchgpipe's policies: a checkpointed micro-batch keeps its stage's input and
                                 recomputes the whole stage (R) before its backward
    layers                       every layer keeps its input and recomputes itself before its own backward
                                 (Megatron-LM's full recompute): kept = the stage's layer inputs, and while the
                                 stage runs backward, one layer's activations at a time (Note [per-layer recompute])
    selective                    only the attention core (QK^T, scale, mask, softmax, dropout, @V) is recomputed,
                                 inside the backward (Korthikanti et al., 2022): kept = everything but the core's
                                 bytes; backward += the core's forward

Reference: Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models", sections 4.1
(selective) and 5 (full recompute per layer).
"""

from __future__ import annotations

import numpy as np

from gpipe.schedule import CHECKPOINT_MODES, Checkpoint
from sim.planning.counting.counts import MATMUL, AttentionCore, OpTable

__all__ = ["CHECKPOINTS", "PER_LAYER", "core_table", "recompute_fraction", "schedule_checkpoint"]

PER_LAYER = ("layers", "selective")
#: Every policy the planner takes: the schedule's (torchgpipe's) and the two per layer.
CHECKPOINTS = (*CHECKPOINT_MODES, *PER_LAYER)


# Note [per-layer recompute]: the simulator knows one kind of recompute, a stage's R task before its B. ``layers``
# runs the schedule with ``always``, so every micro-batch's F keeps ``checkpoint_bytes`` and R holds ``saved_bytes``
# until B; the planner sets ``checkpoint_bytes`` to the sum of the stage's layer inputs (each layer's checkpoint) and
# ``saved_bytes`` to the largest one layer saves, since the stage recomputes and back-propagates one layer at a time.
# (less that layer's input, which its recompute saves by reference to the kept copy). R lasts the stage's whole
# forward, as every layer is recomputed once. ``selective`` runs with ``never``: nothing
# is recomputed as a task of its own; the core's forward is priced into B and its bytes are not kept. Every layer
# of the sequential is a unit of ``layers``: a block keeps its input (2 s b h bytes in 16 bits), the embedding its
# token ids, the head its input.
def schedule_checkpoint(policy: str) -> Checkpoint:
    """The schedule's checkpoint mode a planner policy runs with (Note [per-layer recompute])."""
    if policy == "layers":
        return "always"
    if policy == "selective":
        return "never"
    if policy not in CHECKPOINT_MODES:
        raise ValueError(f"unknown checkpoint mode {policy!r}; use {', '.join(CHECKPOINTS)}")
    return policy  # type: ignore[return-value]


def recompute_fraction(policy: str, chunks: int) -> float:
    """The fraction of micro-batches whose whole forward is recomputed (for balancing stages)."""
    return {"never": 0.0, "selective": 0.0, "always": 1.0, "layers": 1.0,
            "except_last": (chunks - 1) / chunks}[policy]


def core_table(table: OpTable, core: AttentionCore) -> OpTable:
    """The operators of ``table`` (a layer's forward) that form its attention core; none for a layer without one.

    The core runs from the batched ``Q K^T`` to the batched ``@ V``: the two matrix products whose rows are the
    rank's heads times the tokens, ``heads * seq`` per sample, with everything between them.
    """
    kinds = table.kinds_or_default()
    dims = table.dims_or_default()
    rows = np.flatnonzero((kinds == MATMUL) & (dims[:, 0, 1] == core.heads * core.seq) & (dims[:, 0, 0] == 0))
    keep = np.zeros(table.kernels, dtype=bool)
    if len(rows) >= 2:
        keep[rows[0]:rows[1] + 1] = True
    return OpTable(table.flops[keep], table.bytes[keep], kinds[keep], dims[keep],
                   linear=table.linear_or_default()[keep])
