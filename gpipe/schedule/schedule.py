"""The schedule: per-device ordered task lists, the shape they were generated for, and where each stage runs.

A :class:`Schedule` says *what* runs *where* and *in which order*; it never says *when*. The simulator
predicts when, the executor measures when, and both answer with a :class:`gpipe.schedule.timeline.Timeline`.

Note [overlapped pairs]: a schedule may say that two adjacent tasks of one device's list run together
(DualPipeV's forward of one micro-batch beside the backward of another) in :attr:`Schedule.pairs`, a field
beside the lists rather than a group inside them: every list stays a tuple of tasks in the order they
start, so a reader that ignores the pairs runs each pair's tasks one after the other, which is always a
valid run of the same order, and every existing schedule and consumer is unchanged. A pair starts once
both its tasks' dependencies are done (the validator's deadlock check and the grid follow that rule), so
neither may depend on the other; the simulator lets the two share the device (:mod:`sim.core.sharing`).

Note [stage slots]: DeepSeek-V3's two-direction DualPipe feeds half the micro-batches at the first device and
half at the last, through two copies of the model's stages. A schedule says so with :attr:`Schedule.copies`:
its ``n`` stages are ``copies`` copies of a model of ``S = n // copies`` stages, stage (slot) ``c*S + s`` being
stage ``s`` of copy ``c``, and a micro-batch travels only its own copy's slots (:meth:`Schedule.copy_of`:
consecutive blocks, the first ``m / copies`` micro-batches copy 0); the first slot of a copy has no upstream
and the last computes the loss. Slots rather than a new task field: a task stays ``(op, i, j)``, the text form,
the grid, the cost model and every consumer that indexes by stage keep their meaning (a slot has its own
costs, device and partition), and ``copies = 1`` is exactly the language as it was. What the copies share is
the model: the executor keeps one partition per slot and sums the copies' gradients, the simulator counts each
slot's parameters on its device (two copies, twice the parameters, as the DeepSeek-V3 report's Table 2 says).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from gpipe.schedule.grid import format_grid, pair_positions, run_unit_steps
from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed, dependencies
from gpipe.schedule.validator import check

__all__ = ["Schedule"]


@dataclass(frozen=True)
class Schedule:
    """Per-device ordered task lists, plus the shape they were generated for.

    Attributes:
        m: micro-batches.
        n: stages.
        checkpoint: the checkpoint policy; decides which micro-batches have an ``R`` task.
        placement: ``placement[j]`` is the device index of stage ``j`` (several stages may share one).
        tasks: ``tasks[d]`` is the ordered tuple of tasks device ``d`` runs.
        name: the generator's name, for display.
        pairs: overlapped pairs ``(first, second)``: ``second`` comes right after ``first`` in one device's
            list, and the two run together (Note [overlapped pairs]); empty for most schedules.
        copies: the copies of the model's stages the ``n`` stages hold (Note [stage slots]); 1 for most.
    """

    m: int
    n: int
    checkpoint: Checkpoint
    placement: tuple[int, ...]
    tasks: tuple[tuple[Task, ...], ...]
    name: str = "custom"
    pairs: tuple[tuple[Task, Task], ...] = ()
    copies: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", tuple(self.placement))
        object.__setattr__(self, "tasks", tuple(tuple(t) for t in self.tasks))
        object.__setattr__(self, "pairs", tuple((a, b) for a, b in self.pairs))

    # -- structure ---------------------------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        return len(self.tasks)

    def device_of(self, stage: int) -> int:
        """The device index that runs ``stage``."""
        return self.placement[stage]

    def stages_on(self, device: int) -> tuple[int, ...]:
        """The stages placed on ``device``, in stage order."""
        return self._stages_by_device.get(device, ())

    @cached_property
    def _stages_by_device(self) -> dict[int, tuple[int, ...]]:
        """Each device's stages, grouped once: asking every device by a scan of the placement is quadratic."""
        grouped: dict[int, list[int]] = {}
        for j, d in enumerate(self.placement):
            grouped.setdefault(d, []).append(j)
        return {d: tuple(stages) for d, stages in grouped.items()}

    def is_checkpointed(self, microbatch: int) -> bool:
        return checkpointed(self.checkpoint, microbatch, self.m)

    @property
    def stages(self) -> int:
        """The model's stages, ``n // copies``: the length of each micro-batch's route (Note [stage slots])."""
        return self.n // self.copies

    def copy_of(self, microbatch: int) -> int:
        """The copy of the stages ``microbatch`` travels (Note [stage slots]): the first ``m / copies`` copy 0."""
        return microbatch * self.copies // self.m

    def route(self, microbatch: int) -> range:
        """The stages ``microbatch`` runs, in order: its copy's slots (``range(n)`` for one copy)."""
        first = self.copy_of(microbatch) * self.stages
        return range(first, first + self.stages)

    def model_stage(self, stage: int) -> int:
        """Which of the model's stages slot ``stage`` is a copy of (Note [stage slots])."""
        return stage % self.stages

    def is_first(self, stage: int) -> bool:
        """Whether ``stage`` starts its copy's route: its forward takes the micro-batch itself."""
        return stage % self.stages == 0

    def is_last(self, stage: int) -> bool:
        """Whether ``stage`` ends its copy's route: its forward's output is the loss's input."""
        return (stage + 1) % self.stages == 0

    @cached_property
    def splits_weight_gradient(self) -> bool:
        """True when the schedule has ``W`` tasks (backward split into input and weight gradient)."""
        return any(t.op is Op.W for ts in self.tasks for t in ts)

    @cached_property
    def gradient_positions(self) -> tuple[tuple[int, ...], ...]:
        """For each device, the positions in its list of its gradient tasks (``W`` where the backward is split, else
        ``B``): where a stage's gradients are final for a micro-batch, and a data-parallel reduction may start."""
        op = Op.W if self.splits_weight_gradient else Op.B
        return tuple(tuple(k for k, t in enumerate(ts) if t.op is op) for ts in self.tasks)

    @property
    def forwards_first(self) -> bool:
        """True when every device runs all its forwards before any other task (GPipe's fill-drain; not
        1F1B): then the forward and the backward can run as two phases, ``forward()`` then ``backward()``."""
        for ts in self.tasks:
            k = next((x for x, t in enumerate(ts) if t.op is not Op.F), len(ts))  # the leading forwards
            if any(t.op is Op.F for t in ts[k:]):
                return False
        return True

    @cached_property
    def pair_starts(self) -> tuple[frozenset[int], ...]:
        """For each device, the positions ``k`` in its list where an overlapped pair starts (tasks ``k`` and
        ``k + 1`` run together; Note [overlapped pairs]); validates the schedule first."""
        self.validate()
        return tuple(map(frozenset, pair_positions(self)))

    def all_tasks(self) -> Iterator[Task]:
        for ts in self.tasks:
            yield from ts

    def dependencies(self, task: Task) -> tuple[Task, ...]:
        """The tasks whose results ``task`` needs (Note [dependencies] in :mod:`gpipe.schedule.task`)."""
        return dependencies(task, self.n, self.is_checkpointed(task.microbatch), self.copies)

    def overlaps(self) -> bool:
        """Whether two devices can ever run tasks at the same time.

        True when some two tasks on different devices are ordered neither by Note [dependencies] nor
        by their devices' lists. One micro-batch without checkpointing runs one task at a time; with
        checkpointing it does not: every ``R(0, j)`` may run as soon as its ``F(0, j)`` has, beside
        the forwards of later stages and the other recomputes (torchgpipe's early recompute). Each
        task's ancestors are one integer bitset, so this is quadratic in the tasks at worst.
        """
        self.validate()
        index = {t: k for k, t in enumerate(self.all_tasks())}
        device = [d for d, ts in enumerate(self.tasks) for _ in ts]
        below = [0] * len(index)  # below[k]: bit q set when task q must finish before task k starts
        done: set[int] = set()
        heads = [0] * self.num_devices
        while len(done) < len(index):  # the device lists in an order that respects every edge (valid: no deadlock)
            for d, ts in enumerate(self.tasks):
                while heads[d] < len(ts):
                    t = ts[heads[d]]
                    before = [index[u] for u in self.dependencies(t)]
                    if heads[d]:
                        before.append(index[ts[heads[d] - 1]])
                    if any(q not in done for q in before):
                        break
                    k = index[t]
                    for q in before:
                        below[k] |= below[q] | (1 << q)
                    done.add(k)
                    heads[d] += 1
        for k in range(len(index)):
            for q in range(k):
                if device[q] != device[k] and not (below[k] >> q) & 1 and not (below[q] >> k) & 1:
                    return True
        return False

    def expected_tasks(self) -> set[Task]:
        """The set of tasks a valid schedule of this shape runs, each exactly once."""
        ops = [Op.F, Op.B] + ([Op.W] if self.splits_weight_gradient else [])
        expected = {Task(op, i, j) for op in ops for i in range(self.m) for j in self.route(i)}
        expected |= {Task(Op.R, i, j) for i in range(self.m) if self.is_checkpointed(i) for j in self.route(i)}
        return expected

    # -- checking and printing ---------------------------------------------------------------------

    def validate(self) -> Schedule:
        """Check the schedule; return it unchanged, or raise :class:`~gpipe.schedule.ScheduleError`.

        Checks: positive shape, ``copies`` dividing ``n``; placement covers every stage with a real device; every
        task exactly once, on its stage's device and its micro-batch's route (Note [stage slots]); each overlapped
        pair adjacent on one device, neither task waiting for the other; no deadlock (every device can run its list
        in order, each task after its dependencies, a pair's two once both are ready). A deadlock's error shows the
        grid up to the stuck step and the cycle of waiting tasks (:mod:`gpipe.schedule.validator`).
        """
        if self.__dict__.get("_valid"):  # Note [linear validation]: immutable, so checked once
            return self
        check(self, standard_edges=type(self).dependencies is Schedule.dependencies)
        object.__setattr__(self, "_valid", True)
        return self

    def grid(self) -> str:
        """The step x device grid: each task takes one step, each device runs as soon as it can.

        Idle steps print as ``.``; the picture shows the bubble. A deadlocking schedule prints up to
        the step where it stops, with the stuck tasks marked ``>`` (:mod:`gpipe.schedule.grid`).
        """
        return format_grid(self, *run_unit_steps(self))

    def __str__(self) -> str:
        copies = f", copies={self.copies}" if self.copies > 1 else ""
        head = f"{self.name} schedule: m={self.m}, n={self.n}{copies}, checkpoint={self.checkpoint}"
        return head + "\n" + self.grid()
