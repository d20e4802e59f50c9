"""Do pair slowdowns depend on how they are measured? Three probes of the same pairs of tasks.

The simulator's pairwise sharing (``sim.core.sharing``) gives each pair of task kinds one
slowdown ``c``: a task runs at ``1 / (1 + c)`` of its speed while the other one runs. On two CPU cores the pairs of
the fidelity grid's ``mlp`` (64 x (Linear(64, 64), ReLU), balance 66/62, micro-batches of 8) are mostly Python's global
interpreter lock changing hands. This script measures the same pairs three ways, on the same partitions, each
against its own runs alone:

- ``looped``: :class:`sim.calibration.pairs.PairMeter`, what the calibration uses: both tasks back to back on two
threads for a
  window, each one's rate its time alone over its time together, averaged over both ways round.
- ``one-shot``: each task once, both started together, as a pipeline starts them; each one's rate is
  ``(alone - time it ran alone) / time they overlapped``, exactly what processor sharing would need; the median
  over ``--samples`` starts.
- ``phase``: each thread loops what a worker runs in the backward phase of a checkpointed pipeline, a grad-enabled
  forward (``R``) and then the backward of that very graph (``B``); every run inside the window gives one equation
  ``alone = time alone + sum of overlaps / (1 + c)``, solved for the ``c`` of each pair by least squares.

If the probes agree, what the simulator gets wrong about overlapping tasks is not how a pair is measured but
what one constant per pair can say (docs/benchmarks.md, Fidelity).

Threads: ``OMP_NUM_THREADS=1`` before torch loads and ``torch.set_num_threads(1)``, on purpose (Note [threads] in
``_shared/machine.py``): two threads on two cores, each pinned to one (:func:`sim.calibration.machine.worker_affinity`),
at the executor's switch interval (1 ms).

Finding: the three probes rank the pairs alike (``c`` 2.4-4.2 beside a forward, 0.8-1.4 beside a backward, up to
1.6 apart on one pair), so the calibration keeps the looped probe (docs/benchmarks.md, "Pair probes").

Run: ``.venv/bin/python -m benchmarks.investigations.pair_probes`` (under a minute); writes
``benchmarks/results/pair_probes.json``.
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._shared.machine import omp_threads, set_threads

omp_threads()  # before torch loads: see the module docstring

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._shared import options  # noqa: E402
from benchmarks._shared.fidelity import BATCH, mlp_model  # noqa: E402
from benchmarks._shared.record import command_line, results_path, write_json  # noqa: E402
from gpipe.autograd.saved import SavedBytes  # noqa: E402
from gpipe.interpreter.affinity import Cores, pinned  # noqa: E402
from gpipe.interpreter.gil import DEFAULT_SWITCH_INTERVAL, switch_interval  # noqa: E402
from sim.calibration.machine import keep_freed_memory, worker_affinity  # noqa: E402
from sim.calibration.pairs import Graphs, PairMeter, median_pairs  # noqa: E402

RESULTS = results_path("pair_probes")
DEVICES = ("cpu", "cpu")
BALANCE = (66, 62)
CHUNKS = 8
KINDS = (("F", "F"), ("F", "B"), ("B", "F"), ("B", "B"))
Key = tuple[str, int, str, int]  # (kind, stage, other kind, other stage), as Overheads.pairs has them


def main(argv: list[str] | None = None) -> int:
    parser = options.parser(__doc__)
    options.add_out(parser, RESULTS)
    parser.add_argument("--rounds", type=int, default=5, help="looped rounds and phase windows (default: 5)")
    parser.add_argument("--samples", type=int, default=40, help="one-shot starts per pair (default: 40)")
    args = parser.parse_args(argv)
    set_threads(1)  # deliberately: see the module docstring
    keep_freed_memory()
    began = time.perf_counter()
    model, batch = mlp_model(0)
    parts = [model[:BALANCE[0]], model[BALANCE[0]:]]
    micro = batch[:BATCH // CHUNKS]
    cores = worker_affinity(DEVICES) or [None, None]
    probes: dict[str, dict[Key, float]] = {}
    with PairMeter(parts, micro, kinds=KINDS, affinity=cores) as meter:
        probes["looped"] = {p[:4]: p[4] for p in median_pairs([meter.round() for _ in range(args.rounds)])}
        with switch_interval(DEFAULT_SWITCH_INTERVAL):
            probes["one-shot"] = one_shot(meter, cores, args.samples)
    probes["phase"] = phase(parts, micro, cores, args.rounds)
    keys = sorted(probes["looped"])
    print(f"{'pair':>12} " + " ".join(f"{name:>9}" for name in probes))
    for key in keys:
        label = f"{key[0]}{key[1]}|{key[2]}{key[3]}"
        print(f"{label:>12} " + " ".join(f"{probes[name][key]:>9.2f}" for name in probes))

    rows = [{"pair": f"{key[0]}{key[1]}|{key[2]}{key[3]}", **{name: probes[name][key] for name in probes}}
            for key in keys]
    doc = {"benchmark": "pair_probes",
           "note": (f"fidelity.py's mlp, balance {BALANCE}, micro-batches of {BATCH // CHUNKS}, two CPU devices, "
                    "threads pinned, switch interval 1 ms; c of (kind, stage, other kind, other stage) by three "
                    "probes, each against its own runs alone"),
           "probes": {name: [[*key, c] for key, c in sorted(found.items())] for name, found in probes.items()},
           "rows": rows, "seconds": time.perf_counter() - began}
    write_json(args.out, doc, command=command_line(__file__, argv), machine={"intra-op threads per worker": 1})
    print(f"wrote {args.out} in {doc['seconds']:.0f} s")
    return 0


def one_shot(meter: PairMeter, cores: Sequence[Cores | None], samples: int) -> dict[Key, float]:
    """Each pair started together, once per sample, on the meter's two threads; the median ``c`` of each."""
    helper, runners = meter.helper, meter.runners
    assert helper is not None
    alone = {(kind, j): statistics.median(_alone_runs(runners[j][kind], cores[j], samples)) for kind in "FB"
             for j in (0, 1)}
    found: dict[Key, list[float]] = collections.defaultdict(list)
    for a, b in KINDS:
        fa, fb = runners[0][a], runners[1][b]
        for _ in range(samples):
            for fn in (fa, fb):
                if isinstance(fn, Graphs):
                    fn.build(1)
            barrier, spans = threading.Barrier(2), {}

            def other(fb: Callable[[], Any] = fb, spans: dict[int, tuple[float, float]] = spans,
                      barrier: threading.Barrier = barrier) -> None:
                with pinned(cores[1]):
                    barrier.wait()
                    start = time.perf_counter()
                    fb()
                    spans[1] = (start, time.perf_counter())

            helper.submit(other)
            with pinned(cores[0]):
                barrier.wait()
                start = time.perf_counter()
                fa()
                spans[0] = (start, time.perf_counter())
            helper.result()
            overlap = min(spans[0][1], spans[1][1]) - max(spans[0][0], spans[1][0])
            if overlap <= 0:
                continue
            for (kind, j), (other_kind, k) in (((a, 0), (b, 1)), ((b, 1), (a, 0))):
                lonely = spans[j][1] - spans[j][0] - overlap
                rate = (alone[(kind, j)] - lonely) / overlap
                found[(kind, j, other_kind, k)].append(1.0 / max(rate, 1e-3) - 1.0)
    return {key: statistics.median(cs) for key, cs in found.items()}


