"""How the tasks of two stages slow each other on shared cores, measured on the real partitions.

:class:`PairMeter` measures, round after round, every pair of task kinds that GPipe's two phases can
run at once (:data:`PHASE_PAIRS`, Note [pairs]); :func:`measure_pairs` is one meter, a few rounds, and the median
of each pair (Note [pair rounds]); :func:`rebased` puts a round against the cost model's seconds
(Note [pair baselines]). The result is :attr:`sim.calibration.host.Overheads.pairs`, which the simulator's
pairwise sharing uses (:class:`sim.core.sharing.SharedCores`). :mod:`sim.calibration.experiment` keeps one meter
open while the executor runs and takes a round after every training step (Note [interleaved calibration] there).
"""

from __future__ import annotations

import contextlib
import queue
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from gpipe.autograd.phase import checkpointing
from gpipe.autograd.saved import SavedBytes, storage_key
from gpipe.checks import check_positive
from gpipe.interpreter.affinity import Cores, check_affinity, pinned
from gpipe.interpreter.gil import DEFAULT_SWITCH_INTERVAL, check_switch_interval, switch_interval
from gpipe.profiling.profile import RecordedSeconds, TensorOrTensors, preserved

__all__ = ["PHASE_PAIRS", "Graphs", "PairMeter", "Pairs", "changes_input", "measure_pairs", "median_pairs", "rebased",
           "task_runners"]

# Note [pairs]: how much two workers slow each other depends on *what* they run: convolutions on two cores
# hardly meet; small layers' forwards, and backwards unpacking saved tensors through Python hooks, take turns
# on Python's lock. So contention is measured on the real partitions, per pair of task kinds that can run at
# once (:data:`PHASE_PAIRS`): both run back to back on two threads for a window; each one's rate is its time
# alone (same round) over its time together, averaged over both orders (the thread that holds the lock first
# tends to keep it: one order alone would say "one starves", not "they share"); ``c = 1 / rate - 1``. The
# second thread is long-lived and warmed up first: a fresh thread's one-off costs are not contention.
#: The pairs of task kinds that can run at the same time in GPipe's two phases (Note [two phases] in
#: sim.core.run): forwards beside forwards, then recomputes (grad-enabled forwards) and backwards.
PHASE_PAIRS = (("F", "F"), ("F", "Fc"), ("Fc", "F"), ("Fc", "Fc"), ("F", "B"), ("B", "F"), ("B", "B"))

#: ``(kind, stage, other kind, other stage, c)``, as :attr:`sim.calibration.host.Overheads.pairs` holds them.
Pairs = tuple[tuple[str, int, str, int, float], ...]
PairKey = tuple[str, int, str, int]
TaskKey = tuple[str, int]  # (kind, stage)


def measure_pairs(parts: Sequence[nn.Module], sample: TensorOrTensors, *, window: float = 0.03,
                  max_window: float = 0.15, repeats: int = 2,
                  kinds: Sequence[tuple[str, str]] = PHASE_PAIRS,
                  affinity: Sequence[Cores | None] | None = None,
                  switch_interval: float | None = DEFAULT_SWITCH_INTERVAL,
                  recorded: Sequence[RecordedSeconds] | None = None,
                  placement: Sequence[int] | None = None) -> Pairs:
    """How much the tasks of two stages slow each other when they run at the same time (Note [pairs]).

    Args:
        parts: the partitions, in order, on their devices (the CPU: sharing devices are the point).
        sample: the first partition's input (one micro-batch).
        window: the shortest time each pair runs together, seconds; a pair whose tasks are slow runs
            for 2.5 times its slower task, up to ``max_window``.
        max_window: the longest time one pair runs together, seconds.
        repeats: rounds of every measurement; each slowdown is the median over the rounds.
        kinds: the pairs of task kinds to measure, for every pair of stages.
        affinity: one set of CPU cores per stage (or ``None``): each stage's task runs on a thread
            pinned there, as :class:`gpipe.GPipe` with ``cpu_affinity`` runs it.
        switch_interval: Python's switch interval while pairs run, as the executor's workers run
            (:class:`gpipe.GPipe`'s ``switch_interval``, Note [switch interval] in :mod:`gpipe.interpreter.gil`).
        recorded: the seconds of each stage's tasks in the cost model the pairs are for; each round is
            rebased against them (:func:`rebased`, Note [pair baselines]). ``None``: ``c`` stays relative
            to the meter's own runs alone.
        placement: each stage's schedule device (worker); only stages on different workers are paired, since
            one worker runs one task at a time. ``None``: a worker per stage.

    Returns:
        ``(kind, stage, other kind, other stage, c)`` for :attr:`sim.calibration.host.Overheads.pairs`, both ways.

    Raises:
        ValueError: ``repeats < 1``, a non-positive window, a bad ``affinity`` or ``placement``.
    """
    check_positive("repeats", repeats)
    with PairMeter(parts, sample, window=window, max_window=max_window, kinds=kinds, affinity=affinity,
                   switch_interval=switch_interval, placement=placement) as meter:
        rounds = []
        for _ in range(repeats):
            found = meter.round()
            rounds.append(found if recorded is None else rebased(found, meter.alone, recorded))
        return median_pairs(rounds)


