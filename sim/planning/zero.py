"""Sharded data parallelism, ZeRO stages 0-3: what each device of a stage's data-parallel group holds and sends.

Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (Figure 1), as
DeepSpeed, Megatron-LM's distributed optimizer (stage 1) and PyTorch FSDP (stages 2 and 3) implement it. With
``Psi`` parameters, ``d`` replicas and ``K`` bytes of optimizer state per parameter (the 32-bit master included)::

    ZeRO   shards                          model state per device (mixed precision, 16-bit gradients)
    0      nothing                         (2 + 2 + K) Psi
    1      optimizer state and master      2 Psi + 2 Psi + K Psi / d
    2      ... and gradients               2 Psi + (2 + K) Psi / d
    3      ... and the 16-bit parameters   (2 + 2 + K) Psi / d

Traffic, per pipeline stage and step (Note [zero traffic]); ``d = 1`` shards nothing and sends nothing::

    ZeRO   gradients                                parameters (the 16-bit copy)
    0      all-reduce after the last backward       -
    1      reduce-scatter after the last backward   all-gather after the optimizer step (exposed)
    2      reduce-scatter after every backward      all-gather after the optimizer step (exposed)
    3      reduce-scatter inside every backward     all-gather inside every forward and every backward

A sweep takes each pipeline stage's :func:`sharded_state` as its model state (``MemoryParts``' parameters,
gradients, optimizer), adds :func:`transient_bytes` to its forward and backward working sets, stretches its tasks
by the collectives inside them (:func:`stretched`, only ZeRO-3 has any) before simulating, and gives ``zero`` and
each stage's :func:`compute_copy_bytes` to :func:`sim.planning.replicas.step_seconds`, which schedules the
collectives between tasks (:attr:`When.in_task` false) on each device's link.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from gpipe.schedule import Op
from sim.core.cost import StageCost

if TYPE_CHECKING:
    from sim.planning.training import Training

__all__ = ["REDUCE_BUCKET_ELEMENTS", "ZERO_STAGES", "Collective", "Kind", "ModelState", "StageBytes", "Transient",
           "When", "check_zero", "compute_copy_bytes", "sharded_state", "stage_traffic", "stretched", "task_seconds",
           "transient_bytes"]

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
                    bucket_elements: int = REDUCE_BUCKET_ELEMENTS) -> Transient:
    """What ZeRO adds to a stage's working set (Note [buckets]); the caller adds it to each task's working bytes.

    Args:
        layer_parameters: parameters of each of the stage's layers, in order (a layer is the unit gathered).
        training: the policy (bytes of the compute copy and of a gradient).
        zero: a stage of :data:`ZERO_STAGES`.
        replicas: ``d``; with 1 nothing is sharded, so nothing is gathered or bucketed.
        bucket_elements: gradient elements a bucket holds.

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
    gathered = compute_copy_bytes(max(pairs or layer_parameters or [0]), training)
    return Transient(forward=gathered, backward=gathered + bucket)


class Kind(str, enum.Enum):
    """A collective of the data-parallel group."""

    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"

    def __str__(self) -> str:
        return self.value


class When(str, enum.Enum):
    """When a collective runs in a step. A *gradient task* is ``B``, or ``W`` where the schedule splits it off."""

    LAST_GRADIENT = "after the stage's last gradient task"
    EACH_GRADIENT = "after each gradient task"
    AFTER_STEP = "after the optimizer step"
    FORWARD = "inside each F and R"
    BACKWARD = "inside each B"
    GRADIENT = "inside each gradient task"

    @property
    def in_task(self) -> bool:
        """Inside a task (it stretches the task, :func:`stretched`) rather than queued on the link after one."""
        return self in (When.FORWARD, When.BACKWARD, When.GRADIENT)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Collective:
    """One collective of a stage's data-parallel group.

    Attributes:
        kind: all-reduce, reduce-scatter or all-gather.
        nbytes: the unsharded tensor's bytes (a reduce-scatter's input, an all-gather's output).
        when: where in the step it runs, once per step or once per task.
    """

    kind: Kind
    nbytes: float
    when: When

    def per_step(self, micro_batches: int, recomputes: int = 0) -> int:
        """How many times it runs in a step of ``micro_batches`` with ``recomputes`` ``R`` tasks of the stage."""
        if self.when in (When.LAST_GRADIENT, When.AFTER_STEP):
            return 1
        return micro_batches + (recomputes if self.when is When.FORWARD else 0)

    def sent_bytes(self, replicas: int) -> float:
        """Bytes each device sends once: ``(d - 1) / d`` of ``nbytes`` (twice for an all-reduce), as a ring does."""
        share = (replicas - 1) / replicas * self.nbytes
        return 2 * share if self.kind is Kind.ALL_REDUCE else share

    def __str__(self) -> str:
        return f"{self.kind} of {self.nbytes} B {self.when}"


