"""Predicted against measured on several processes: ``gpipe-sim demo --processes N`` and ``compare --processes N``.

:func:`run_processes` balances the model and sizes its stages in this process (:func:`stage_costs`: bytes, and
seconds the ranks then replace), then spawns ``N`` ranks on this machine (gloo on loopback and listening nowhere
else, Note [loopback only] in :mod:`gpipe.distributed.loopback`; no torchrun). The ranks time the link between
them by a short ping-pong (:func:`measure_link`) and train with :class:`gpipe.distributed.DistributedGPipe`, each
recorded step gathered to rank 0 on one clock (Note [one time base] in :mod:`gpipe.distributed.clock`); after
every step each rank profiles its own stages (Note [calibrated in the ranks]). The simulator predicts the same
schedule from those seconds and the link; the step of median makespan is compared with it. With ``replicas=R``
the world is ``N * R`` ranks, ``R`` pipelines of ``N`` whose stages' gradients are all-reduced, and the prediction
holds those all-reduces (:mod:`sim.calibration.replicas`).

Note [what the prediction models]: each task's seconds as the ranks run them (their processes computing at once,
the recorder's hooks), and every copy as a ping-pong timed while the ranks compute prices it (Note [a busy
link]), the CPU a message takes from the ranks at both ends (Note [a message's CPU] in
:mod:`sim.calibration.wire_cost`), and the host seconds between two tasks, from a probe pipeline (Note [gap
between tasks] in :mod:`sim.calibration.rank_passes`). Not modelled: the interpreter's host seconds around a task
(Note [no host seconds per task]), nor whatever makes the prediction of the steps that send the most messages
(two stages per rank, many micro-batches) come out short; benchmarks/fidelity_processes.py reports each schedule's
error (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import queue
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpipe import microbatch
from gpipe.distributed.loopback import free_port, init_loopback_group
from gpipe.distributed.reduction import DDP_BUCKET_BYTES
from gpipe.frontend import Arguments, rank_counts
from gpipe.profiling.profile import RecordedSeconds
from gpipe.schedule import Schedule, schedule_kind
from gpipe.schedule.timeline import Timeline
from sim.calibration import replicas as data_parallel
from sim.calibration.calibrate import partitions_of
from sim.calibration.compare import Comparison, compare
from sim.calibration.executor_costs import Batch, stage_costs
from sim.calibration.experiment import loss_of
from sim.calibration.experiment_setup import Setup
from sim.calibration.host import Overheads, with_overheads
from sim.calibration.machine import intra_op_threads, keep_freed_memory
from sim.calibration.outcome import drift_of, interleaved_cost, median_paired_error, median_step, pass_predictions
from sim.calibration.rank_passes import RankPass, gathered_passes, local_gaps, rank_pass, stage_inputs
from sim.calibration.wire_cost import MessageCpu, measure_message_cpu, message_sizes, with_wire
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.workers import exit_with_parent

__all__ = ["ProcessOutcome", "measure_link", "process_config", "run_processes"]

Build = Callable[[], tuple[nn.Sequential, Batch]]
"""Builds the model and one mini-batch alike in every process (a module-level function, or a partial of one)."""


@dataclass(frozen=True)
class ProcessOutcome:
    """What :func:`run_processes` found: the schedule, the link, both timelines and their comparison; with
    replicas, the dp group's all-reduce and its collectives compared (``processes``: the ranks of one pipeline)."""

    processes: int
    schedule: Schedule
    balance: tuple[int, ...]
    link: LinkSpec
    cost: CostModel
    predicted: Timeline
    measured: Timeline
    step_makespans: tuple[float, ...]
    chosen_step: int
    comparison: Comparison
    description: str = ""
    passes: tuple[tuple[RecordedSeconds, ...], ...] = field(default=(), repr=False, compare=False)
    replication: data_parallel.Replication = data_parallel.ONE_PIPELINE
    allreduce: LinkSpec | None = None  # one step of the dp group's ring all-reduce (Note [an all-reduce's price])
    collectives: tuple[data_parallel.CollectiveComparison, ...] = ()

    @functools.cached_property
    def step_predictions(self) -> tuple[float, ...]:
        """Per recorded step, the makespan predicted from the ranks' passes right after it alone (Note [paired
        error] in :mod:`sim.calibration.outcome`)."""
        return pass_predictions(self.schedule, self.cost, process_config(self.link), self.passes)

    @property
    def paired_error(self) -> float | None:
        """The median over steps of each step's error against its own passes' prediction (Note [paired error])."""
        return median_paired_error(self.step_predictions, self.step_makespans)

    @property
    def drift(self) -> float | None:
        """How far the machine moved while the steps ran (Note [drift] in :mod:`sim.calibration.outcome`)."""
        return drift_of(self.step_makespans, self.step_predictions)

    def report(self) -> dict[str, Any]:
        c = self.comparison
        return {"description": self.description, "processes": self.processes, "schedule": self.schedule.name,
                "m": self.schedule.m, "n": self.schedule.n, "checkpoint": self.schedule.checkpoint,
                "balance": list(self.balance), "placement": list(self.schedule.placement),
                "link": {"name": self.link.name, "latency": self.link.latency, "bandwidth": self.link.bandwidth},
                "clock_residual": self.measured.meta["clock"]["residual"],
                "predicted_makespan": c.predicted_makespan, "measured_makespan": c.measured_makespan,
                "makespan_error": c.makespan_error, "order_agreement": c.order_agreement,
                "step_makespans": list(self.step_makespans), "step_predictions": list(self.step_predictions),
                "paired_error": self.paired_error, "drift": self.drift, "chosen_step": self.chosen_step,
                "comparison": c.to_dict(), "replicas": self.replication.replicas,
                "bucket_bytes": self.replication.bucket_bytes,
                "allreduce": None if self.allreduce is None else self.allreduce.to_dict(),
                "collectives": [row.to_dict() for row in self.collectives]}


