"""How long a sweep will take, estimated before the model is counted, and the refusal of one past a minute.

A sweep's time is its configurations' (:func:`sim.planning.parallel.configurations.configurations`), each priced by its
schedule's size (Note [sweep seconds])::

    seconds = share * sum over configurations (SECONDS_PER_CONFIGURATION + SECONDS_PER_PAIR * m * v * p) / workers

``m`` micro-batches on ``v * p`` stages; ``share`` is what part of that work a sweep does: every configuration
evaluated and only those that fit simulated (:data:`FULL_SHARE`), or for a sweep that ranks only the fastest few,
the part a lower bound does not skip (:data:`BOUNDED_SHARE`; Note [bounded sweep] in
:mod:`sim.planning.sweep_workers`). :func:`check_sweep_size` refuses a sweep estimated past :data:`LIMIT_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.planning.parallel.configurations import Configuration, configurations

__all__ = ["BOUNDED_SHARE", "FULL_SHARE", "LIMIT_SECONDS", "SECONDS_PER_CONFIGURATION", "SECONDS_PER_PAIR",
           "SweepSize", "SweepSpace", "check_sweep_size", "sweep_size"]

# Note [sweep seconds]: measured once, in CPU seconds of one sweep process (time.process_time around each
# Sweep.evaluate, so other processes' load does not count), on the project's 2-core AMD EPYC at commit a98bc93, in
# three CLI sweeps each run twice, ranking the fastest 20 (the CLI's default) and in full (--json): gpt:175b on 1,024
# A100s and llama:405b on 16,384 H100s as the CLI runs them by default, gpt:13b on 8 to 64 H100s.
# - A simulated configuration costs 11 to 13 us per (micro-batch, stage) pair of its schedule (18 in llama:405b's full
#   sweep): the simulation and the memory replay both walk its tasks, a forward and a backward (and a W or R) a pair.
# - One refused for memory costs 0.7 to 4.4 ms: its stages balanced and priced, its task order replayed, or nothing
#   past its model state.
# - Of "every configuration simulated" at those rates, a full sweep did 61%, 65% and 129% (the others do not fit;
#   llama:405b's do, at its higher rate), so FULL_SHARE is their geometric mean, good to a factor of 1.6. A bounded
#   sweep did 3.5% (gpt:13b), 6.3% (gpt:175b) and 42% (llama:405b, whose deep pipelines have low floors and fit): the
#   share depends on what fits and on how close the floors are, neither known before the model is counted, so
#   BOUNDED_SHARE is their geometric mean and the estimate of a bounded sweep is good to a factor of about 4.
# The estimate divides by the workers (Note [sweep workers] in sim.planning.sweep_workers); two workers ran 1.5 to 2
# times as fast as one process (benchmarks/results/plan_speed.json).
SECONDS_PER_PAIR = 12e-6  # CPU seconds per (micro-batch, stage) pair of a simulated configuration
SECONDS_PER_CONFIGURATION = 1.5e-3  # CPU seconds of a configuration besides its simulation
FULL_SHARE = 0.8  # of every configuration simulated, what a full sweep does
BOUNDED_SHARE = 0.1  # of every configuration simulated, what a sweep that ranks its fastest 20 does
LIMIT_SECONDS = 60.0  # a sweep estimated longer is refused unless asked for (Note [sweep limit])

# Note [sweep limit]: past a minute a sweep is refused before the model is counted, with its estimate and the flags
# that narrow it, so a mistyped list (``--chunks 1-1024`` written out) costs a second, not an hour. The CLI's default
# sweeps stay far below it (gpt:175b on 1,024 A100s about 4 s, llama:405b on 16,384 H100s about 21 s, estimated 5 s
# and 4 s), and a sweep the user means to run is one flag away (``--no-limit``).
NARROWING = ("--gpus", "--stages", "--chunks", "--schedule", "--virtual", "--tensor-parallel", "--checkpoint",
             "--zero", "--sequence-parallel", "--context-parallel", "--replicas")


@dataclass(frozen=True)
class SweepSpace:
    """What :func:`sim.planning.parallel.configurations.configurations` reads of a request, known before the model is
    counted: the CLI's options resolved, and the model's layer count (its ``nn.Sequential``'s length). The degrees
    and sequence parallelism are kept each once, as :class:`~sim.planning.request.PlanRequest` keeps them."""

    batch: int
    layers: int
    gpus: Sequence[int]
    degrees: Sequence[int]
    contexts: Sequence[int]
    splits: Sequence[bool]
    checkpoints: Sequence[str]
    schedule_names: Sequence[str]
    virtual: Sequence[int]
    zero: Sequence[int]
    chunks: Sequence[int] | None = None
    stages: Sequence[int] | None = None
    replicas: Sequence[int] | None = None
    balance: Sequence[int] | None = None
    reshard_after_forward: Sequence[bool] = (True,)
    shard_group: int | None = None
    experts: Sequence[tuple[int, int]] = ((1, 1),)
    """``(expert_parallel, expert_tensor_parallel)`` pairs (:attr:`~sim.planning.request.PlanRequest.experts`)."""

    def __post_init__(self) -> None:
        for name in ("degrees", "contexts", "splits"):
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))


@dataclass(frozen=True)
class SweepSize:
    """A sweep's size and estimated time (Note [sweep seconds]).

    Attributes:
        configurations: configurations the sweep spans.
        pairs: (micro-batch, stage) pairs of their schedules, together.
        seconds: the estimated wall-clock seconds of the sweep.
    """

    configurations: int
    pairs: int
    seconds: float


def sweep_size(points: Sequence[Configuration], *, bounded: bool, workers: int = 1) -> SweepSize:
    """The size of a sweep of ``points`` over ``workers`` processes (Note [sweep seconds]); ``bounded``: it ranks
    only the fastest few (:attr:`sim.planning.request.PlanRequest.keep`)."""
    pairs = sum(p.chunks * p.stages * p.virtual for p in points)
    work = len(points) * SECONDS_PER_CONFIGURATION + pairs * SECONDS_PER_PAIR
    share = BOUNDED_SHARE if bounded else FULL_SHARE
    return SweepSize(len(points), pairs, share * work / max(1, workers))


def check_sweep_size(space: SweepSpace, *, bounded: bool, workers: int = 1,
                     limit: float = LIMIT_SECONDS) -> SweepSize:
    """The size of the sweep ``space`` spans, refused past ``limit`` seconds (Note [sweep limit]).

    Raises:
        ValueError: one line with the estimate and the flags that narrow the sweep.
    """
    size = sweep_size(configurations(space, {}), bounded=bounded, workers=workers)
    if size.seconds > limit:
        top = "" if bounded else "rank only the fastest with --top K (in place of --json, --out or --top 0), "
        raise ValueError(f"this sweep spans {size.configurations:,} configurations ({size.pairs:,} micro-batch x stage "
                         f"pairs), about {_duration(size.seconds)} on {workers} worker{'s' * (workers != 1)}, past "
                         f"the limit of {limit:.0f} s: {top}narrow it with {', '.join(NARROWING)}, or give "
                         "--no-limit to run it anyway")
    return size


def _duration(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps it at least 2 (``"4 minutes"``)."""
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:.0f} seconds"
