"""What exact random draws cost (Note [random state] in gpipe.autograd.rng), on the small-layer model of the fidelity
runs.

The model is 64 x (Linear(64, 64), ReLU) on two CPU devices, chunks 4, batch 64, every checkpoint policy;
``dropout`` adds a Dropout(0.1) after every eighth ReLU. Each configuration is timed three ways:

    none      the random-state handling switched off (the executor's draws then differ between a forward
              and its recompute: wrong gradients with dropout; here only as the baseline)
    default   as the executor runs: the layers that drew in the first step run under the dispatch mode,
              the others bare, the generators checked around each task (Note [learning which layers draw])
    seeded    every layer under the dispatch mode, as if every one drew

Thread counts: one intra-op thread per worker (``torch.set_num_threads(1)``, ``--threads``; Note [threads] in
``_shared/machine.py``), so the two workers share the two cores. Steps are timed round-robin (one step of each way
per round) and each ratio is the median of per-round ratios, so a slow spell of the shared machine spoils one sample
of each.

Run: ``.venv/bin/python -m benchmarks.rng_cost [--rounds 60]``; writes ``benchmarks/results/rng_cost.json``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from benchmarks._shared import options
from benchmarks._shared.machine import set_threads
from benchmarks._shared.record import command_line, results_path, write_json
from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES

RESULTS = results_path("rng_cost")
WAYS = ("none", "default", "seeded")


def model(dropout: bool) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for k in range(64):
        layers += [nn.Linear(64, 64), nn.ReLU()]
        if dropout and k % 8 == 7:
            layers.append(nn.Dropout(0.1))
    return nn.Sequential(*layers)


@contextlib.contextmanager
def _no_handling(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield


def pipeline(dropout: bool, checkpoint: str, way: str) -> GPipe:
    layers = model(dropout)
    half = len(layers) // 2
    pipe = GPipe(layers, [half, len(layers) - half], devices=["cpu", "cpu"], chunks=4, checkpoint=checkpoint)
    if way == "none":
        pipe.pipeline.draws.task = _no_handling  # type: ignore[method-assign]
    elif way == "seeded":
        pipe.pipeline.draws.marked = [frozenset(range(len(p))) for p in pipe.pipeline.draws.partitions]
    return pipe


def timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=60)
    options.add_out(parser, RESULTS)
    options.add_threads(parser)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    loss_fn = nn.MSELoss()
    rows = []
    print(f"{'model':>8} {'checkpoint':>11} {'none ms':>8} {'default/none':>13} {'seeded/none':>12}")
    for dropout in (False, True):
        for checkpoint in CHECKPOINT_MODES:
            pipes = {way: pipeline(dropout, checkpoint, way) for way in WAYS}
            steps = {way: (lambda p=pipe: p.step(x, y, loss_fn) and None) for way, pipe in pipes.items()}
            for step in steps.values():  # warm up, and let the default pipe learn that nothing draws
                for _ in range(3):
                    step()
            samples: dict[str, list[float]] = {way: [] for way in WAYS}
            for r in range(args.rounds):
                order = WAYS[r % 3:] + WAYS[:r % 3]
                for way in order:
                    samples[way].append(timed(steps[way]))
            ratio = {way: statistics.median(a / b for a, b in zip(samples[way], samples["none"], strict=True))
                     for way in WAYS}
            name = "dropout" if dropout else "mlp"
            row = {"model": name, "checkpoint": checkpoint,
                   "none_ms": statistics.median(samples["none"]) * 1e3,
                   "default_over_none": ratio["default"], "seeded_over_none": ratio["seeded"]}
            rows.append(row)
            print(f"{name:>8} {checkpoint:>11} {row['none_ms']:>8.2f} {ratio['default']:>13.3f} "
                  f"{ratio['seeded']:>12.3f}")
    write_json(args.out, {"note": f"Two CPU workers, {args.threads} intra-op thread(s) each; ratios are medians of "
                                  "per-round ratios within this run.", "rows": rows},
               command=command_line(__file__, argv), machine={"threads_per_worker": args.threads})


if __name__ == "__main__":
    main()