# Note [a busy link]: during a step every rank computes while its messages move, and on a CPU gloo's threads then
# wait for a core, so a copy in a step takes several times what an idle ping-pong's fastest round gives it. So the
# ranks time the ping-pong with a thread of each computing beside it (``busy``), and a size's one-way seconds are
# the mean over its rounds, the scheduler's delays included (a step's copies pay them too, one after another).
# Idle: the shortest round, the wire's own speed.
def measure_link(group: Any, rank: int, payload: int = 1 << 20, rounds: int = 10, *,
                 busy: bool = False) -> LinkSpec | None:
    """Time the link between ranks 0 and 1 of ``group`` by ping-pong (each size's shortest of ``rounds`` round
    trips, after one untimed; with ``busy``, the mean, each rank computing beside it: Note [a busy link]): the
    latency is half an 8-byte round trip, the bandwidth the slope between ``payload`` and ``8 * payload`` bytes (a
    constant cost of each message cancels). Ranks 0 and 1 take part (every rank may call it); rank 0 returns the
    :class:`LinkSpec`, the others ``None``."""
    trips = {}
    with _computing() if busy else contextlib.nullcontext():
        for size in (8, payload, 8 * payload):
            buffer = torch.zeros(size // 8, dtype=torch.float64)
            times = []
            for k in range(rounds + 1):
                if rank == 0:
                    start = time.perf_counter()
                    dist.send(buffer, group=group, group_dst=1)
                    dist.recv(buffer, group=group, group_src=1)
                    times += [time.perf_counter() - start] if k else []
                elif rank == 1:
                    dist.recv(buffer, group=group, group_src=0)
                    dist.send(buffer, group=group, group_dst=0)
            trips[size] = (statistics.fmean(times) if busy else min(times)) / 2 if times else 0.0
    if rank != 0:
        return None
    slope = trips[8 * payload] - trips[payload]
    bandwidth = 7 * payload / slope if slope > 0 else 8 * payload / trips[8 * payload]
    backend = dist.get_backend(group)
    return LinkSpec(f"{backend}-loopback", trips[8], bandwidth,
                    f"{backend} between two processes on this machine, timed by ping-pong"
                    + (" while each computes" if busy else ""))


@contextlib.contextmanager
def _computing() -> Iterator[None]:
    """A thread that computes (small matrix products, which release Python's lock) until the block ends."""
    stop = threading.Event()

    def work() -> None:
        a = torch.randn(128, 128)
        while not stop.is_set():
            a = torch.tanh(a @ a * 1e-2)

    thread = threading.Thread(target=work, name="busy-link", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# Note [no host seconds per task]: a rank runs its tasks with the threaded executor's interpreter
# (gpipe.interpreter.worker.Worker), but on its main thread, never started fresh nor woken by a queue, and its hand-offs
# are the wire's (priced by the link). So the threaded experiment's host seconds around a task
# (sim.calibration.executor_costs.with_executor_costs: a worker thread's start, its wake-up, its queue) do not arise,
# and a rank's task spans match its profiling passes: those host seconds are left out. What the spans leave out, the
# host seconds between two tasks (the wire's sends, the next task's inputs), is measured in the ranks (Note [gap
# between tasks] in sim.calibration.rank_passes).


def process_config(link: LinkSpec) -> SimConfig:
    """The simulator's switches for :class:`gpipe.distributed.DistributedGPipe` on CPU ranks: copies on their own
    streams priced by ``link``; one phase (``step``); an overlapped pair's tasks in turn, as the interpreter runs
    them (Note [a pair in turn] in :mod:`gpipe.interpreter.worker`)."""
    return SimConfig(link=link, copy_streams=True, overlap_pairs=False)


def _probe_gap(setup: Setup, n: int, rows: int, replicas: int, steps: int = 6) -> float:
    """Note [gap between tasks]: a probe pipeline of ``n`` one-Linear stages with ``setup``'s schedule, chunks and
    checkpoint, in ``replicas`` replicas, ``steps`` recorded steps after two others; every rank calls it, rank 0
    returns the median gap (the others 0)."""
    from gpipe.distributed import DistributedGPipe

    probe = DistributedGPipe(nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)]), [1] * n, chunks=setup.chunks,
                             checkpoint=setup.checkpoint, schedule=setup.schedule, timeout=120,
                             data_parallel=replicas)
    rank = probe.rank  # this replica's schedule device
    x, target = torch.randn(rows, 4), torch.zeros(rows)
    gaps: list[float] = []
    for k in range(2 + steps):
        probe.record = k >= 2
        probe.step(x if rank == probe.placement[0] else None, target if rank == probe.placement[-1] else None, _loss)
        timeline = probe.gather_timeline() if probe.record else None
        gaps += local_gaps(timeline) if timeline is not None else []
    probe.close()
    return statistics.median(gaps) if gaps else 0.0