def median_pairs(rounds: Sequence[Mapping[PairKey, float]]) -> Pairs:
    """Each pair's median over ``rounds`` (of :meth:`PairMeter.round`), at least 0, sorted by pair.

    Raises:
        ValueError: no rounds, or rounds of different pairs.
    """
    if not rounds:
        raise ValueError("need at least one round of pair measurements")
    keys = sorted(rounds[0])
    if any(sorted(r) != keys for r in rounds):
        raise ValueError("the rounds measured different pairs")
    return tuple((*key, max(0.0, statistics.median(r[key] for r in rounds))) for key in keys)


# Note [pair baselines]: ``c`` is measured against each task's time alone *in the meter's loop* (warm caches), but
# the simulator slows the cost model's seconds, which the profiler takes colder. Sharing the cores adds the lock's
# hand-overs, ``c * alone`` seconds, not a share of whatever the task costs elsewhere; applied unchanged, ``c``
# would count the colder caches twice. :func:`rebased` makes each ``c`` add those seconds to the cost model's task
# (``c * alone in the loop / its seconds``); sim.calibration.experiment rebases every round against the profiling
# pass just before it.
def rebased(slowdowns: Mapping[PairKey, float], alone: Mapping[TaskKey, float],
            recorded: Sequence[RecordedSeconds]) -> dict[PairKey, float]:
    """Each ``c`` of a round as the slowdown of the cost model's task that adds the same seconds (Note [pair
    baselines]): ``c * alone[(kind, stage)] / seconds``, where ``seconds`` is ``recorded[stage]``'s
    ``forward`` for an ``F``, ``forward_nograd`` for an ``Fc`` and ``backward`` for a ``B``.

    A pair whose task has no time alone in ``alone`` or no positive seconds keeps its ``c``.
    """
    def seconds(kind: str, stage: int) -> float:
        if not 0 <= stage < len(recorded):
            return 0.0
        r = recorded[stage]
        return {"F": r.forward, "Fc": r.forward_nograd, "B": r.backward}.get(kind, 0.0)

    out: dict[PairKey, float] = {}
    for key, c in slowdowns.items():
        base, own = alone.get(key[:2], 0.0), seconds(key[0], key[1])
        out[key] = c * base / own if base > 0 and own > 0 else c
    return out