# Note [zero traffic]: the choices where implementations differ.
# - Gradients: stage 0 all-reduces and stage 1 reduce-scatters once, when the last micro-batch's gradients are
#   accumulated (DDP under no_sync, Megatron's distributed optimizer). Stage 2 reduce-scatters every micro-batch
#   and accumulates only its shard: DeepSpeed reduces at every micro-step for stages >= 2 (its engine's
#   allreduce_gradients), FSDP unless under no_sync, which would accumulate unsharded gradients and lose stage 2's
#   saving. So with m micro-batches stage 2 sends m reduce-scatters a step (this is why DeepSpeed's pipeline engine
#   refuses stages 2 and 3), and its memory holds the shard plus a bucket (Note [buckets]).
# - The updated 16-bit parameters of stages 1 and 2 are all-gathered after the optimizer step and counted exposed,
#   as DeepSpeed's step does and Megatron does without --overlap-param-gather (which hides it behind the next
#   forward): the default of both.
# - Stage 3 gathers the stage's parameters before every F, R and B of every micro-batch (they are released after
#   use, Note [buckets]) and reduce-scatters the gradients inside every gradient task; prefetching overlaps the
#   gathers with compute, so a task lasts max(compute, its collectives). Its volume for one micro-batch is 1.5
#   times the all-reduce's (section 7.2.2): two all-gathers and a reduce-scatter, each half an all-reduce.
def stage_traffic(gradient_bytes: float, gathered_bytes: float, zero: int, replicas: int) -> tuple[Collective, ...]:
    """One stage's data-parallel collectives in a step (Note [zero traffic]); none with one replica.

    Args:
        gradient_bytes: the stage's unsharded gradient bytes (``StageCost.gradient_bytes``).
        gathered_bytes: the stage's unsharded compute copy (:func:`compute_copy_bytes`).
        zero: a stage of :data:`ZERO_STAGES`.
        replicas: ``d``.

    Raises:
        ValueError: an unknown stage or ``replicas < 1``.
    """
    check_zero(zero, replicas)
    if replicas == 1:
        return ()
    rs, ag = Kind.REDUCE_SCATTER, Kind.ALL_GATHER
    if zero == 0:
        return (Collective(Kind.ALL_REDUCE, gradient_bytes, When.LAST_GRADIENT),)
    if zero == 1:
        return Collective(rs, gradient_bytes, When.LAST_GRADIENT), Collective(ag, gathered_bytes, When.AFTER_STEP)
    if zero == 2:
        return Collective(rs, gradient_bytes, When.EACH_GRADIENT), Collective(ag, gathered_bytes, When.AFTER_STEP)
    return (Collective(ag, gathered_bytes, When.FORWARD), Collective(ag, gathered_bytes, When.BACKWARD),
            Collective(rs, gradient_bytes, When.GRADIENT))


def task_seconds(traffic: Sequence[Collective], op: Op, split: bool,
                 seconds: Callable[[Collective], float]) -> float:
    """Seconds of the collectives inside one ``op`` task of the stage, run one after another on its link.

    ``split``: the schedule has ``W`` tasks (then ``B`` gathers and ``W`` reduces); ``seconds``: one collective's.
    """
    when = {Op.F: (When.FORWARD,), Op.R: (When.FORWARD,), Op.W: (When.GRADIENT,) if split else (),
            Op.B: (When.BACKWARD,) if split else (When.BACKWARD, When.GRADIENT)}[op]
    return sum((seconds(c) for c in traffic if c.when in when), 0.0)


def stretched(stage: StageCost, traffic: Sequence[Collective], split: bool,
              seconds: Callable[[Collective], float]) -> StageCost:
    """``stage`` with each task lasting ``max(its compute, its collectives)`` (:func:`task_seconds`).

    Only stage 3 has collectives inside tasks; for the others ``stage`` comes back unchanged.
    """
    if not any(c.when.in_task for c in traffic):
        return stage
    f, b, w = (task_seconds(traffic, op, split, seconds) for op in (Op.F, Op.B, Op.W))
    return replace(stage, forward=max(stage.forward, f), backward=max(stage.backward, b),
                   weight=max(stage.weight, w) if split else stage.weight,
                   recompute=None if stage.recompute is None else max(stage.recompute, f),
                   forward_checkpointed=None if stage.forward_checkpointed is None
                   else max(stage.forward_checkpointed, f))