def _loss(output: Batch, _target: Tensor) -> Tensor:
    return loss_of(output)


@dataclass(frozen=True)
class _Found:
    """What rank 0 sends the launcher: the link, the steps, every rank's passes, the gap, a message's price, the dp
    group's all-reduce (with replicas) and each replica's world ranks by schedule device."""

    link: LinkSpec
    steps: list[dict[str, Any]]
    gathered: list[list[RankPass]]
    gap: float
    price: MessageCpu
    allreduce: LinkSpec | None
    pipelines: list[list[int]]


# Note [calibrated in the ranks]: a task's seconds depend on where it runs: in a rank, beside the other ranks
# computing on the same cores and gloo's threads, a task takes longer than its stage profiled in the launcher
# alone. So, as the single-process experiment interleaves its passes (Note [interleaved calibration] in
# sim.calibration.experiment), every rank profiles its own stages after every step, warm-ups included, all ranks
# at once (a barrier first), as their stages run at once in a step; rank 0 gathers the passes and the stage
# seconds are their medians (Note [median pass] in sim.calibration.outcome), replica 0's where there are several.
# The prediction uses nothing the steps measured. On loopback every pair of ranks shares one link, so world ranks 0
# and 1 time it (and a message's CPU), whichever mesh coordinates they hold.
def _rank(rank: int, world: int, port: int, build: Build, setup: Setup, balance: tuple[int, ...],
          sizes: tuple[int, ...], replication: data_parallel.Replication, results: Any) -> None:
    """One spawned rank: time the link (rank 0 and 1), train, and after each step profile its own stages (Note
    [calibrated in the ranks]); rank 0 gets every recorded step and every rank's passes."""
    from gpipe.distributed import DistributedGPipe

    exit_with_parent()  # Note [orphaned children] in sim.workers
    try:
        torch.set_num_threads(setup.threads or 1)
        keep_freed_memory()  # as the launcher's own process keeps it (Note [allocator] in sim.calibration.machine)
        init_loopback_group(rank, world, port, datetime.timedelta(seconds=120))  # gpipe.distributed.loopback
        torch.manual_seed(setup.seed)
        model, batch = build()
        tensors = (batch,) if isinstance(batch, Tensor) else tuple(batch)
        target = torch.zeros(tensors[0].shape[0])
        link = measure_link(dist.group.WORLD, rank, rounds=20, busy=True)  # Note [a busy link]
        price = measure_message_cpu(dist.group.WORLD, rank, sizes)  # Note [a message's CPU]
        gap = _probe_gap(setup, len(balance), tensors[0].shape[0], replication.replicas)  # Note [gap between tasks]
        pipe = DistributedGPipe(model, list(balance), chunks=setup.chunks, checkpoint=setup.checkpoint,
                                schedule=setup.schedule, timeout=120, data_parallel=replication.replicas,
                                bucket_bytes=replication.bucket_bytes)
        mesh = pipe.replicas
        # Note [an all-reduce's price] in sim.calibration.replicas
        allreduce = None if mesh is None else data_parallel.measure_allreduce(mesh.group, mesh.dp)
        first, last = pipe.placement[0], pipe.placement[-1]
        parts = partitions_of(model, balance)
        rows = microbatch.sizes(tensors[0].shape[0], setup.chunks)[0]
        sample = tensors[0][:rows] if isinstance(batch, Tensor) else tuple(t[:rows] for t in tensors)
        inputs = stage_inputs(parts, sample, pipe.stages)
        split = pipe.schedule_for(len(microbatch.sizes(tensors[0].shape[0], setup.chunks))).splits_weight_gradient
        steps, passes = [], []
        for k in range(setup.warmup_steps + setup.steps):
            pipe.record = k >= setup.warmup_steps
            pipe.step(batch if pipe.rank == first else None, target if pipe.rank == last else None, _loss)
            for p in pipe.parameters():
                p.grad = None
            if pipe.record:
                timeline = pipe.gather_timeline()
                if timeline is not None:
                    steps.append(timeline.to_dict())
            dist.barrier()  # Note [calibrated in the ranks]: every rank profiles at once
            passes.append(rank_pass(parts, inputs, streak=setup.repeats_per_pass, split=split))
        pipe.close()
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(passes, gathered, dst=0)
        if rank == 0:
            assert link is not None and price is not None
            results.put(("ok", _Found(link, steps, gathered or [], gap, price, allreduce,
                                      [list(range(world))] if mesh is None else mesh.pipelines)))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the launcher reports it
        results.put(("error", rank, traceback.format_exc()))