# Note [pair rounds]: one round is a poor sample. Who gets Python's lock next depends on how fast a sleeping core
# wakes up, which on a virtual machine changes from one second to the next, so one pair's slowdown varies
# severalfold within a minute. The median of many rounds spread over the time the executor runs is stable
# (sim.calibration.experiment takes one round after every step); a single up-front measurement is not.
class PairMeter:
    """Measures, one round at a time, how the tasks of each pair of stages slow each other (Note [pairs]).

    A context manager. Entering builds a runner per stage and task kind (:func:`task_runners`), starts
    the second thread and warms both threads up on every task; each :meth:`round` then measures every
    pair once. Each round (and the set-up) leaves the partitions as it found them (gradients, buffers,
    training flags) and the random number generator untouched, so between rounds the partitions may
    be trained by anything else, as :mod:`sim.calibration.experiment` does (Note [pair rounds]).

    Args: as :func:`measure_pairs`, less ``repeats`` and ``recorded``.

    Attributes:
        alone: after a round, each task's seconds alone in that round's loop, by ``(kind, stage)``: the
            baseline its ``c`` are relative to (Note [pair baselines]); empty before the first round.

    Raises:
        ValueError: a non-positive window, a bad ``affinity`` or ``placement``.
    """

    def __init__(self, parts: Sequence[nn.Module], sample: TensorOrTensors, *, window: float = 0.03,
                 max_window: float = 0.15, kinds: Sequence[tuple[str, str]] = PHASE_PAIRS,
                 affinity: Sequence[Cores | None] | None = None,
                 switch_interval: float | None = DEFAULT_SWITCH_INTERVAL,
                 placement: Sequence[int] | None = None) -> None:
        if not window > 0 or not max_window >= window:
            raise ValueError(f"need 0 < window <= max_window, got {window!r} and {max_window!r}")
        self.placement = tuple(range(len(parts))) if placement is None else tuple(int(d) for d in placement)
        if len(self.placement) != len(parts):
            raise ValueError(f"placement has {len(self.placement)} entries for {len(parts)} stages: give one "
                             "schedule device per stage")
        #: the pairs of stages measured: those on different workers (one worker runs one task at a time)
        self.stage_pairs = [(j, k) for j in range(len(parts)) for k in range(j + 1, len(parts))
                            if self.placement[j] != self.placement[k]]
        self.switch_interval = check_switch_interval(switch_interval)
        self.parts, self.sample = list(parts), sample
        self.window, self.max_window, self.kinds = window, max_window, tuple(kinds)
        self.cores = check_affinity(affinity, len(self.parts)) or [None] * len(self.parts)
        paired = {j for pair in self.stage_pairs for j in pair}
        self.needed = sorted({(a, j) for a, _ in self.kinds for j in paired} |
                             {(b, k) for _, b in self.kinds for k in paired})
        self.runners: list[dict[str, Callable[[], Any]]] = []
        self.helper: _Helper | None = None
        self.alone: dict[TaskKey, float] = {}

    def __enter__(self) -> PairMeter:
        try:
            with self._untouched():
                self.runners = task_runners(self.parts, self.sample)
                self.helper = _Helper()
                for kind, j in self.needed:  # warm both threads up on every task first
                    for _ in range(2):
                        fn = self.runners[j][kind]
                        if isinstance(fn, Graphs):
                            fn.build(2)
                        fn()
                        self.helper.call(fn)
        except BaseException:
            self.__exit__(None, None, None)  # no second thread left behind
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.helper is not None:
            self.helper.close()
            self.helper = None
        self.runners = []  # frees the graphs built ahead

    @contextlib.contextmanager
    def _untouched(self) -> Any:
        with contextlib.ExitStack() as stack:
            for part in self.parts:
                stack.enter_context(preserved(part))
            stack.enter_context(torch.random.fork_rng(devices=[]))
            yield

    def round(self) -> dict[PairKey, float]:
        """One measurement of every pair, both ways: ``{(kind, stage, other kind, other stage): c}``.

        ``c`` is not clipped: a pair that ran faster together than its tasks alone (noise) gives a
        negative ``c``, which the median over rounds (:func:`median_pairs`) weighs like any other.

        Raises:
            RuntimeError: the meter is not entered.
        """
        helper = self.helper
        if helper is None:
            raise RuntimeError("a PairMeter measures inside its with-block")
        slow: dict[PairKey, float] = {}
        with self._untouched(), switch_interval(self.switch_interval):
            alone: dict[TaskKey, float] = {}
            for kind, j in self.needed:
                with pinned(self.cores[j]):
                    alone[(kind, j)] = _loop_alone(self.runners[j][kind], self.window)
            for j, k in self.stage_pairs:
                for a, b in self.kinds:
                    ta, tb = alone[(a, j)], alone[(b, k)]
                    span = min(max(self.window, 2.5 * max(ta, tb)), self.max_window)
                    fa, fb = self.runners[j][a], self.runners[k][b]
                    # both ways round: the thread that holds Python's lock first tends to keep it
                    xa, xb = _loop_together(helper, fa, fb, span, (ta, tb), (self.cores[j], self.cores[k]))
                    yb, ya = _loop_together(helper, fb, fa, span, (tb, ta), (self.cores[k], self.cores[j]))
                    rate_a = (ta / xa + ta / ya) / 2 if ta > 0 else 1.0
                    rate_b = (tb / xb + tb / yb) / 2 if tb > 0 else 1.0
                    slow[(a, j, b, k)] = 1.0 / max(rate_a, 1e-3) - 1.0
                    slow[(b, k, a, j)] = 1.0 / max(rate_b, 1e-3) - 1.0
        self.alone = alone
        return slow


