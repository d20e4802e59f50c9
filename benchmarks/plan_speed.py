"""How fast the planner sweeps: a 1,000-configuration sweep of GPT-3 1.3B on H100s (goal: under 10 s).

The sweep: every GPU count from 1 to 16, each pipeline depth that divides it (50 pairs of stages x
replicas), chunks 1, 2, 4, 8, 16, checkpointing never or except_last, GPipe and 1F1B: 50 x 5 x 2 x 2
= 1,000 configurations, each balanced, simulated and checked for memory. Counting the model on the
meta device happens once, before, and is timed apart.

Run: ``.venv/bin/python benchmarks/plan_speed.py``; writes ``benchmarks/results/plan_speed.json``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.planning.flops import count_layers  # noqa: E402
from sim.planning.hardware import get_device  # noqa: E402
from sim.planning.models import get_model  # noqa: E402
from sim.planning.plan import default_training, plan  # noqa: E402

GOAL_SECONDS = 10.0


def main() -> int:
    device = get_device("h100-sxm")
    training = default_training(device)
    spec = get_model("gpt:1.3b")
    start = time.perf_counter()
    profile = count_layers(spec.module(), spec.sample(2), dtype=training.torch_dtype)
    counted = time.perf_counter() - start
    start = time.perf_counter()
    result = plan(profile, 512, device, list(range(1, 17)), "nvlink", training=training, chunks=[1, 2, 4, 8, 16],
                  checkpoints=["never", "except_last"], schedules=["gpipe", "1f1b"], model_name=spec.name)
    swept = time.perf_counter() - start
    n = len(result.rows)
    best = result.best
    print(f"{spec.name} on {device.name}: counted {len(profile)} layers in {counted:.2f} s")
    print(f"swept {n} configurations in {swept:.2f} s ({n / swept:.0f} configurations/s, "
          f"{1e3 * swept / n:.2f} ms each); goal: 1,000 in under {GOAL_SECONDS:.0f} s: "
          f"{'yes' if n >= 1000 and swept < GOAL_SECONDS else 'NO'}")
    if best is not None:
        print(f"best: {best.gpus} GPUs, {best.stages} stages x {best.replicas} replicas, {best.chunks} chunks, "
              f"{best.schedule}, checkpoint {best.checkpoint}: {best.throughput:.1f} samples/s")
    out = Path(__file__).resolve().parent / "results" / "plan_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": spec.name, "device": device.name, "configurations": n,
                               "count_seconds": counted, "sweep_seconds": swept,
                               "configurations_per_second": n / swept, "goal_seconds": GOAL_SECONDS,
                               "python": platform.python_version(), "machine": platform.machine()}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
