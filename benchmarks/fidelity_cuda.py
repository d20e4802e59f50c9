"""How well the simulator predicts the executor on a GPU: predicted against measured makespan, CUDA devices.

``benchmarks/fidelity.py``'s experiment on CUDA devices: two workers on the GPUs there are (both on ``cuda:0``, one
stream, when it is alone), every CUDA device asynchronous (Note [asynchronous devices] in ``sim.core.run``).
The grid (``--grid checks``: the part ``scripts/gpu-checks`` runs in a lease)::

    model       wide: 8 x (Linear(4096), ReLU), batch 512, where the kernels outlast the host's work
                mlp:  fidelity.py's 64 x (Linear(64), ReLU), batch 64, where the host's work outlasts them
                gpt:  8 GPT-2-small blocks (768 wide, 12 heads, 128 tokens), batch 32
    schedule    gpipe, 1f1b (--schedules: any registered name, Note [schedule axis] in _shared/fidelity.py)
    chunks      1, 4, 16, 32
    checkpoint  always, except_last, never

Each row keeps the per-task seconds (``tasks``: each stage's median CUDA-event span of ``F``, ``B``, ``R``, ``W``
against its seconds profiled alone, :func:`_shared.cuda_tasks.task_seconds`) and the GPU's clocks and power after
it; the JSON, rewritten after every row, has them before and after the grid too. ``--dry-run`` prints the grid and its
estimated GPU time on any machine (exit 2 past ``--budget``); a run leaves out rows that would end past ``--budget``
(``cut``). Without CUDA or ``--devices``: "no CUDA device: skipped", exit 0. TF32 off::

    python -m benchmarks.fidelity_cuda --grid checks --out benchmarks/results/fidelity_cuda.json
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from benchmarks._shared import fidelity, options
from benchmarks._shared.cuda_tasks import gpu_state, task_seconds
from benchmarks._shared.fidelity import mlp_model, stages_for
from benchmarks._shared.record import command_line, results_path, write_json
from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Checkpoint
from sim.calibration.experiment import Setup, run

RESULTS = results_path("fidelity_cuda")
CHUNKS = (1, 4, 16, 32)
SCHEDULE_AXIS = ("gpipe", "1f1b")
WORKERS = 2
STEPS = 11
BATCH = {"wide": 512, "mlp": 64, "gpt": 32}


def wide_model(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    """Compute-heavy: 8 x (Linear(4096, 4096), ReLU); input (512, 4096)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(4096, 4096), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(BATCH["wide"], 4096)


def gpt_model(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    """A GPT block stack: 8 pre-LayerNorm decoder blocks of GPT-2 small's width, no dropout; input (32, 128, 768)."""
    from sim.planning.counting.models.gpt import Block, GPTConfig

    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=8, n_head=12, d_model=768, seq_len=128, dropout=0.0, attention="sdpa")
    return nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)]), torch.randn(BATCH["gpt"], cfg.seq_len, 768)


MODELS: dict[str, Callable[[int], tuple[nn.Sequential, torch.Tensor]]] = {
    "wide": wide_model, "mlp": mlp_model, "gpt": gpt_model}


class Row(NamedTuple):
    model: str
    schedule: str
    chunks: int
    checkpoint: Checkpoint


def product(models: Sequence[str], schedules: Sequence[str], chunks: Sequence[int],
            checkpoints: Sequence[str]) -> list[Row]:
    return [Row(m, s, c, cast(Checkpoint, k)) for m, s, c, k in itertools.product(models, schedules, chunks,
                                                                                  checkpoints)]


#: ``scripts/gpu-checks``' part of the grid, about four minutes (:func:`estimate_seconds`): every chunk count and
#: policy on ``wide`` (the rows issue 26 is about), three schedules more on it, and the other two models
CHECKS = [*product(["wide"], ["gpipe"], [1, 4, 16, 32], ["except_last"]),
          *product(["wide"], ["gpipe"], [16], ["always", "never"]),
          *product(["wide"], ["1f1b", "interleaved-1f1b", "zb-h1"], [16], ["except_last"]),
          *product(["gpt"], ["gpipe"], [1, 8, 32], ["except_last"]),
          *product(["mlp"], ["gpipe"], [4], ["except_last"])]

# Note [GPU time estimate]: from the first H200 runs (benchmarks/results/fidelity_cuda_issue_seconds.log: 16 rows
# of 11 steps in about 300 s; measured steps of 10 + 4 ms per micro-batch for wide, 17.5 ms per micro-batch for
# mlp), a row costs its calibration and probes (ROW_SECONDS) plus, per warm-up and measured step, the step and
# the profiling pass after it (about a second step): (steps + 2) x 2 x step seconds. The gpt figures are a guess
# until a run measures them; every row's ``seconds`` is in the JSON to correct these.
START_SECONDS = 20.0  # torch import, CUDA context, first kernels
ROW_SECONDS = 16.0
STEP_SECONDS = {"wide": (0.010, 0.004), "mlp": (0.0, 0.0175), "gpt": (0.030, 0.005)}  # (base, per micro-batch)