class Graphs:
    """Backward runs for timing: graphs built ahead, so only the backward is timed.

    ``in_place``: the part changes its input in place (Note [in-place entry]).
    """

    def __init__(self, part: nn.Module, leaves: tuple[torch.Tensor, ...], atomic: bool, *,
                 in_place: bool = False) -> None:
        self.part, self.leaves, self.atomic, self.in_place = part, leaves, atomic, in_place
        self.ready: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def build(self, count: int) -> None:
        while len(self.ready) < count:
            fresh = _entry(self.leaves, copy=True) if self.in_place else \
                tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in self.leaves)
            # saved through the recorder's hooks, as the executor saves them: the backward unpacks each
            with torch.enable_grad(), SavedBytes(self.part).hooks():
                out = self.part(fresh[0] if self.atomic else fresh)
            outs = [t for t in ((out,) if isinstance(out, torch.Tensor) else tuple(out)) if t.requires_grad]
            self.ready.append((outs, [torch.ones_like(t) for t in outs]))

    def __call__(self) -> None:
        outs, grads = self.ready.pop()
        if outs:
            torch.autograd.backward(outs, grads)
        for p in self.part.parameters():
            p.grad = None


def _entry(leaves: tuple[torch.Tensor, ...], *, copy: bool) -> tuple[torch.Tensor, ...]:
    """A run's input: fresh leaves requiring grad as given; with ``copy``, copies of them, which are not
    leaves, so an in-place first layer may change them, as in the executor (Note [in-place entry])."""
    fresh = tuple(t.detach().requires_grad_(t.requires_grad) for t in leaves)
    return tuple(t.clone() for t in fresh) if copy else fresh


def changes_input(part: nn.Module, leaves: tuple[torch.Tensor, ...], atomic: bool) -> bool:
    """Whether ``part`` changes its input in place (an in-place first layer): one no-grad forward on a copy."""
    probe = tuple(t.detach().clone() for t in leaves)
    versions = [t._version for t in probe]
    with torch.no_grad():
        part(probe[0] if atomic else probe)
    return any(t._version != v for t, v in zip(probe, versions, strict=True))


def task_runners(parts: Sequence[nn.Module], sample: TensorOrTensors) -> list[dict[str, Callable[[], Any]]]:
    """Per stage, a thunk per task kind (``F``, ``Fc``, ``B``) that runs it as the executor does.

    ``F`` is a grad-enabled forward through the recorder's hooks, ``Fc`` a checkpointed forward
    (no grad), ``B`` a :class:`Graphs` (a backward of a graph built ahead). Stage ``k`` takes what
    stage ``k - 1`` returns for the sample, requiring grad as the executor's inputs do.

    Note [in-place entry]: the executor hands each task a tensor of its own, and a partition whose first
    layer works in place (``nn.ReLU(inplace=True)``) changes it (on a non-leaf alias when it requires grad,
    Note [entering a partition] in :mod:`gpipe.interpreter.worker`). The runners run a stage again and again on the
    same input, so for such a stage (:func:`changes_input`) every run gets a copy, made inside the timed
    run (what that adds is a copy of the input); other stages run on their input itself, as before.
    """
    runners: list[dict[str, Callable[[], Any]]] = []
    atomic = not isinstance(sample, tuple)
    inputs = sample if isinstance(sample, tuple) else (sample,)
    for k, part in enumerate(parts):
        device = next((t.device for t in part.parameters()), inputs[0].device)
        leaves = tuple(t.detach().to(device).requires_grad_(t.requires_grad or (k > 0 and t.is_floating_point()))
                       for t in inputs)
        state = {storage_key(t) for t in [*part.parameters(), *part.buffers()]}
        in_place = changes_input(part, leaves, atomic)  # Note [in-place entry]

        def forward(part: nn.Module = part, leaves: tuple[torch.Tensor, ...] = leaves, atomic: bool = atomic,
                    state: set[tuple[str, int]] = state, in_place: bool = in_place) -> Any:
            counter = SavedBytes(state)
            fresh = _entry(leaves, copy=in_place)
            with torch.enable_grad(), counter.hooks():
                out = part(fresh[0] if atomic else fresh)
            _ = counter.nbytes
            return out

        def forward_checkpointed(part: nn.Module = part, leaves: tuple[torch.Tensor, ...] = leaves,
                                 atomic: bool = atomic, in_place: bool = in_place) -> Any:
            with torch.no_grad(), checkpointing():
                fresh = _entry(leaves, copy=True) if in_place else leaves
                return part(fresh[0] if atomic else fresh)

        graphs = Graphs(part, leaves, atomic, in_place=in_place)
        runners.append({"F": forward, "Fc": forward_checkpointed, "B": graphs})
        out = forward_checkpointed()
        atomic = isinstance(out, torch.Tensor)
        inputs = tuple(t.detach() for t in ((out,) if atomic else out))
    return runners