def _alone_runs(fn: Callable[[], Any], cores: Cores | None, count: int) -> list[float]:
    times = []
    with pinned(cores):
        for _ in range(count):
            if isinstance(fn, Graphs):
                fn.build(1)
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return times


def phase(parts: Sequence[torch.nn.Module], micro: torch.Tensor, cores: Sequence[Cores | None],
          windows: int, window: float = 0.3) -> dict[Key, float]:
    """Both threads loop ``R`` then the backward of its own graph; ``c`` per pair by least squares."""
    with torch.no_grad():
        inputs = [micro, parts[0](micro)]

    def runs(j: int) -> list[tuple[str, Callable[[], Any]]]:
        graph: list[torch.Tensor] = []

        def forward() -> None:
            leaf = inputs[j].detach().requires_grad_(j > 0)
            with torch.enable_grad(), SavedBytes(parts[j]).hooks():
                graph.append(parts[j](leaf))

        def backward() -> None:
            out = graph.pop()
            torch.autograd.backward([out], [torch.ones_like(out)])
        return [("F", forward), ("B", backward)]

    def loop(j: int, until: float, log: list[tuple[str, float, float]], barrier: threading.Barrier) -> None:
        sequence = runs(j)
        with pinned(cores[j]):
            barrier.wait()
            while time.perf_counter() < until:
                for kind, fn in sequence:
                    start = time.perf_counter()
                    fn()
                    log.append((kind, start, time.perf_counter()))

    saved = [[p.grad for p in part.parameters()] for part in parts]
    rows: list[tuple[tuple[str, int], collections.Counter[tuple[str, int]], float]] = []
    try:
        with switch_interval(DEFAULT_SWITCH_INTERVAL):
            for _ in range(windows):
                alone: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
                for j in (0, 1):
                    log: list[tuple[str, float, float]] = []
                    loop(j, time.perf_counter() + window / 3, log, threading.Barrier(1))
                    for kind, start, end in log[2:]:  # the first R and B pay one-off costs
                        alone[(kind, j)].append(end - start)
                logs: tuple[list[tuple[str, float, float]], ...] = ([], [])
                barrier = threading.Barrier(2)
                until = time.perf_counter() + window
                thread = threading.Thread(target=loop, args=(1, until, logs[1], barrier))
                thread.start()
                loop(0, until, logs[0], barrier)
                thread.join()
                lo = max(log[0][1] for log in logs)
                hi = min(log[-1][2] for log in logs)
                for j in (0, 1):
                    for kind, start, end in logs[j]:
                        if start < lo or end > hi:
                            continue
                        overlaps: collections.Counter[tuple[str, int]] = collections.Counter()
                        for other, s, e in logs[1 - j]:
                            if min(end, e) > max(start, s):
                                overlaps[(other, 1 - j)] += min(end, e) - max(start, s)
                        rows.append(((kind, j), overlaps,
                                     statistics.median(alone[(kind, j)]) - (end - start - sum(overlaps.values()))))
    finally:
        for part, grads in zip(parts, saved, strict=True):
            for p, g in zip(part.parameters(), grads, strict=True):
                p.grad = g
    keys = sorted({(*x, *y) for x, overlaps, _ in rows for y in overlaps})
    matrix = np.zeros((len(rows), len(keys)))
    for i, (x, overlaps, _) in enumerate(rows):
        for y, seconds in overlaps.items():
            matrix[i, keys.index((*x, *y))] = seconds
    rates, *_ = np.linalg.lstsq(matrix, np.array([r[2] for r in rows]), rcond=None)
    return {key: 1.0 / max(float(rate), 1e-3) - 1.0 for key, rate in zip(keys, rates, strict=True)}


if __name__ == "__main__":
    raise SystemExit(main())