def estimate_seconds(row: Row, steps: int = STEPS) -> float:
    """Note [GPU time estimate]: the seconds one row takes on one GPU, roughly."""
    base, per_microbatch = STEP_SECONDS[row.model]
    return ROW_SECONDS + (steps + 2) * 2 * (base + per_microbatch * row.chunks)


def refusal(row: Row) -> str | None:
    """Why the row's schedule cannot run it (Note [schedule axis] in _shared/fidelity.py), or ``None``."""
    stages = stages_for(row.schedule, WORKERS)
    return fidelity.refusal(row.schedule, row.chunks, stages, row.checkpoint, WORKERS, BATCH[row.model])


def even_balance(layers: int, stages: int) -> tuple[int, ...]:
    """``layers`` in ``stages`` runs as even as can be (the models repeat one layer, so even is balanced)."""
    return tuple(layers // stages + (1 if k < layers % stages else 0) for k in range(stages))


def measure(row: Row, model: nn.Sequential, batch: torch.Tensor, devices: tuple[str, ...],
            steps: int) -> dict[str, Any]:
    """One row: the experiment, its errors, its per-task seconds and the GPU's state after it."""
    began = time.perf_counter()
    balance = even_balance(len(model), stages_for(row.schedule, WORKERS))
    setup = Setup(chunks=row.chunks, checkpoint=row.checkpoint, schedule=row.schedule, balance=balance,
                  devices=devices, steps=steps, seed=0)
    outcome = run(model, batch, setup)
    c = outcome.comparison
    return {**row._asdict(), "balance": list(balance), "placement": list(outcome.schedule.placement),
            "predicted_ms": c.predicted_makespan * 1e3, "measured_ms": c.measured_makespan * 1e3,
            "error": c.makespan_error, "paired_error": outcome.paired_error, "order_agreement": c.order_agreement,
            "peak_saved_bytes": [(outcome.predicted.peak_memory(d), outcome.measured.peak_memory(d))
                                 for d in range(outcome.schedule.num_devices)],
            "allocator_peak_bytes": outcome.measured.meta.get("allocator_peak_bytes"),
            "step_ms": [m * 1e3 for m in outcome.step_makespans],
            "tasks": task_seconds(outcome.schedule, outcome.cost, outcome.measured, outcome.predicted),
            "gpu": gpu_state(), "seconds": time.perf_counter() - began}


def parse_grid(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[Row]:
    if args.grid == "checks":
        return list(CHECKS)
    models = [m for m in args.models.split(",") if m]
    schedules = [s for s in args.schedules.split(",") if s]
    checkpoints = [k for k in args.checkpoints.split(",") if k]
    for what, given, known in (("model", models, MODELS), ("schedule", schedules, SCHEDULES),
                               ("checkpoint", checkpoints, CHECKPOINT_MODES)):
        unknown = [x for x in given if x not in known]
        if unknown or not given:
            parser.error(f"unknown {what}(s) {', '.join(unknown) or '(none given)'}; use {', '.join(known)}")
    try:
        chunks = [int(c) for c in args.chunks.split(",") if c]
    except ValueError:
        parser.error(f"--chunks takes comma-separated integers, got {args.chunks!r}")
    if not chunks or min(chunks) < 1:
        parser.error(f"--chunks takes integers >= 1, got {args.chunks!r}")
    return product(models, schedules, chunks, checkpoints)


def main(argv: list[str] | None = None) -> int:
    parser = options.parser(__doc__)
    options.add_out(parser, RESULTS)
    parser.add_argument("--grid", choices=("full", "checks"), default="full",
                        help="full: the product of the axes below; checks: scripts/gpu-checks' part (axes ignored)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--schedules", default=",".join(SCHEDULE_AXIS), help="registered schedules, comma-separated")
    parser.add_argument("--chunks", default=",".join(map(str, CHUNKS)))
    parser.add_argument("--checkpoints", default=",".join(CHECKPOINT_MODES))
    parser.add_argument("--steps", type=int, default=STEPS, help=f"measured steps per row (default: {STEPS})")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the grid: a dry run refuses a longer estimate, a run leaves out rows past it")
    parser.add_argument("--dry-run", action="store_true", help="print the grid and its estimated GPU time, run nothing")
    parser.add_argument("--devices", default=None, help="two devices, e.g. cpu,cpu to try the script without a GPU")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    grid = parse_grid(args, parser)
    refused = {row: why for row in grid if (why := refusal(row)) is not None}
    rows = [row for row in grid if row not in refused]
    estimate = START_SECONDS + sum(estimate_seconds(row, args.steps) for row in rows)
    if args.dry_run:
        for row in grid:
            shown = f"skipped: {refused[row]}" if row in refused else f"~{estimate_seconds(row, args.steps):.0f} s"
            print(f"{row.model:>5} {row.schedule:>16} {row.chunks:>6} {row.checkpoint:>11}  {shown}")
        print(f"{len(rows)} rows to run, {len(refused)} skipped; estimated GPU time {estimate:.0f} s "
              f"({args.steps} steps a row; Note [GPU time estimate])")
    if args.dry_run and args.budget is not None and estimate > args.budget:
        parser.error(f"the grid is estimated at {estimate:.0f} s, over --budget {args.budget:.0f} s: run fewer rows "
                     "(--models, --schedules, --chunks, --checkpoints, --grid checks) or fewer --steps")
    if args.dry_run:
        return 0
    if args.devices is None and not torch.cuda.is_available():
        print(f"no CUDA device: skipped (torch {torch.__version__}; nothing written)")
        return 0
    return run_grid(args, rows, refused, command_line(__file__, argv))


def run_grid(args: argparse.Namespace, rows: list[Row], refused: dict[Row, str], command: str) -> int:
    """Run ``rows`` in order, writing the JSON after each; rows that would end past ``--budget`` are cut."""
    began = time.perf_counter()
    count = torch.cuda.device_count()
    devices = tuple(args.devices.split(",")) if args.devices else tuple(f"cuda:{k % count}" for k in range(WORKERS))
    names = [torch.cuda.get_device_name(k) for k in range(count)]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"{count} CUDA device(s): {', '.join(names) or 'none'}; workers on {', '.join(devices)}")
    print(f"{'model':>5} {'schedule':>16} {'chunks':>6} {'checkpoint':>11} {'predicted ms':>13} {'measured ms':>12} "
          f"{'error':>8} {'paired':>8} {'order':>6} {'measured/profiled':>18}")
    gpus = {"gpus": names, "cuda": torch.version.cuda}
    doc: dict[str, Any] = {
        "benchmark": "fidelity_cuda",
        "note": (f"Two workers on {', '.join(devices)}; {args.steps} measured steps a row, the step of median makespan "
                 "compared; error = (predicted - measured) / measured; tasks: per stage and kind of task, the median "
                 "measured (CUDA events) and predicted span against the seconds profiled alone; gpu: clocks, power "
                 "and temperature after the row (gpu_before, gpu_after: around the grid)."),
        "devices": list(devices), "steps": args.steps, "gpu_before": gpu_state(), "gpu_after": None,
        "skipped": [{**r._asdict(), "why": why} for r, why in refused.items()], "cut": [], "summary": None,
        "rows": []}
    built: dict[str, tuple[nn.Sequential, torch.Tensor]] = {}
    for row in rows:
        if args.budget is not None and time.perf_counter() - began + estimate_seconds(row, args.steps) > args.budget:
            doc["cut"].append(row._asdict())
            print(f"{row.model:>5} {row.schedule:>16} {row.chunks:>6} {row.checkpoint:>11} cut: past --budget")
            continue
        if row.model not in built:
            built[row.model] = MODELS[row.model](0)
        result = measure(row, *built[row.model], devices, args.steps)
        doc["rows"].append(result)
        ratios = [t["ratio"] for t in result["tasks"] if t["ratio"] is not None]
        shown = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
        print(f"{row.model:>5} {row.schedule:>16} {row.chunks:>6} {row.checkpoint:>11} {result['predicted_ms']:>13.3f} "
              f"{result['measured_ms']:>12.3f} {result['error']:>+8.1%} {result['paired_error']:>+8.1%} "
              f"{result['order_agreement']:>6.0%} {shown:>18}", flush=True)
        write_json(args.out, doc, command=command, machine=gpus)
    doc["gpu_after"] = gpu_state()
    if doc["rows"]:
        doc["summary"] = summary(doc["rows"])
        print(f"\nmean |error| {doc['summary']['mean_abs_error']:.2%}, max |error| "
              f"{doc['summary']['max_abs_error']:.2%}; {len(doc['rows'])} rows in {time.perf_counter() - began:.0f} s")
    write_json(args.out, doc, command=command, machine=gpus)
    print(f"wrote {args.out}")
    return 0


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and max |error| overall and per model and per schedule."""
    def of(part: list[dict[str, Any]]) -> dict[str, float]:
        return fidelity.summary(part, ("error",))

    return {**of(rows),
            "per_model": {m: of([r for r in rows if r["model"] == m]) for m in dict.fromkeys(r["model"] for r in rows)},
            "per_schedule": {s: of([r for r in rows if r["schedule"] == s])
                             for s in dict.fromkeys(r["schedule"] for r in rows)}}


if __name__ == "__main__":
    raise SystemExit(main())
