"""Why a small model's steps spread more than a large one's: the same machine, steps of different lengths.

The fidelity grid's host-bound ``mlp`` rows spread (slowest less fastest measured step, over the median) far more
than its ``conv`` rows. This script times, on one machine in one run, steps with and without what could spread
them: a pure-Python loop of about a millisecond (no torch, no threads, no allocator, no collector work), one plain
training step of each model on one thread, and each model's 1F1B pipeline on two CPU workers (chunks 8, checkpoint
``never``, the fidelity grid's models, balanced by time as it balances them), each with Python's cyclic collector on
and off.

Each row: the median step, ``spread`` = (max - min) / median and ``p90_p10`` = (90th - 10th percentile) / median.
A spread the pure loop shares comes from the machine (the scheduler, other tenants, timer and frequency changes);
one that grows only with threads, or falls with the collector off, comes from the pipeline or the collector.

Thread counts: one intra-op thread per worker and in the plain step (``--threads``; Note [threads] in
``_shared/machine.py``).

Finding: the spread comes from the machine and the step's length, not the pipeline's threads nor the collector; so
the fidelity rows compare the step of median makespan (docs/benchmarks.md, "Why the small model's steps spread").

Run: ``.venv/bin/python -m benchmarks.investigations.step_spread`` (about two minutes) or ``--quick`` (every row,
on an eighth of the batch, ten steps after one untimed: for the smoke test, not a spread to read); writes
``benchmarks/results/step_spread.json``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks._shared.machine import omp_threads

omp_threads()  # before torch loads

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks._shared import options  # noqa: E402
from benchmarks._shared.fidelity import MODELS  # noqa: E402
from benchmarks._shared.machine import set_threads  # noqa: E402
from benchmarks._shared.record import command_line, results_path, write_json  # noqa: E402
from gpipe import GPipe  # noqa: E402
from gpipe.balance import balance_by_time  # noqa: E402

RESULTS = results_path("step_spread")
STEPS = {"loop": 121, "mlp": 121, "conv": 31}  # per row; the conv model's steps are 50 times longer
WARMUP = 5
# --quick: ten steps, the fewest whose deciles (statistics.quantiles, exclusive) lie strictly between the fastest and
# the slowest step (nine put them on those steps, off by a rounding), on an eighth of the batch (a row a micro-batch),
# balanced on balance_by_time's fewest passes (timeout 0)
QUICK_STEPS, QUICK_WARMUP, QUICK_BATCH = 10, 1, 8


def _loop(n: int = 60_000) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output.float().pow(2).mean() + 0 * target.sum()


def steps_of(name: str, batch: int | None = None, timeout: float = 1.0) -> dict[str, Callable[[], Any]]:
    """The kinds of step of row ``name``: the loop alone, or a model's plain step and its pipeline's, on the model's
    mini-batch or its first ``batch`` rows, balanced by ``timeout`` seconds of profiling."""
    if name == "loop":
        return {"python loop": _loop}
    model, x = MODELS[name](0)
    x = x[:batch]
    target = torch.zeros(x.shape[0])
    plain: nn.Sequential = model

    def plain_step() -> None:
        plain.zero_grad(set_to_none=True)
        _loss(plain(x), target).backward()

    layers = MODELS[name](0)[0]
    balance = balance_by_time(2, layers, x[:x.shape[0] // 8], timeout=timeout, device="cpu")  # as the fidelity grid
    pipe = GPipe(layers, balance, devices=["cpu", "cpu"], chunks=8, checkpoint="never", schedule="1f1b")

    def pipe_step() -> None:
        pipe.zero_grad(set_to_none=True)
        pipe.step(x, target, _loss)

    return {"plain step, one thread": plain_step, "1F1B on two workers": pipe_step}


def measure(step: Callable[[], Any], count: int, collector: bool, warmup: int = WARMUP) -> dict[str, float]:
    """``count`` timed steps after ``warmup`` untimed ones, the collector on or off throughout."""
    was = gc.isenabled()
    (gc.enable if collector else gc.disable)()
    try:
        for _ in range(warmup):
            step()
        times = []
        for _ in range(count):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    finally:
        (gc.enable if was else gc.disable)()
    median = statistics.median(times)
    deciles = statistics.quantiles(times, n=10)
    return {"median_ms": median * 1e3, "spread": (max(times) - min(times)) / median,
            "p90_p10": (deciles[-1] - deciles[0]) / median}


def main(argv: list[str] | None = None) -> None:
    parser = options.parser(__doc__)
    options.add_quick(parser, f"{QUICK_STEPS} steps a row after {QUICK_WARMUP} untimed, on {QUICK_BATCH} rows "
                              "(the smoke test's)")
    options.add_threads(parser)
    options.add_out(parser, RESULTS)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    warmup = QUICK_WARMUP if args.quick else WARMUP
    batch, timeout = (QUICK_BATCH, 0.0) if args.quick else (None, 1.0)
    rows = []
    print(f"{'model':6} {'step':24} {'collector':>9} {'median ms':>10} {'spread':>8} {'p90-p10':>8}")
    for name in STEPS:
        for kind, step in steps_of(name, batch, timeout).items():
            for collector in (True, False):
                row = {"model": name, "step": kind, "collector": "on" if collector else "off",
                       **measure(step, QUICK_STEPS if args.quick else STEPS[name], collector, warmup)}
                rows.append(row)
                print(f"{name:6} {kind:24} {row['collector']:>9} {row['median_ms']:10.2f} {row['spread']:8.1%} "
                      f"{row['p90_p10']:8.1%}")
    note = ("spread = (slowest - fastest step) / median; p90_p10 = (90th - 10th percentile) / median; "
            f"steps per row: {QUICK_STEPS if args.quick else STEPS}, after {warmup} untimed"
            f"{f', on {QUICK_BATCH} rows' if args.quick else ''}; one intra-op thread per worker.")
    write_json(args.out, {"rows": rows, "note": note}, command=command_line(__file__, argv),
               machine={"threads_per_worker": args.threads})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