def _timed_loop(fn: Callable[[], Any], until: float, times: list[tuple[float, float]]) -> None:
    while True:
        if isinstance(fn, Graphs) and not fn.ready:
            fn.build(2)  # untimed; rare, when the estimate of how many runs fit was short
        start = time.perf_counter()
        if start >= until and times:
            return
        fn()
        times.append((start, time.perf_counter()))


def _loop_alone(fn: Callable[[], Any], window: float) -> float:
    """Mean seconds of ``fn`` run back to back for ``window`` seconds on this thread alone."""
    if isinstance(fn, Graphs):
        fn.build(2)
    fn()  # a first call pays for allocations
    times: list[tuple[float, float]] = []
    _timed_loop(fn, time.perf_counter() + window, times)
    return statistics.mean(end - start for start, end in times)


class _Helper:
    """A second thread that runs what it is given, kept for a whole measurement.

    A fresh thread pays one-off costs on its first calls (thread-local state of the math libraries,
    a new allocator arena), which would read as contention; one long-lived, warmed-up thread does not.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="gpipe-sim-pair", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self.done.put((True, job()))
            except BaseException as error:  # handed back to the caller
                self.done.put((False, error))

    def submit(self, job: Callable[[], Any]) -> None:
        self.jobs.put(job)

    def result(self) -> Any:
        ok, value = self.done.get()
        if not ok:
            raise value
        return value

    def call(self, job: Callable[[], Any]) -> Any:
        self.submit(job)
        return self.result()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


def _loop_together(helper: _Helper, a: Callable[[], Any], b: Callable[[], Any], window: float,
                   alone: tuple[float, float], cores: tuple[Cores | None, Cores | None] = (None, None)
                   ) -> tuple[float, float]:
    """Mean seconds of ``a`` (this thread) and ``b`` (the helper) while both run back to back for ``window`` s.

    Only the runs that lie wholly inside the time both loops ran count (at least one run each).
    ``alone`` (each one's seconds alone) sizes how many backward graphs to build ahead; ``cores``
    pins each loop's thread.
    """
    for fn, seconds in zip((a, b), alone, strict=True):
        if isinstance(fn, Graphs):
            fn.build(min(int(window / max(seconds, 1e-6)) + 3, 1000))
    times_a: list[tuple[float, float]] = []
    times_b: list[tuple[float, float]] = []
    barrier = threading.Barrier(2)
    until = [0.0]

    def other() -> None:
        with pinned(cores[1]):
            barrier.wait()
            _timed_loop(b, until[0], times_b)

    helper.submit(other)
    with pinned(cores[0]):
        until[0] = time.perf_counter() + window
        barrier.wait()
        _timed_loop(a, until[0], times_a)
    helper.result()
    lo = max(times_a[0][0], times_b[0][0])
    hi = min(times_a[-1][1], times_b[-1][1])

    def mean(times: list[tuple[float, float]]) -> float:
        inside = [end - start for start, end in times if start >= lo and end <= hi]
        return statistics.mean(inside) if inside else times[0][1] - times[0][0]

    return mean(times_a), mean(times_b)