def run_processes(build: Build, setup: Setup, processes: int, *, timeout: float = 600.0,
                  description: str = "", on_spawn: Callable[[], None] | None = None,
                  replicas: int = 1, bucket_bytes: int = DDP_BUCKET_BYTES) -> ProcessOutcome:
    """Balance and calibrate here, measure on ``processes`` spawned ranks per pipeline, ``replicas`` pipelines (each
    stage's gradients all-reduced in buckets of at most ``bucket_bytes``), simulate, compare (module docstring).

    ``on_spawn`` is called once the setup is checked and balanced, right before the ranks start (a command's
    "spawning" line: not printed for a setup refused here).

    Raises:
        ValueError: fewer than two ranks in all, replicas or bucket bytes below 1, or stages the schedule cannot
            place on ``processes`` (refused as :class:`gpipe.distributed.DistributedGPipe` refuses them).
        RuntimeError: a rank failed (its traceback in the message) or none answered within ``timeout``.
    """
    from gpipe.balance import balance_by_time

    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"--processes must be an integer >= 1 (one rank per schedule device), got {processes!r}")
    replication = data_parallel.Replication(replicas, bucket_bytes)
    if processes * replicas < 2:
        raise ValueError("--processes 1 on one replica is a single rank: give --processes 2 or more, or --replicas "
                         "2 or more")
    given = setup.schedule if isinstance(setup.schedule, Schedule) else None
    if given is not None and given.num_devices != processes:  # before any work, in the command's words
        raise ValueError(f"schedule {given.name!r} runs on {given.num_devices} devices, a rank each: give "
                         f"--processes {given.num_devices}")
    n = _stage_count(setup, processes)
    torch.manual_seed(setup.seed)
    model, batch = build()
    tensors = (batch,) if isinstance(batch, Tensor) else tuple(batch)
    sizes = microbatch.sizes(tensors[0].shape[0], setup.chunks)
    first = tensors[0][:sizes[0]] if isinstance(batch, Tensor) else tuple(t[:sizes[0]] for t in tensors)
    with intra_op_threads(setup.threads):
        balance = setup.balance
        if balance is None:
            balance = tuple(balance_by_time(n, model, first, timeout=setup.balance_timeout, device="cpu"))
        schedule = _rank_schedule(model, balance, setup, processes, len(sizes))
        cost = stage_costs(model, batch, balance, setup.chunks, ["cpu"] * len(balance), warmup=setup.warmup,
                           repeats=setup.repeats, split=schedule.splits_weight_gradient)
    if on_spawn is not None:
        on_spawn()
    found = _spawn(build, replace(setup, balance=tuple(balance), stages=None), tuple(balance),
                   message_sizes(cost, schedule.placement), processes * replicas, timeout, replication)
    # Note [the loss is left out] in sim.calibration.replicas
    measured = [data_parallel.without_loss(Timeline.from_dict(d)) for d in found.steps]
    makespans = tuple(t.makespan for t in measured)
    chosen = median_step(makespans)
    # Note [calibrated in the ranks]: replica 0's ranks, by schedule device
    passes = gathered_passes([found.gathered[g] for g in found.pipelines[0]], schedule.placement)
    cost = replace(interleaved_cost(cost, passes, []), copy_seconds=None)  # copies priced by the measured link
    cost = with_overheads(cost, Overheads(gap=found.gap))  # Note [gap between tasks] in sim.calibration.rank_passes
    cost = with_wire(cost, schedule.placement, found.price)  # Note [a message's CPU] in sim.calibration.wire_cost
    if found.allreduce is not None:  # the gradients' all-reduces as tasks (sim.calibration.replicas)
        with intra_op_threads(setup.threads):
            cost = data_parallel.with_replicas(cost, partitions_of(model, balance), first, replication,
                                               found.allreduce, split=schedule.splits_weight_gradient)
    # Note [one prediction for every replica] in sim.calibration.replicas
    predicted = data_parallel.replicated(simulate(schedule, cost, process_config(found.link)), replicas)
    return ProcessOutcome(processes, schedule, tuple(balance), found.link, cost, predicted, measured[chosen],
                          makespans, chosen, compare(predicted, measured[chosen]), description,
                          tuple(tuple(p) for p in passes[setup.warmup_steps:]), replication, found.allreduce,
                          data_parallel.compare_collectives(predicted, measured[chosen], replicas)
                          if replicas > 1 else ())


