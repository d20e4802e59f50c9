"""How well the simulator predicts the executor on a GPU: predicted against measured makespan, CUDA devices.

The same experiment as ``benchmarks/fidelity.py`` (:func:`sim.calibration.experiment.run`), on CUDA devices: two
partitions on the GPUs there are (both on ``cuda:0`` when it is alone, then they issue to one stream:
``SimConfig.shared_streams``), every CUDA device asynchronous (``sim.core.device``, Note [asynchronous devices]).
The grid::

    model       wide: 8 x (Linear(4096), ReLU), batch 512, where the kernels outlast the host's work
                mlp:  fidelity.py's 64 x (Linear(64), ReLU), batch 64, where the host's work outlasts them
    chunks      1, 4, 16
    checkpoint  always, except_last, never

Run on a machine with a CUDA device (about four minutes on one H200; without one it prints "no CUDA
device: skipped" and exits 0)::

    python benchmarks/fidelity_cuda.py --out benchmarks/results/fidelity_cuda.json

No goal is held here: the CPU grid's goal is ``fidelity.py``'s. TF32 stays off (PyTorch's default).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from gpipe.schedule import CHECKPOINT_MODES, Checkpoint  # noqa: E402
from sim.calibration.experiment import Setup, run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import mlp_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "fidelity_cuda.json"
CHUNKS = (1, 4, 16)


def wide_model(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(4096, 4096), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(512, 4096)


MODELS = {"wide": (wide_model, (8, 8)), "mlp": (mlp_model, (64, 64))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON path (default: {RESULTS})")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--chunks", default=",".join(map(str, CHUNKS)))
    parser.add_argument("--checkpoints", default=",".join(CHECKPOINT_MODES))
    parser.add_argument("--steps", type=int, default=11, help="measured steps per row (default: 11)")
    parser.add_argument("--devices", default=None, help="two devices, e.g. cpu,cpu to try the script without a GPU")
    args = parser.parse_args(argv)
    if args.devices is None and not torch.cuda.is_available():
        print(f"no CUDA device: skipped (torch {torch.__version__}; nothing written)")
        return 0
    count = torch.cuda.device_count()
    devices = tuple(args.devices.split(",")) if args.devices else tuple(f"cuda:{k % count}" for k in range(2))
    names = [torch.cuda.get_device_name(k) for k in range(count)]
    print(f"{count} CUDA device(s): {', '.join(names)}; partitions on {', '.join(devices)}")
    print(f"{'model':>5} {'chunks':>6} {'checkpoint':>11} {'predicted ms':>13} {'measured ms':>12} {'error':>8} "
          f"{'paired':>8} {'order':>6} {'peak saved pred/meas MiB':>25}")
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    for name in [m for m in args.models.split(",") if m]:
        build, balance = MODELS[name]
        model, batch = build(0)
        for chunks in (int(c) for c in args.chunks.split(",") if c):
            for checkpoint in (cast(Checkpoint, c) for c in args.checkpoints.split(",") if c):
                setup = Setup(chunks=chunks, checkpoint=checkpoint, balance=balance, devices=devices,
                              steps=args.steps, seed=0)
                outcome = run(model, batch, setup)
                c = outcome.comparison
                peaks = [(outcome.predicted.peak_memory(d), outcome.measured.peak_memory(d)) for d in range(2)]
                rows.append({"model": name, "chunks": chunks, "checkpoint": checkpoint,
                             "predicted_ms": c.predicted_makespan * 1e3, "measured_ms": c.measured_makespan * 1e3,
                             "error": c.makespan_error, "paired_error": outcome.paired_error,
                             "order_agreement": c.order_agreement, "peak_saved_bytes": peaks,
                             "allocator_peak_bytes": outcome.measured.meta.get("allocator_peak_bytes"),
                             "step_ms": [m * 1e3 for m in outcome.step_makespans]})
                shown = " ".join(f"{p / 2**20:.1f}/{q / 2**20:.1f}" for p, q in peaks)
                print(f"{name:>5} {chunks:>6} {checkpoint:>11} {c.predicted_makespan * 1e3:>13.3f} "
                      f"{c.measured_makespan * 1e3:>12.3f} {c.makespan_error:>+8.1%} {outcome.paired_error:>+8.1%} "
                      f"{c.order_agreement:>6.0%} {shown:>25}", flush=True)
    errors = [abs(r["error"]) for r in rows]
    summary = {"mean_abs_error": statistics.mean(errors), "max_abs_error": max(errors),
               "per_model": {m: {"mean_abs_error": statistics.mean(abs(r["error"]) for r in rows if r["model"] == m),
                                 "max_abs_error": max(abs(r["error"]) for r in rows if r["model"] == m)}
                             for m in dict.fromkeys(r["model"] for r in rows)}}
    print(f"\nmean |error| {summary['mean_abs_error']:.2%}, max |error| {summary['max_abs_error']:.2%}; "
          f"{len(rows)} configurations in {time.perf_counter() - began:.0f} s")
    doc = {"benchmark": "fidelity_cuda", "command": "python benchmarks/fidelity_cuda.py " + " ".join(sys.argv[1:]),
           "machine": {"gpus": names, "torch": torch.__version__, "cuda": torch.version.cuda,
                       "python": platform.python_version()},
           "devices": list(devices), "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
