"""Sharded data parallelism, ZeRO stages 0-3: what each device of a stage's data-parallel group holds and sends.

Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (Figure 1), as
DeepSpeed, Megatron-LM's distributed optimizer (stage 1) and PyTorch FSDP (stages 2 and 3) implement it. With
``Psi`` parameters, ``d`` replicas and ``K`` bytes of optimizer state per parameter (the 32-bit master included)::

    ZeRO   shards                          model state per device (mixed precision, 16-bit gradients)
    0      nothing                         (2 + 2 + K) Psi
    1      optimizer state and master      2 Psi + 2 Psi + K Psi / d
    2      ... and gradients               2 Psi + (2 + K) Psi / d
    3      ... and the 16-bit parameters   (2 + 2 + K) Psi / d

Traffic, per pipeline stage and step (Note [zero traffic]), unit by unit (Note [units]); ``d = 1`` shards nothing
and sends nothing::

    ZeRO   gradients                                   parameters (the 16-bit copy)
    0      all-reduce as the last backward makes them  -
    1      reduce-scatter, as stage 0                   all-gather after the optimizer step (exposed)
    2      reduce-scatter after every backward          all-gather after the optimizer step (exposed)
    3      reduce-scatter after every backward          all-gather before every forward and (resharded) backward

A sweep takes each pipeline stage's :func:`sharded_state` as its model state (``MemoryParts``' parameters,
gradients, optimizer), adds :func:`transient_bytes` to its forward and backward working sets, and gives the stage
its :func:`stage_collectives`: tasks on its device's communication stream in the simulation
(:mod:`sim.core.collectives`), so the timeline holds every collective;
:func:`sim.planning.parallel.replicas.step_seconds` adds the optimizer step and the gather after it
(:func:`after_step_bytes`).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sim.core.collectives import Gather, StageCollectives, Unit

if TYPE_CHECKING:
    from sim.planning.counting.training import Training

__all__ = ["REDUCE_BUCKET_ELEMENTS", "UNIT_FRACTION", "ZERO_STAGES", "Kind", "ModelState", "StageBytes", "Transient",
           "after_step_bytes", "check_shard", "check_zero", "compute_copy_bytes", "sent_per_step", "sharded_state",
           "stage_collectives", "transient_bytes", "units"]

#: The ZeRO stages: 0 plain data parallelism, 1 optimizer state, 2 and gradients, 3 and parameters.
ZERO_STAGES = (0, 1, 2, 3)

#: Elements of the gradient bucket ZeRO-2 and ZeRO-3 reduce through: DeepSpeed's default
#: ``zero_optimization.reduce_bucket_size``, 5e8 (Note [buckets]).
REDUCE_BUCKET_ELEMENTS = 500_000_000


def check_zero(zero: int, replicas: int) -> None:
    """Raise ``ValueError`` for a stage not in :data:`ZERO_STAGES` or fewer than one replica."""
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise ValueError(f"unknown ZeRO stage {zero!r}; known: {', '.join(map(str, ZERO_STAGES))}")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"data-parallel replicas must be an integer >= 1, got {replicas!r}")


class StageBytes(Protocol):
    """A stage's model state in bytes, as :class:`sim.core.cost.StageCost` holds it."""

    @property
    def parameter_bytes(self) -> int: ...

    @property
    def gradient_bytes(self) -> int: ...

    @property
    def optimizer_bytes(self) -> int: ...


@dataclass(frozen=True)
class ModelState:
    """Bytes one device holds for one stage from step to step.

    Attributes:
        parameters: the 16-bit compute copy (sharded from stage 3), the 32-bit master (from stage 1) and whatever
            else the stage's parameter bytes hold (buffers: never sharded), as ``MemoryParts.parameters`` counts.
        gradients: the accumulated gradients (sharded from stage 2).
        optimizer: the optimizer's state (sharded from stage 1).
    """

    parameters: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def compute_copy_bytes(parameters: int, training: Training) -> int:
    """Bytes of the copy of ``parameters`` the matrix products read (16-bit in mixed precision): what ZeRO gathers."""
    return parameters * training.torch_dtype.itemsize


