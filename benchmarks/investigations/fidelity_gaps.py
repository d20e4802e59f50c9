"""Where a fidelity row's error lies: in the tasks' own seconds, or in the waits between them.

For each configuration this runs the fidelity grid's experiment (:func:`sim.calibration.experiment.run`: calibrate,
run the executor on two CPU workers, simulate the same schedule, keep the step of median makespan) and takes the
measured and the predicted timelines apart:

    busy      each worker's seconds inside its tasks (the mean over the two workers)
    idle      each worker's seconds between its first and last task outside them (the mean over the two workers)
    hand-off  how long a worker that was waiting for its input took to start the task after the worker that made the
              input ended its task: a hand-off between the two workers, the median over such tasks of the step
    alone     measured over predicted seconds of the tasks that ran with the other worker idle (overlap < 5%)
    together  the same for the tasks that ran mostly beside a task of the other worker (overlap >= 50%)

``alternation`` is a check of the caches: a training pass of a quarter of the ``mlp`` model run on one thread
alternately with another quarter, over the same pass run back to back.

A row whose error is mostly in ``busy`` mis-prices the tasks (their seconds, or how two of them slow each other on
shared cores: ``together`` against ``alone``); one mostly in ``idle`` mis-prices the hand-offs and what waits on them.

A second table, ``wakes``, times the hand-off itself without the executor: a thread blocked on a queue (the
executor's inbox) on one core is handed a timestamp from another core after it has waited ``idle_ms``, while the
sender then ``waits`` (blocks, as a worker with nothing left to do) or computes a forward of the ``mlp`` or ``conv``
model's stage (as a worker going on with its next task); each row gives the median and the 90th percentile of the
time from the put to the receiver running, under the executor's switch interval. The simulator charges one
hand-off, measured on probe pipelines whose layers compute almost nothing (Note [executor overheads] in
``sim.calibration.calibrate``): their workers wait microseconds, and the sender has nothing to compute.

Set deliberately, as ``fidelity.py`` sets it: one intra-op thread per worker (Note [threads] in
``_shared/machine.py``), each worker pinned to a core, a quiet machine is not waited for (run it on one).

Each configuration runs ``--repeats`` times (three): one run takes a single step apart, and how its error divides
between ``busy`` and ``idle`` moves from run to run; a row's numbers are the medians over the runs.

Finding: the simulator predicts these rows fast because the tasks take longer than calibrated beside the other
worker's and a waiting worker wakes later than the hand-off it is charged (docs/benchmarks.md, "Where the error lies").

Run: ``.venv/bin/python -m benchmarks.investigations.fidelity_gaps`` (about twelve minutes on two cores) or
``--quick`` (the smoke test's: one small configuration); writes ``benchmarks/results/fidelity_gaps.json``.
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._shared.machine import omp_threads

omp_threads()  # before torch loads

import torch  # noqa: E402

from benchmarks._shared import options  # noqa: E402
from benchmarks._shared.fidelity import DEVICES, MODELS, stages_for  # noqa: E402
from benchmarks._shared.machine import set_threads  # noqa: E402
from benchmarks._shared.record import command_line, results_path, write_json  # noqa: E402
from gpipe.interpreter.gil import DEFAULT_SWITCH_INTERVAL, switch_interval  # noqa: E402
from gpipe.schedule import COMPUTE, Task, Timeline  # noqa: E402
from gpipe.schedule.task import dependencies  # noqa: E402
from gpipe.schedule.timeline import Span  # noqa: E402
from sim.calibration.experiment import Setup, run  # noqa: E402
from sim.calibration.machine import keep_freed_memory  # noqa: E402

RESULTS = results_path("fidelity_gaps")
CONFIGS = ("mlp:1f1b:8", "mlp:interleaved-1f1b:8", "conv:1f1b:8", "conv:interleaved-1f1b:8")
# --quick, the smoke test's: one small configuration, three steps, one pair round; fewer wakes and alternations
QUICK, QUICK_STEPS, QUICK_PAIR_ROUNDS, QUICK_WAKES, QUICK_ALTERNATION = ("mlp:1f1b:2",), 3, 1, 5, 30
PAIR_ROUNDS = {"conv": 10, "mlp": 25}  # as fidelity.py
STEPS = 21
REPEATS = 3  # runs of each configuration: one run takes one step apart, and what it finds moves from run to run
WAITS_MS = (0.0, 0.2, 1.0, 3.0, 10.0, 30.0)  # how long the receiver waits before the hand-off, in ``wakes``
SENDERS = ("waits", "mlp", "conv")  # what the sender does after the hand-off, in ``wakes``


def compute_spans(timeline: Timeline) -> dict[Task, Span]:
    return {s.task: s for s in timeline.spans if s.stream == COMPUTE}


def busy_idle(timeline: Timeline) -> tuple[float, float]:
    """The mean over the workers of the seconds inside tasks, and of those between the first and last task outside."""
    busy, idle = [], []
    for d in {s.device for s in timeline.compute_spans()}:
        mine = timeline.compute_spans(d)
        busy.append(timeline.busy(d))
        idle.append(max(s.end for s in mine) - mine[0].start - busy[-1])
    return statistics.mean(busy), statistics.mean(idle)


def handoff_waits(timeline: Timeline, placement: Sequence[int], stages: int) -> list[float]:
    """For each task whose input came from a task on the other worker while its own worker waited (its previous task
    ended before the input's): its start less the input's end, seconds. Inputs are the tasks' dependencies
    (Note [dependencies] in gpipe.schedule.task; these rows never checkpoint)."""
    spans = compute_spans(timeline)
    before: dict[Task, Span] = {}
    for d in {s.device for s in spans.values()}:
        order = timeline.compute_spans(d)
        before.update({b.task: a for a, b in zip(order, order[1:], strict=False)})
    waits = []
    for task, span in spans.items():
        sources = [spans[t] for t in dependencies(task, stages, False)
                   if t in spans and placement[t.stage] != placement[task.stage]]
        if not sources:
            continue
        source = max(sources, key=lambda s: s.end)
        previous = before.get(task)
        if previous is not None and previous.end > source.end:
            continue  # its worker was still busy when the input arrived: nothing waited on the hand-off
        waits.append(span.start - source.end)
    return waits


def overlap(span: Span, spans: dict[Task, Span]) -> float:
    """The fraction of ``span`` during which the other worker ran a task."""
    shared = sum(max(0.0, min(span.end, s.end) - max(span.start, s.start))
                 for s in spans.values() if s.device != span.device)
    return shared / span.duration if span.duration > 0 else 0.0


def duration_ratios(measured: Timeline, predicted: Timeline) -> dict[str, float | None]:
    """The median measured over predicted seconds of the tasks that ran alone, and of those that ran beside another."""
    m, p = compute_spans(measured), compute_spans(predicted)
    alone, together = [], []
    for task, span in m.items():
        if task not in p or p[task].duration <= 0:
            continue
        share = overlap(span, m)
        ratio = span.duration / p[task].duration
        if share < 0.05:
            alone.append(ratio)
        elif share >= 0.5:
            together.append(ratio)
    return {"alone": statistics.median(alone) if alone else None,
            "together": statistics.median(together) if together else None,
            "alone_tasks": len(alone), "together_tasks": len(together)}


def measure(config: str, steps: int, pair_rounds: int | None = None) -> dict[str, Any]:
    """One configuration ``model:schedule:chunks``, checkpoint ``never``: the row of the table. ``pair_rounds``:
    the model's :data:`PAIR_ROUNDS` when ``None``."""
    name, schedule, chunks = config.split(":")
    model, batch = MODELS[name](0)
    stages = stages_for(schedule)
    outcome = run(model, batch, Setup(chunks=int(chunks), checkpoint="never", schedule=schedule, stages=stages,
                                      devices=("cpu",) * DEVICES, steps=steps,
                                      pair_rounds=pair_rounds or PAIR_ROUNDS[name], seed=0, threads=1))
    measured, predicted = outcome.measured, outcome.predicted
    (busy_m, idle_m), (busy_p, idle_p) = busy_idle(measured), busy_idle(predicted)
    placement = outcome.schedule.placement
    waits_m, waits_p = handoff_waits(measured, placement, stages), handoff_waits(predicted, placement, stages)
    return {
        "model": name, "schedule": schedule, "chunks": int(chunks),
        "predicted_ms": predicted.makespan * 1e3, "measured_ms": measured.makespan * 1e3,
        "error": predicted.makespan / measured.makespan - 1,
        "busy_measured_ms": busy_m * 1e3, "busy_predicted_ms": busy_p * 1e3,
        "idle_measured_ms": idle_m * 1e3, "idle_predicted_ms": idle_p * 1e3,
        "handoff_measured_us": statistics.median(waits_m) * 1e6 if waits_m else None,
        "handoff_predicted_us": statistics.median(waits_p) * 1e6 if waits_p else None,
        "handoffs_measured": len(waits_m), "handoffs_predicted": len(waits_p),
        **duration_ratios(measured, predicted),
    }


def _senders() -> dict[str, Callable[[], object]]:
    """What the sender of :func:`wakes` does after the put: block, or one forward of a stage of a fidelity model
    (a quarter of its layers, one micro-batch of eight rows)."""
    mlp, x = MODELS["mlp"](0)
    conv, image = MODELS["conv"](0)
    mlp_stage, conv_stage = mlp[:len(mlp) // 4], conv[:len(conv) // 4]

    def forward(stage: torch.nn.Module, sample: torch.Tensor) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return stage(sample)
        return run

    return {"waits": lambda: None, "mlp": forward(mlp_stage, x[:8]), "conv": forward(conv_stage, image[:8])}


def wakes(waits_ms: Sequence[float] = WAITS_MS, samples: int = 40) -> list[dict[str, Any]]:
    """For each wait and each of :data:`SENDERS`: the median and 90th percentile of a hand-off to a thread that has
    been blocked that long on a ``queue.SimpleQueue`` (the executor's inbox), sender and receiver on cores of their
    own where the machine has two, under the executor's switch interval."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    inbox: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[float] = queue.SimpleQueue()

    def receive() -> None:
        if len(cores) >= 2:
            os.sched_setaffinity(0, {cores[1]})
        while (sent := inbox.get()) is not None:
            back.put(time.perf_counter() - sent)

    senders = _senders()
    thread = threading.Thread(target=receive, daemon=True)
    mask = os.sched_getaffinity(0) if cores else None
    rows = []
    with switch_interval(DEFAULT_SWITCH_INTERVAL):
        thread.start()
        if len(cores) >= 2:
            os.sched_setaffinity(0, {cores[0]})
        try:
            for sender, then in senders.items():
                then()  # warm
                for wait in waits_ms:
                    seconds = []
                    for _ in range(samples):
                        until = time.perf_counter() + wait / 1e3
                        while time.perf_counter() < until:
                            pass
                        inbox.put(time.perf_counter())
                        then()
                        seconds.append(back.get())
                    rows.append({"sender": sender, "idle_ms": wait, "wake_median_us": statistics.median(seconds) * 1e6,
                                 "wake_p90_us": statistics.quantiles(seconds, n=10)[-1] * 1e6})
        finally:
            inbox.put(None)
            thread.join()
            if mask is not None:
                os.sched_setaffinity(0, mask)
    return rows


def alternation(rounds: int = 7, repeats: int = 100) -> float:
    """The median over rounds of a training pass of a quarter of the ``mlp`` model, run alternately with another such
    stage on one thread, over the same pass run back to back: what two stages sharing a core's caches cost."""
    model, x = MODELS["mlp"](0)
    quarter = len(model) // 4
    first, second = model[:quarter], model[quarter:2 * quarter]
    sample = x[:8].clone().requires_grad_()

    def train(stage: torch.nn.Module) -> float:
        start = time.perf_counter()
        stage(sample).sum().backward()
        return time.perf_counter() - start

    def after_second() -> float:
        train(second)  # evicts what it can of the first stage
        return train(first)

    ratios = []
    for _ in range(rounds):
        alone = statistics.median(train(first) for _ in range(repeats))
        mixed = statistics.median(after_second() for _ in range(repeats))
        ratios.append(mixed / alone)
    return statistics.median(ratios)


def combined(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row from runs of one configuration: each number the median over the runs (``None`` where no run had it),
    every run kept in ``runs``."""
    row: dict[str, Any] = {}
    for key, value in runs[0].items():
        found = [r[key] for r in runs if r[key] is not None]
        if key != "chunks" and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in found):
            row[key] = statistics.median(found) if found else None
        else:
            row[key] = value
    return {**row, "runs": list(runs)}


def _cell(value: Any, form: str) -> str:
    return "-" if value is None else format(value, form)


def main(argv: list[str] | None = None) -> None:
    parser = options.parser(__doc__)
    options.add_quick(parser, f"one small configuration, {QUICK_STEPS} steps (the smoke test's)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated model:schedule:chunks")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"runs of each configuration, a row the medians (default {REPEATS}; --quick: 1)")
    options.add_out(parser, RESULTS)
    args = parser.parse_args(argv)
    set_threads(1)
    kept = keep_freed_memory()
    configs = QUICK if args.quick else tuple(args.configs.split(","))
    args.repeats = args.repeats or (1 if args.quick else REPEATS)
    steps, pair_rounds = (QUICK_STEPS, QUICK_PAIR_ROUNDS) if args.quick else (STEPS, None)
    print(f"{'model':5} {'schedule':>16} {'chunks':>6} {'error':>7} {'busy ms meas/pred':>18} "
          f"{'idle ms meas/pred':>18} {'hand-off us meas/pred':>22} {'alone':>6} {'together':>8}")
    rows = []
    for config in configs:
        row = combined([measure(config, steps, pair_rounds) for _ in range(args.repeats)])
        rows.append(row)
        print(f"{row['model']:5} {row['schedule']:>16} {row['chunks']:6d} {row['error']:+7.1%} "
              f"{row['busy_measured_ms']:8.2f}/{row['busy_predicted_ms']:<9.2f} "
              f"{row['idle_measured_ms']:8.2f}/{row['idle_predicted_ms']:<9.2f} "
              f"{_cell(row['handoff_measured_us'], '10.0f')}/{_cell(row['handoff_predicted_us'], '<11.0f')} "
              f"{_cell(row['alone'], '6.2f')} {_cell(row['together'], '8.2f')}", flush=True)
    wake_rows = wakes(samples=QUICK_WAKES if args.quick else 40)
    print("hand-off to a thread blocked on a queue, by how long it waited and what the sender does next:")
    for row in wake_rows:
        print(f"  sender {row['sender']:5} waited {row['idle_ms']:5.1f} ms: median {row['wake_median_us']:6.0f} us, "
              f"90th percentile {row['wake_p90_us']:7.0f} us")
    mixed = alternation(rounds=3, repeats=QUICK_ALTERNATION) if args.quick else alternation()
    print(f"a quarter of the mlp model alternating with another on one thread: {mixed:.3f} of it back to back")
    note = (f"checkpoint never; {steps} measured steps a run, the step of median makespan taken apart; each number "
            f"the median over {args.repeats} runs of the configuration (every run in 'runs'); busy and idle: "
            "the mean over the two workers; hand-off: the median wait of a worker for an input from the other worker; "
            "alone / together: the median measured over predicted task seconds of tasks with under 5% / at least 50% "
            "of their time beside the other worker's tasks; one intra-op thread per worker, workers pinned.")
    doc = {"rows": rows, "wakes": wake_rows, "alternation": mixed, "note": note}
    write_json(args.out, doc, command=command_line(__file__, argv),
               machine={"threads_per_worker": 1, "keep_freed_memory": kept})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
