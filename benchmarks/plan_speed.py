"""How fast the planner sweeps: GPT-3 1.3B on H100s, every registered schedule (goal: 1,000 configurations < 10 s).

The sweep is the planner's default over schedules (every registered one, several stages per device where a schedule
has a layout): every GPU count from 1 to 8, each pipeline depth that divides it, chunks 4, 8 and 16, checkpointing
never or except_last; about 1,200 configurations, each balanced, simulated and checked for memory. Counting the
model on the meta device happens once, before, and is timed apart. One process, one thread (the planner is pure
Python).

Run: ``.venv/bin/python benchmarks/plan_speed.py``; writes ``benchmarks/results/plan_speed.json``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections import Counter
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
    result = plan(profile, 512, device, list(range(1, 9)), "nvlink", training=training, chunks=[4, 8, 16],
                  checkpoints=["never", "except_last"], model_name=spec.name)
    swept = time.perf_counter() - start
    n = len(result.rows)
    best = result.best
    print(f"{spec.name} on {device.name}: counted {len(profile)} layers in {counted:.2f} s")
    per_schedule = dict(sorted(Counter(r.schedule for r in result.rows).items()))
    print(f"swept {n} configurations in {swept:.2f} s ({n / swept:.0f} configurations/s, "
          f"{1e3 * swept / n:.2f} ms each); goal: 1,000 in under {GOAL_SECONDS:.0f} s: "
          f"{'yes' if n >= 1000 and swept < GOAL_SECONDS else 'NO'}")
    print("configurations per schedule: " + ", ".join(f"{k} {v}" for k, v in per_schedule.items()))
    if best is not None:
        print(f"best: {best.gpus} GPUs, {best.stages} stages x {best.replicas} replicas, {best.chunks} chunks, "
              f"{best.schedule}, checkpoint {best.checkpoint}: {best.throughput:.1f} samples/s")
    out = Path(__file__).resolve().parent / "results" / "plan_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": spec.name, "device": device.name, "configurations": n,
                               "count_seconds": counted, "sweep_seconds": swept,
                               "configurations_per_second": n / swept, "per_schedule": per_schedule,
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "goal_seconds": GOAL_SECONDS,
                               "python": platform.python_version(), "machine": platform.machine()}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
