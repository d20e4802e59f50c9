"""Predicted against published: torchgpipe's ResNet-101 speed benchmark on Tesla P40s, and GPT memory.

Speed. torchgpipe (Kim et al., 2020; ``benchmarks/resnet101-speed``) trains ResNet-101 on fake
3x224x224 images for epochs of 50,000 samples on 8 Tesla P40s (PyTorch 1.3, CUDA 10.1) and reports
throughput. Here every experiment is predicted from FLOP and byte counts (:mod:`sim.flops`) divided by
the catalog's P40 (:mod:`sim.hardware`), simulated (:mod:`sim.engine`) with the same batch, chunks,
balance and checkpointing (``except_last``), over PCIe 3.0 x16, with plain SGD. Calibration: ONE
device parameter, the P40's compute efficiency, is solved so that the single-GPU baseline matches
its 95.862 samples/s; the pipeline speed-ups are then predictions, nothing is fitted per experiment.
An epoch is modelled as the benchmark runs it: full batches and a smaller last one, each split by
``torch.chunk`` semantics (chunks of ``ceil(batch / chunks)`` samples).

Memory. For each GPT-3 size: model-state bytes per parameter under mixed-precision Adam (the usual
16 to 18), and the bytes one block saves for backward against Korthikanti et al. (2022),
``s·b·h·(34 + 5·a·s/h)`` without recomputation (b = 1, s = 2048).

Run: ``.venv/bin/python benchmarks/published.py`` (about a minute); writes
``benchmarks/results/published.json``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpipe.schedule import gpipe  # noqa: E402
from sim.costs_from_flops import FlopCosts, training_policy  # noqa: E402
from sim.engine import SimConfig, simulate  # noqa: E402
from sim.flops import ModelProfile, count_layers  # noqa: E402
from sim.hardware import DeviceSpec, get_device, get_link  # noqa: E402
from sim.models.gpt import CONFIGS, gpt, gpt_sample  # noqa: E402
from sim.models.resnet import resnet101, resnet_sample  # noqa: E402

DATASET = 50_000  # samples per epoch in torchgpipe's benchmark
BASELINE = 95.862  # samples/s, one P40, batch 118, no pipeline
#: (name, batch, chunks, balance, published speed-up); torchgpipe benchmarks/resnet101-speed/README.md
EXPERIMENTS: list[tuple[str, int, int, tuple[int, ...], float]] = [
    ("pipeline-1", 220, 2, (370,), 0.853),
    ("pipeline-2", 25000, 1667, (135, 235), 1.414),
    ("pipeline-4", 5632, 256, (44, 92, 124, 110), 2.774),
    ("pipeline-8", 5400, 150, (26, 22, 33, 44, 44, 66, 66, 69), 4.294),
]
TOLERANCE = 0.10  # the goal: every speed-up within 10%


def _step_seconds(costs: FlopCosts, balance: tuple[int, ...], batch: int, chunks: int, config: SimConfig) -> float:
    """One training step of ``batch`` samples: the simulated pipeline plus the optimizer step."""
    size = math.ceil(batch / chunks)  # torch.chunk: equal chunks of ceil(batch / chunks), fewer if it runs out
    m = math.ceil(batch / size)
    last = batch - size * (m - 1)
    scale = [1.0] * (m - 1) + [last / size] if last != size else []
    schedule = gpipe(m, len(balance), "except_last")  # torchgpipe's default; m = 1 checkpoints nothing
    timeline = simulate(schedule, costs.cost_model(balance, size, scale), config)
    return timeline.makespan + max(costs.update_seconds(balance))


def _epoch_throughput(costs: FlopCosts, balance: tuple[int, ...], batch: int, chunks: int, config: SimConfig) -> float:
    full, rest = divmod(DATASET, batch)
    seconds = full * _step_seconds(costs, balance, batch, chunks, config)
    if rest:
        seconds += _step_seconds(costs, balance, rest, chunks, config)
    return DATASET / seconds


def _calibrate(profile: ModelProfile, p40: DeviceSpec, config: SimConfig) -> float:
    """The P40 efficiency at which the baseline (batch 118, one GPU, no pipeline) gives 95.862 samples/s."""
    lo, hi = 0.01, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        costs = FlopCosts(profile, replace(p40, efficiency=mid), training_policy("fp32-sgd"))
        if _epoch_throughput(costs, (len(profile),), 118, 1, config) < BASELINE:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def resnet_table() -> dict[str, Any]:
    """Predict every experiment; return the rows and the calibrated efficiency."""
    with torch.device("meta"):
        model = resnet101()
    profile = count_layers(model, resnet_sample(2))
    p40 = get_device("tesla-p40")
    config = SimConfig(link=get_link("pcie3-x16"))
    efficiency = _calibrate(profile, p40, config)
    costs = FlopCosts(profile, replace(p40, efficiency=efficiency), training_policy("fp32-sgd"))
    base = _epoch_throughput(costs, (len(profile),), 118, 1, config)
    rows = [{"experiment": "baseline", "batch": 118, "chunks": 1, "balance": [370],
             "published_throughput": BASELINE, "predicted_throughput": base,
             "published_speedup": 1.0, "predicted_speedup": base / BASELINE, "error": base / BASELINE - 1}]
    for name, batch, chunks, balance, speedup in EXPERIMENTS:
        thr = _epoch_throughput(costs, balance, batch, chunks, config)
        rows.append({"experiment": name, "batch": batch, "chunks": chunks, "balance": list(balance),
                     "published_throughput": speedup * BASELINE, "predicted_throughput": thr,
                     "published_speedup": speedup, "predicted_speedup": thr / base,
                     "error": (thr / base) / speedup - 1})
    return {"device": p40.name, "link": "pcie3-x16", "training": "fp32-sgd", "calibrated_efficiency": efficiency,
            "forward_gflop_per_sample": sum(c.forward_flops for c in profile.at(1)) / 1e9,
            "backward_gflop_per_sample": sum(c.backward_flops for c in profile.at(1)) / 1e9,
            "rows": rows, "within_tolerance": all(abs(r["error"]) <= TOLERANCE for r in rows)}


def gpt_memory_table() -> list[dict[str, Any]]:
    """Model-state bytes per parameter and one block's saved bytes against Korthikanti et al. (2022)."""
    training = training_policy("fp16-adam")
    out = []
    for name, cfg in CONFIGS.items():
        with torch.device("meta"):
            model = gpt(cfg)
        profile = count_layers(model, gpt_sample(cfg, 1), dtype=training.torch_dtype)
        costs = FlopCosts(profile, get_device("a100-80gb"), training)
        stage = costs.stages((len(profile),), 1)[0]
        s, b, h, a = cfg.seq_len, 1, cfg.d_model, cfg.n_head
        formula = s * b * h * (34 + 5 * a * s / h)
        block = profile.layers[1].at(b)
        out.append({"model": f"gpt:{name}", "parameters": profile.parameters,
                    "model_state_bytes_per_parameter": stage.model_state_bytes / profile.parameters,
                    "block_saved_bytes": block.saved_bytes, "korthikanti_bytes": formula,
                    "activation_error": block.saved_bytes / formula - 1})
    return out