def _stage_count(setup: Setup, processes: int) -> int:
    """The stages of a run on ``processes`` ranks: the setup's (its balance's, ``stages``, a given schedule's), else the
    fewest the schedule's layout places on them (one per rank, two for a V). Checked here, before any work, by the
    front-end's rule (:func:`gpipe.frontend.rank_counts`), and refused in the command's words.

    Raises:
        ValueError: the schedule cannot place the setup's stages on ``processes`` ranks.
    """
    if isinstance(setup.schedule, Schedule):
        return setup.schedule.n
    kind = schedule_kind(setup.schedule)
    if setup.balance is None and setup.stages is None:
        return next((n for n in range(processes, 4 * processes + 1) if processes in rank_counts(kind, n)), processes)
    n = setup.partitions
    try:
        kind.layout(n, processes)
    except ValueError as error:
        counts = [p for p in rank_counts(kind, n) if p > 1]
        fix = f" (a rank per device: --processes {' or '.join(map(str, counts))})" if counts else ""
        raise ValueError(f"{n} stages, which schedule {kind.name!r} cannot place on {processes} processes: "
                         f"{error}{fix}") from None
    return n


def _rank_schedule(model: nn.Sequential, balance: Sequence[int], setup: Setup, processes: int, m: int) -> Schedule:
    """The schedule of a step of ``m`` micro-batches when :class:`gpipe.distributed.DistributedGPipe` runs ``model``
    cut by ``balance`` on ``processes`` ranks as ``setup`` says: the front-end's decision, asked of it (Note [a device
    count] in :mod:`gpipe.frontend`: the schedule's layout places the stages on the ranks).

    Raises:
        ValueError: the arguments DistributedGPipe would refuse, with its message.
    """
    arguments = Arguments.check("DistributedGPipe", model, balance, chunks=setup.chunks, checkpoint=setup.checkpoint,
                                schedule=setup.schedule, deferred_batch_norm=False)
    return arguments.on_ranks(processes).schedule(m)


