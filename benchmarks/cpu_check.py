"""Predicted from counts against the executor's measurement, on this machine's CPU (goal: within 10%).

The chain a buyer trusts on hardware they do not have, checked where it can run: this CPU's roofline is measured
(:func:`sim.planning.calibrate_device.calibrate_cpu`, one thread), each model is counted on the ``meta`` device,
each kernel timed by that roofline (:class:`sim.planning.costs_from_flops.FlopCosts`) and the step simulated; the
executor (:class:`gpipe.GPipe`, one CPU device, one thread) runs the same step on real tensors, and its best of
several steps is the measurement. Models: the demo's CNN (batch 64) and a small GPT (2 blocks, d_model 256, 128
tokens; no dropout and math attention, so the CPU runs the operators the count sees).

Run: ``.venv/bin/python benchmarks/cpu_check.py [--device cpu.json]`` (a minute); writes
``benchmarks/results/cpu_check.json``. On a machine shared with other work the measurement is noisy; the best
step of several is taken on both sides of the comparison (calibration and executor).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpipe import GPipe  # noqa: E402
from gpipe.schedule import gpipe  # noqa: E402
from sim.calibration.experiment import demo_model  # noqa: E402
from sim.core.config import SimConfig  # noqa: E402
from sim.core.engine import simulate  # noqa: E402
from sim.planning.calibrate_device import calibrate_cpu  # noqa: E402
from sim.planning.costs_from_flops import FlopCosts  # noqa: E402
from sim.planning.flops import count_layers  # noqa: E402
from sim.planning.hardware import DeviceSpec, get_link, load_device  # noqa: E402
from sim.planning.models.gpt import GPTConfig, gpt, gpt_sample  # noqa: E402

TOLERANCE = 0.10
STEPS = 7


def _measure(model: nn.Sequential, x: torch.Tensor, chunks: int) -> float:
    pipe = GPipe(model, [len(model)], devices=["cpu"], chunks=chunks, checkpoint="never")
    target = torch.zeros_like(model(x[:1]).detach()).expand(x.shape[0], *model(x[:1]).shape[1:]).contiguous()
    best = float("inf")
    for _ in range(STEPS):
        start = time.perf_counter()
        pipe.step(x, target, nn.functional.mse_loss)
        best = min(best, time.perf_counter() - start)
    return best


def _predict(model: nn.Sequential, x: torch.Tensor, chunks: int, device: DeviceSpec) -> float:
    costs = FlopCosts(count_layers(model, x), device, "fp32-sgd")
    size = x.shape[0] // chunks
    timeline = simulate(gpipe(chunks, 1, "never"), costs.cost_model((len(model),), size),
                        SimConfig(link=get_link("cpu-memcpy")))
    return timeline.makespan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="a saved calibration (gpipe-sim hardware --calibrate-cpu --out)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = load_device(args.device) if args.device else calibrate_cpu().device
    demo, demo_x = demo_model()
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=256, seq_len=128, vocab_size=1024, dropout=0.0)
    small_gpt = gpt(cfg)
    tokens = gpt_sample(cfg, 8, "cpu")
    cases = [("demo CNN", demo, demo_x, 1), ("demo CNN", demo, demo_x, 4),
             ("GPT 2x256", small_gpt, tokens, 1), ("GPT 2x256", small_gpt, tokens, 2)]
    rows: list[dict[str, Any]] = []
    print(f"{device.name}: {device.peak_flops['fp32'] / 1e9:.1f} GFLOP/s, {device.memory_bandwidth / 1e9:.1f} GB/s")
    print(f"{'model':<10} {'batch':>5} {'chunks':>6} {'measured':>10} {'predicted':>10} {'error':>7}")
    for name, model, x, chunks in cases:
        measured = _measure(model, x, chunks)
        predicted = _predict(model, x, chunks, device)
        error = predicted / measured - 1
        rows.append({"model": name, "batch": x.shape[0], "chunks": chunks, "measured_seconds": measured,
                     "predicted_seconds": predicted, "measured_throughput": x.shape[0] / measured,
                     "predicted_throughput": x.shape[0] / predicted, "error": error})
        print(f"{name:<10} {x.shape[0]:>5} {chunks:>6} {1e3 * measured:>7.1f} ms {1e3 * predicted:>7.1f} ms "
              f"{100 * error:>+6.1f}%")
    within = all(abs(r["error"]) <= TOLERANCE for r in rows)
    print(f"every step time within {TOLERANCE:.0%}: {'yes' if within else 'NO'}")
    out = Path(__file__).resolve().parent / "results" / "cpu_check.json"
    out.write_text(json.dumps({"device": device.to_dict(), "rows": rows, "within_tolerance": within,
                               "machine": platform.processor() or platform.machine()}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