def main() -> int:
    start = time.perf_counter()
    speed = resnet_table()
    print(f"ResNet-101 on Tesla P40s (torchgpipe), predicted from FLOPs; calibrated P40 efficiency "
          f"{speed['calibrated_efficiency']:.3f} (from the baseline only)")
    print(f"{'experiment':<11} {'batch':>6} {'chunks':>6}  {'published':>16} {'predicted':>16} {'error':>7}")
    for r in speed["rows"]:
        print(f"{r['experiment']:<11} {r['batch']:>6} {r['chunks']:>6}  "
              f"{r['published_throughput']:>7.1f}/s {r['published_speedup']:>6.3f}x "
              f"{r['predicted_throughput']:>7.1f}/s {r['predicted_speedup']:>6.3f}x {100 * r['error']:>+6.1f}%")
    print(f"every speed-up within {TOLERANCE:.0%}: {'yes' if speed['within_tolerance'] else 'NO'}")
    memory = gpt_memory_table()
    print("\nGPT-3 sizes, mixed-precision Adam (fp16): model state and one block's saved activations (b=1, s=2048)")
    print(f"{'model':<10} {'params':>9} {'bytes/param':>11} {'counted MB':>11} {'Korthikanti MB':>14} {'error':>8}")
    for r in memory:
        print(f"{r['model']:<10} {r['parameters'] / 1e9:>8.2f}B {r['model_state_bytes_per_parameter']:>11.1f} "
              f"{r['block_saved_bytes'] / 1e6:>11.1f} {r['korthikanti_bytes'] / 1e6:>14.1f} "
              f"{100 * r['activation_error']:>+7.3f}%")
    out = Path(__file__).resolve().parent / "results" / "published.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"resnet101_speed": speed, "gpt_memory": memory,
                               "seconds": time.perf_counter() - start}, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