def _spawn(build: Build, setup: Setup, balance: tuple[int, ...], sizes: tuple[int, ...], world: int,
           timeout: float, replication: data_parallel.Replication = data_parallel.ONE_PIPELINE) -> _Found:
    """Run :func:`_rank` on ``world`` spawned processes; every one is stopped on the way out, Ctrl-C included."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [context.Process(target=_rank, args=(r, world, port, build, setup, balance, sizes, replication, results),
                             daemon=True) for r in range(world)]
    try:
        for p in procs:
            p.start()
        got = _answer(results, procs, timeout)
        if got[0] == "error":
            raise RuntimeError(f"rank {got[1]} failed:\n{got[2]}")
        for p in procs:
            p.join(timeout=30)
        return cast(_Found, got[1])
    finally:
        for p in procs:  # the launcher's exit, however it comes (Ctrl-C too), ends every rank
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _answer(results: Any, procs: Sequence[Any], timeout: float) -> tuple[Any, ...]:
    """The first answer on ``results``, waiting at most ``timeout`` seconds.

    A rank that dies before it can answer (its arguments failed to unpickle, it was killed) never writes to the
    queue, so the wait watches the ranks too: it ends as soon as one has exited with an error code, or all have
    exited, naming the rank and its exit code, instead of waiting out the whole timeout.

    Raises:
        RuntimeError: no answer within ``timeout``, or a rank ended without answering.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return tuple(results.get(timeout=min(0.5, max(deadline - time.monotonic(), 0.01))))
        except queue.Empty:
            pass
        failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed or all(p.exitcode is not None for p in procs):
            rank, code = failed[0] if failed else (0, 0)
            raise RuntimeError(f"rank {rank} exited with code {code} before any rank answered (its output above "
                               "says why)")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no rank answered within {timeout:g} s")
