"""What the executor's switch interval buys: GPipe steps with Python's default 5 ms against 1 ms, in one run.

Two CPU devices, each worker pinned to a core of its own, one intra-op thread per worker (``OMP_NUM_THREADS=1``
before torch loads and ``torch.set_num_threads(1)``, on purpose: two workers on two cores; Note [threads] in
``_shared/machine.py``). Three models: fidelity.py's ``mlp``, 64 x (Linear(64, 64), ReLU), many small layers whose
tasks are mostly Python (a saved-tensor hook per saved tensor while recording), and ``conv``, its ten 3x3
convolutions, mostly C++, both at batch 64, chunks 2, 4, 8 and 16; and ``wide``, executor_speed.py's wider model, 8 x
(Linear(2048), ReLU) at batch 256, chunks 4 and 8, whose tasks are tens of milliseconds of GEMMs. Recording on
(as ``gpipe-sim demo`` runs it), checkpoint ``always``, ``except_last`` and ``never``. For each configuration,
two pipelines of the same model, one with ``switch_interval=None`` (the interpreter's 5 ms) and one with
``switch_interval=0.001``, take steps in turn (Note [interleaving] in ``_shared/rounds.py``); a row's ratio is
the median of the per-round ratios (1 ms step / 5 ms step), which a machine whose speed drifts distorts far
less than a ratio of medians.

Finding: a 1 ms interval speeds the small-layer model and costs the others nothing measurable, so
``GPipe(switch_interval=0.001)`` stays the default (Note [switch interval] in :mod:`gpipe.interpreter.gil`;
docs/benchmarks.md, "Switch interval").

Run: ``.venv/bin/python -m benchmarks.investigations.switch_interval`` (about eight minutes on two busy cores); writes
``benchmarks/results/switch_interval.json``.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from benchmarks._shared.machine import load_average, omp_threads, set_threads

omp_threads()  # before torch loads: see the module docstring

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks._shared import options  # noqa: E402
from benchmarks._shared.fidelity import conv_model, mlp_model  # noqa: E402
from benchmarks._shared.record import command_line, results_path, write_json  # noqa: E402
from gpipe import GPipe  # noqa: E402
from gpipe.schedule import CHECKPOINT_MODES  # noqa: E402
from sim.calibration.machine import keep_freed_memory, worker_affinity  # noqa: E402

RESULTS = results_path("switch_interval")
DEVICES = ("cpu", "cpu")
WIDE_BATCH, WIDE_WIDTH = 256, 2048


def wide_model(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    """executor_speed.py's wider model: 8 x (Linear(2048), ReLU), a batch of 256 rows."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(WIDE_WIDTH, WIDE_WIDTH), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(WIDE_BATCH, WIDE_WIDTH)


#: per model: the balance (fidelity.py's mlp cut in half, conv where balance_by_time cut it in fidelity.py's runs
#: here, wide cut in half), how to build it, and its chunk counts (wide's steps take 0.3-1 s: two of them)
MODELS: dict[str, tuple[tuple[int, int], Any, tuple[int, ...]]] = {
    "mlp": ((64, 64), mlp_model, (2, 4, 8, 16)), "conv": ((6, 16), conv_model, (2, 4, 8, 16)),
    "wide": ((8, 8), wide_model, (4, 8))}


def main(argv: list[str] | None = None) -> int:
    parser = options.parser(__doc__)
    options.add_out(parser, RESULTS)
    parser.add_argument("--rounds", type=int, default=15, help="timed steps of each pipeline per row (default: 15)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--chunks", default="", help="chunk counts for every model (default: each model's own)")
    args = parser.parse_args(argv)
    set_threads(1)  # deliberately: see the module docstring
    keep_freed_memory()
    sys.setswitchinterval(0.005)  # the interpreter's default, for the pipelines that leave it alone
    affinity = worker_affinity(DEVICES)
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    load = [load_average()]  # the machine's 1-minute load at the start and the end: how quiet the run was
    print(f"{'model':>5} {'chunks':>6} {'checkpoint':>11} {'5 ms step':>10} {'1 ms step':>10} {'ratio':>7}")
    for name in [m for m in args.models.split(",") if m]:
        balance, build, counts = MODELS[name]
        model, x = build(0)
        for chunks in ([int(c) for c in args.chunks.split(",") if c] or counts):
            for checkpoint in CHECKPOINT_MODES:
                pipes = [GPipe(model, list(balance), devices=list(DEVICES), chunks=chunks, checkpoint=checkpoint,
                               record=True, cpu_affinity=affinity, switch_interval=s) for s in (None, 0.001)]
                times: list[list[float]] = [[], []]
                for k in range(2 + args.rounds):  # two warm-up rounds; the starting pipeline alternates
                    for which in ((0, 1) if k % 2 == 0 else (1, 0)):
                        tick = time.perf_counter()
                        pipes[which](x).square().mean().backward()
                        seconds = time.perf_counter() - tick
                        model.zero_grad(set_to_none=True)
                        if k >= 2:
                            times[which].append(seconds)
                ratio = statistics.median(b / a for a, b in zip(*times, strict=True))
                row = {"model": name, "chunks": chunks, "checkpoint": checkpoint,
                       "default_ms": statistics.median(times[0]) * 1e3, "short_ms": statistics.median(times[1]) * 1e3,
                       "ratio": ratio, "default_samples_ms": [t * 1e3 for t in times[0]],
                       "short_samples_ms": [t * 1e3 for t in times[1]]}
                rows.append(row)
                print(f"{name:>5} {chunks:>6} {checkpoint:>11} {row['default_ms']:>10.2f} {row['short_ms']:>10.2f} "
                      f"{ratio:>7.3f}", flush=True)
    doc = {"benchmark": "switch_interval",
           "note": ("ratio = median over rounds of (step with switch_interval=0.001) / (step with the interpreter's "
                    "5 ms), both pipelines stepping in turn in one process; two CPU devices, workers pinned, "
                    "recording on, batch 64 (wide: 256); a step is forward, loss and backward."),
           "rows": rows, "summary": summary(rows), "seconds": time.perf_counter() - began}
    write_json(args.out, doc, command=command_line(__file__, argv),
               machine={"intra-op threads per worker": 1, "load_average_1min": [*load, load_average()]})
    print(f"wrote {args.out} in {doc['seconds']:.0f} s")
    return 0


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per model, the median, lowest and highest of its rows' ratios (1 ms step / 5 ms step)."""
    out = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        ratios = [r["ratio"] for r in rows if r["model"] == name]
        out[name] = {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
                     "rows": len(ratios)}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
