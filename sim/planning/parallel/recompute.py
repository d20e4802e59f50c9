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
    modules:A+B                  Megatron-Core's ``--recompute-modules A,B`` of ``layernorm``, ``mla_up_proj``,
                                 ``moe_act`` (Note [recompute modules] in sim.planning.counting.modules): kept =
                                 everything but what those modules produced; backward += their forward

Reference: Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models", sections 4.1
(selective) and 5 (full recompute per layer).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpipe.schedule import CHECKPOINT_MODES, Checkpoint
from sim.planning.counting.counts import MATMUL, AttentionCore, LayerProfile, OpTable
from sim.planning.counting.modules import MODULES, module_mask

__all__ = ["CHECKPOINTS", "DEEPSEEK_MODULES", "PER_LAYER", "check_checkpoint", "core_table", "deepseek_modules",
           "inside_backward", "inside_table", "layer_saved", "modules_policy", "policy_modules", "recompute_fraction",
           "schedule_checkpoint"]

PER_LAYER = ("layers", "selective")
#: Every policy the planner takes by one name: the schedule's (torchgpipe's) and the two per layer; and
#: ``modules:A+B`` (:func:`modules_policy`).
CHECKPOINTS = (*CHECKPOINT_MODES, *PER_LAYER)
#: DeepSeek-V3's set (arXiv 2412.19437, sections 3.2.3 and 3.3.3: the RMSNorms, MLA's up-projections, the MoE's SwiGLU
#: output), offered by default to a model with MLA or MoE blocks (``practice_checkpoints`` in sim.planning.request).
DEEPSEEK_MODULES = ("layernorm", "mla_up_proj", "moe_act")
_MODULES = "modules:"


def modules_policy(names: Sequence[str]) -> str:
    """The policy that recomputes ``names`` (of :data:`~sim.planning.counting.modules.MODULES`), as Megatron-Core's
    ``--recompute-granularity selective --recompute-modules`` does: ``modules:layernorm+moe_act``.

    Raises:
        ValueError: no name, or one that is not a module.
    """
    if not names:
        raise ValueError("a modules policy recomputes at least one module")
    module_mask(tuple(names))
    return _MODULES + "+".join(sorted(set(names), key=MODULES.index))


def deepseek_modules(mla: bool, moe: bool) -> tuple[str, ...]:
    """The modules of :data:`DEEPSEEK_MODULES` a decoder has, for the default sweep: none for one with neither MLA
    nor MoE blocks (its defaults stay as they were), else ``layernorm`` and those of its blocks."""
    if not (mla or moe):
        return ()
    return ("layernorm", *(("mla_up_proj",) if mla else ()), *(("moe_act",) if moe else ()))


def policy_modules(policy: str) -> int:
    """The module bits a policy recomputes (0: none, or not a ``modules:`` policy).

    Raises:
        ValueError: a ``modules:`` policy naming an unknown module.
    """
    if not policy.startswith(_MODULES):
        return 0
    return module_mask(tuple(policy[len(_MODULES):].split("+")))


def check_checkpoint(policy: str) -> None:
    """Refuse a policy the planner does not know.

    Raises:
        ValueError: not one of :data:`CHECKPOINTS` nor a ``modules:`` policy of known modules.
    """
    if policy not in CHECKPOINTS and not policy_modules(policy):
        raise ValueError(f"unknown checkpoint mode {policy!r}; use {', '.join(CHECKPOINTS)} or modules:A+B of "
                         f"{', '.join(MODULES)}")


def inside_backward(policy: str) -> bool:
    """Whether ``policy`` recomputes inside each backward (``selective`` and ``modules:``), not as a task of its own."""
    return policy == "selective" or bool(policy_modules(policy))


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
    if inside_backward(policy):
        return "never"
    if policy not in CHECKPOINT_MODES:
        raise ValueError(f"unknown checkpoint mode {policy!r}; use {', '.join(CHECKPOINTS)}")
    return policy  # type: ignore[return-value]


def recompute_fraction(policy: str, chunks: int) -> float:
    """The fraction of micro-batches whose whole forward is recomputed (for balancing stages)."""
    if inside_backward(policy):
        return 0.0
    return {"never": 0.0, "always": 1.0, "layers": 1.0, "except_last": (chunks - 1) / chunks}[policy]


def inside_table(table: OpTable, policy: str, core: AttentionCore | None) -> OpTable:
    """The operators of ``table`` (a layer's forward) that ``policy`` runs again inside the backward: the attention
    core (``selective``; :func:`core_table`) or the marked modules' (``modules:``); none for another policy."""
    if policy == "selective" and core is not None:
        return core_table(table, core)
    keep = (table.modules_or_default() & policy_modules(policy)) != 0
    return OpTable(table.flops[keep], table.bytes[keep], table.kinds_or_default()[keep],
                   table.dims_or_default()[keep], linear=table.linear_or_default()[keep])


# Note [saved under a policy]: a layer counted by the meta-device counter tells its saved bytes apart by the modules
# that produced them, each with its bytes under FP8 training (Note [fp8 saved] in sim.planning.counting.saved); a
# ``modules:`` policy drops those its modules produced, an FP8 policy takes the FP8 bytes of every layer but the
# sequential's first and last (which run in BF16). A profile built by hand has one figure, ``saved_bytes``.
def layer_saved(layer: LayerProfile, policy: str, fp8: bool) -> tuple[float, float]:
    """``(fixed, per_sample)`` bytes ``layer`` saves first under ``policy`` and, where ``fp8``, FP8 training (Note
    [saved under a policy]; ``selective``'s core is taken out by the caller, by its closed form)."""
    if not layer.held:
        return layer.saved_bytes
    drop = policy_modules(policy)
    kept = [h.fp8 if fp8 else h.bf16 for h in layer.held if not h.modules & drop]
    return sum(q[0] for q in kept), sum(q[1] for q in kept)


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