def _shard(nbytes: int, replicas: int) -> int:
    return -(-nbytes // replicas)


# Note [zero memory]: the paper's accounting (section 5.1, Figure 1): stage 1 partitions the optimizer state, which
# in mixed precision includes the 32-bit master weights (its K = 12 for Adam: master, momentum, variance), so the
# master's shard moves with it; stage 2 adds the gradients, stage 3 the 16-bit parameters. Without mixed precision
# the weights are the compute copy and there is no master. A shard rounds up: implementations pad the flat buffer
# to a multiple of d (DeepSpeed's partitions, FSDP's FlatParameter). FP8 training's weight copies
# (``Training.fp8_weight_bytes``) are cast from the 16-bit copy for every step's products, so every stage keeps them
# whole, with the buffers.
def sharded_state(stage: StageBytes, parameters: int, training: Training, zero: int, replicas: int) -> ModelState:
    """The model state one of ``replicas`` devices holds for ``stage`` under ZeRO stage ``zero`` (Note [zero memory]).

    Args:
        stage: the stage's unsharded bytes (a :class:`~sim.core.cost.StageCost`).
        parameters: the stage's parameter count (its shard of a tensor-parallel group).
        training: the policy the bytes were counted with (splits ``parameter_bytes`` into copy and master).
        zero: a stage of :data:`ZERO_STAGES`.
        replicas: the data-parallel group's size ``d``; 1 shards nothing.

    Raises:
        ValueError: an unknown stage, ``replicas < 1``, or fewer parameter bytes than ``parameters`` take.
    """
    check_zero(zero, replicas)
    copy = compute_copy_bytes(parameters, training)
    master = parameters * (training.weight_bytes - training.fp8_weight_bytes) - copy  # FP8 copies: never sharded
    rest = stage.parameter_bytes - copy - master
    if master < 0 or rest < 0:
        raise ValueError(f"{stage.parameter_bytes} parameter bytes cannot hold {parameters} parameters of "
                         f"{training.weight_bytes} bytes ({training.name})")
    return ModelState(parameters=(_shard(copy, replicas) if zero >= 3 else copy)
                      + (_shard(master, replicas) if zero >= 1 else master) + rest,
                      gradients=_shard(stage.gradient_bytes, replicas) if zero >= 2 else stage.gradient_bytes,
                      optimizer=_shard(stage.optimizer_bytes, replicas) if zero >= 1 else stage.optimizer_bytes)


@dataclass(frozen=True)
class Transient:
    """Bytes a stage's tasks hold beyond its model state and the working set of the layer they compute.

    Attributes:
        forward: during each ``F`` and ``R``.
        backward: during each ``B`` (and ``W``).
    """

    forward: int = 0
    backward: int = 0


# Note [buckets]: a ZeRO-2 or ZeRO-3 backward copies each gradient into a bucket and reduce-scatters the bucket when
# it fills, so the unsharded gradients never exist together: one bucket of DeepSpeed's default size, in the gradient
# dtype, lives during every backward (never larger than the stage's gradients). ZeRO-3 also holds the gathered
# 16-bit parameters of the layer it computes and of the next one, prefetched: FSDP's ``limit_all_gathers`` (on by
# default) allows two layers' all-gathers in flight. Stages 0 and 1 accumulate into the persistent gradients.
def transient_bytes(layer_parameters: Sequence[int], training: Training, zero: int, replicas: int,
                    bucket_elements: int = REDUCE_BUCKET_ELEMENTS, *, reshard_after_forward: bool = True) -> Transient:
    """What ZeRO adds to a stage's working set (Note [buckets]); the caller adds it to each task's working bytes.

    Args:
        layer_parameters: parameters of each of the stage's layers, in order (a layer is the unit gathered).
        training: the policy (bytes of the compute copy and of a gradient).
        zero: a stage of :data:`ZERO_STAGES`.
        replicas: ``d``; with 1 nothing is sharded, so nothing is gathered or bucketed.
        bucket_elements: gradient elements a bucket holds.
        reshard_after_forward: ZeRO-3 only; ``False`` keeps the stage's whole compute copy gathered through the
            step (Note [zero traffic]).

    Raises:
        ValueError: an unknown stage or ``replicas < 1``.
    """
    check_zero(zero, replicas)
    if zero < 2 or replicas == 1:
        return Transient()
    bucket = min(bucket_elements, sum(layer_parameters)) * training.gradient_bytes
    if zero == 2:
        return Transient(backward=bucket)
    pairs = [a + b for a, b in itertools.pairwise(layer_parameters)]
    held = max(pairs or layer_parameters or [0]) if reshard_after_forward else sum(layer_parameters)
    gathered = compute_copy_bytes(held, training)
    return Transient(forward=gathered, backward=gathered + bucket)


class Kind(str, enum.Enum):
    """A collective of the data-parallel group."""

    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"

    def __str__(self) -> str:
        return self.value


#: A unit is closed once it holds this fraction of the stage's largest layer's parameters (Note [units]).
UNIT_FRACTION = 0.5


# Note [units]: FSDP wraps each transformer block as a unit and leaves the small layers (embedding dropout, final
# norm) to the root unit; DDP and Megatron's distributed optimizer fill gradient buckets in the backward's order.
# Here consecutive layers join one unit until it holds half the stage's largest layer: blocks are a unit each, and
# a norm does not pay a collective's latency alone (which over 64 replicas is 63 link latencies, more than its
# bytes take). A unit computes its layers' share of every task's seconds.
def units(layer_parameters: Sequence[int], layer_shares: Sequence[float]) -> list[tuple[int, float]]:
    """The stage's units as ``(parameters, share of compute)``, in forward order (Note [units]).

    ``layer_shares``: each layer's share of the stage's compute (forward seconds), summing to 1, or all 0 (the
    parameters' shares are used then)."""
    if len(layer_parameters) != len(layer_shares):
        raise ValueError(f"{len(layer_parameters)} layers' parameters but {len(layer_shares)} shares")
    total = sum(layer_shares)
    shares = [x / total for x in layer_shares] if total > 0 else \
        [n / sum(layer_parameters) if sum(layer_parameters) else 1 / len(layer_parameters) for n in layer_parameters]
    least = UNIT_FRACTION * max(layer_parameters, default=0)
    out: list[tuple[int, float]] = []
    held, share = 0, 0.0
    for n, x in zip(layer_parameters, shares, strict=True):
        held, share = held + n, share + x
        if held >= least and held:
            out.append((held, share))
            held, share = 0, 0.0
    if out and (held or share):
        last = out.pop()
        out.append((last[0] + held, last[1] + share))
    elif not out:
        out.append((held, share or 1.0))
    return out


# Note [zero traffic]: the choices where implementations differ. Each is a collective task on the device's
# communication stream (sim.core.collectives), unit by unit.
# - Gradients: stage 0 all-reduces and stage 1 reduce-scatters each unit's gradients as the stage's last gradient
#   task computes that unit (DDP under no_sync, overlapping the last backward bucket by bucket; Megatron's
#   distributed optimizer). Stages 2 and 3 reduce-scatter every micro-batch and accumulate only their shard:
#   DeepSpeed reduces at every micro-step for stages >= 2 (its engine's allreduce_gradients), FSDP unless under
#   no_sync, which would accumulate unsharded gradients and lose the saving; its memory holds the shard plus a
#   bucket (Note [buckets]).
# - The updated 16-bit parameters of stages 1 and 2 are all-gathered after the optimizer step and counted exposed,
#   as DeepSpeed's step does and Megatron does without --overlap-param-gather (which hides it behind the next
#   forward): the default of both (:func:`after_step_bytes`).
# - Stage 3 gathers each unit before every F, R and, resharded after the forward (FSDP's default), B, one unit
#   prefetched; W reads no weights. Without resharding after the forward a pipeline would keep the gathered units
#   from one micro-batch's F to its B while the next ones run, so it gathers each unit once a step, before the
#   stage's first F, and keeps the stage's compute copy whole until the step ends (Transient).
# - Hybrid sharding (HSDP): the shards and the collectives above run in groups of ``shard`` replicas; after the
#   stage's last gradient task each unit's reduced shard is all-reduced across the ``replicas / shard`` groups.
def stage_collectives(layer_parameters: Sequence[int], layer_shares: Sequence[float], training: Training,
                      zero: int, replicas: int, price: Callable[[Kind, float], float], *,
                      reshard_after_forward: bool = True, shard: int | None = None,
                      replicate: Callable[[float], float] | None = None) -> StageCollectives | None:
    """A stage's data-parallel collectives as tasks (Note [zero traffic]); ``None`` with one replica.

    Args:
        layer_parameters: parameters of each of the stage's layers, in order.
        layer_shares: each layer's share of the stage's compute (Note [units]).
        training: the policy (bytes of a gradient and of the compute copy).
        zero: a stage of :data:`ZERO_STAGES`.
        replicas: ``d``, the data-parallel group.
        price: ``(kind, bytes) -> seconds`` of one collective in the stage's sharding group (of ``shard`` replicas).
        reshard_after_forward: ZeRO-3 only: gather again before each ``B`` (FSDP's default), or once a step.
        shard: the sharding group's size, a divisor of ``replicas``; ``None``: all of them.
        replicate: ``bytes -> seconds`` of the all-reduce across the ``replicas / shard`` groups; needed when
            ``shard < replicas``.

    Raises:
        ValueError: an unknown stage, ``replicas < 1``, or a ``shard`` that does not divide ``replicas``.
    """
    check_zero(zero, replicas)
    group = check_shard(shard, replicas)
    if replicas == 1:
        return None
    if group < replicas and replicate is None:
        raise ValueError("hybrid sharding needs the price of the all-reduce across the groups (replicate)")
    reduce_kind = Kind.ALL_REDUCE if zero == 0 else Kind.REDUCE_SCATTER
    out = []
    for n, share in units(layer_parameters, layer_shares):
        grads, copy = n * training.gradient_bytes, compute_copy_bytes(n, training)
        gather = price(Kind.ALL_GATHER, copy) if zero == 3 and group > 1 else 0.0
        across = replicate(grads / group) if group < replicas and replicate is not None else 0.0
        out.append(Unit(share, gather=gather, reduce=price(reduce_kind, grads) if group > 1 else 0.0,
                        replicate=across, gather_bytes=copy if gather else 0.0, reduce_bytes=grads))
    mode = Gather.NEVER if zero < 3 else Gather.EACH_TASK if reshard_after_forward else Gather.ONCE
    return StageCollectives(tuple(out), mode, gather_backward=zero == 3 and reshard_after_forward,
                            reduce_each=zero >= 2, reduce_kind=str(reduce_kind))


def check_shard(shard: int | None, replicas: int) -> int:
    """The sharding group's size: ``shard``, or ``replicas`` for ``None``; ``ValueError`` unless it divides them."""
    if shard is None:
        return replicas
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 1 or replicas % shard:
        raise ValueError(f"a sharding group of {shard!r} replicas does not divide the {replicas} replicas")
    return shard


def after_step_bytes(copy_bytes: float, zero: int, replicas: int) -> float:
    """Bytes of the stage's compute copy all-gathered after the optimizer step: stages 1 and 2 (Note [zero
    traffic]); 0 otherwise and with one replica."""
    check_zero(zero, replicas)
    return copy_bytes if zero in (1, 2) and replicas > 1 else 0.0


def sent_per_step(gradient_bytes: float, copy_bytes: float, zero: int, replicas: int, micro_batches: int,
                  recomputes: int = 0, *, reshard_after_forward: bool = True) -> float:
    """Bytes each device of a stage's data-parallel group sends in a step (Note [zero traffic]), as a ring sends
    them: ``(d - 1) / d`` of a reduce-scatter's or an all-gather's bytes, twice that for an all-reduce::

        ZeRO 0   2 G                 ZeRO 2   m G + P
        ZeRO 1   G + P               ZeRO 3   m G + (2m + r) P   (m G + P without resharding after the forward)

    times ``(d - 1) / d``; ``G`` the stage's gradient bytes, ``P`` its compute copy's, ``m`` micro-batches, ``r``
    recompute tasks. Stages 1 and 2 send what the all-reduce sends for one micro-batch (the paper's section 7.2.1),
    stage 3 1.5 times (7.2.2)."""
    check_zero(zero, replicas)
    gathers = {0: 0, 1: 1, 2: 1, 3: 2 * micro_batches + recomputes if reshard_after_forward else 1}[zero]
    reductions = {0: 2, 1: 1, 2: micro_batches, 3: micro_batches}[zero]
    return (replicas - 1) / replicas * (reductions * gradient_bytes + gathers * copy_bytes)
