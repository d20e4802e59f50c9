"""Predicted against published: torchgpipe's ResNet-101 speed benchmark on Tesla P40s, and GPT memory.

Speed. torchgpipe (Kim et al., 2020; ``benchmarks/resnet101-speed``) trains ResNet-101 on fake
3x224x224 images for epochs of 50,000 samples on 8 Tesla P40s (PyTorch 1.3, CUDA 10.1) and reports
throughput. Here every experiment is predicted from FLOP and byte counts (:mod:`sim.planning.counting.flops`) divided by
the catalog's P40 (:mod:`sim.planning.hardware.catalog`), simulated (:mod:`sim.core.engine`) with the same batch,
chunks, balance and checkpointing (``except_last``, torchgpipe's default, which the benchmark keeps), over
PCIe 3.0 x16, with plain SGD. Each kernel is timed by the catalog P40's roofline
(:mod:`sim.planning.hardware.roofline`): its convolution fraction was solved ONCE from the single-GPU baseline
(95.862 samples/s) and is fixed in the catalog for every model (Note [roofline sources] in
:mod:`sim.planning.hardware.catalog`); nothing is solved here, and the speed-ups are predictions. An epoch is
modelled as the benchmark runs it: full batches and a smaller last one, each split by ``torch.chunk``
semantics (chunks of ``ceil(batch / chunks)`` samples).

Two diagnostics are printed beside the prediction, neither fitted: the prediction at the balance the
model itself finds best (the published balances were tuned on P40s, see Note [what the errors say]),
and the errors under other values of the model's a-priori assumptions (datasheet bandwidth instead of
Note [one efficiency] of :mod:`sim.planning.costs.from_flops`; a fixed kernel cost of 0 or 10 microseconds
instead of 5), so the reader sees how much each assumption moves the answer.

Note [what the errors say]: with the published balances the model predicts pipeline-2 and pipeline-4
4-6% low and pipeline-8 8% high (all within the 10% goal). What each candidate cause contributes:

- Copies do not matter here. The largest activation crossing a boundary (pipeline-8, after the
  second bottleneck: 36 x 3.2 MB) takes 7.4 ms over PCIe 3.0 x16, against about 20 ms of forward per
  micro-batch on its stage, and torchgpipe copies on copy streams, so copies overlap compute: at half
  the bandwidth (7.9 GB/s, as peer copies staged through host memory might get) no prediction moves
  by more than half a point; only near 4 GB/s do the copies of pipeline-8 reach its critical path.
- Checkpointing is modelled as torchgpipe ran it (``except_last``: every micro-batch but the last
  recomputes its forward right before its backward), and pipeline-1, which recomputes one of its two
  micro-batches, is predicted within 1%.
- Small micro-batches (15 and 22 samples) cost through the fixed cost per kernel; the sensitivity
  rows show that 0 or 10 microseconds instead of 5 moves pipeline-2 by about 4.5 points either way,
  the larger micro-batches of pipeline-4 and pipeline-8 less, all in the same direction: no value of
  it removes both the under-prediction at 2 and 4 GPUs and the over-prediction at 8.
- The balance is what is left. torchgpipe tuned every setting for the P40 ("every experiment setting
  is optimized for Tesla P40 GPUs"), so on the P40 the published balances made the stages nearly
  equal; under the model they are not: its heaviest stage carries 52%, 27% and 15% of the time
  (equal: 50%, 25%, 12.5%), and the split it finds best gives more layers to the early stages
  ([143, 227] for [135, 235]). Run at its own best balances the model predicts pipeline-2 and
  pipeline-4 within about 2%: its throughput physics (micro-batch size, recompute, bubble, copies) holds,
  and its share of time per layer does not quite: the early, high-resolution layers cost more on a
  P40, relative to the late ones, than FLOPs and bytes through one roofline say. Two corrections with
  a physical cause are in the counts (:mod:`sim.planning.counting.operators`, Note [one operator, several kernels]:
  batch norm's second pass over its input, convolution backward as its separate kernels); they moved
  pipeline-2 from -6.3% to -4.5% and pipeline-4 from -8.1% to -6.3%. What is left depends on the shape
  of each cuDNN kernel (its algorithm, Winograd or implicit GEMM, which the benchmark let cuDNN's
  heuristics pick; the efficiency of narrow 64-channel GEMMs; L2 hits on the small late-layer tensors
  at small micro-batches), which a FLOP count cannot see; :mod:`sim.calibration.calibrate` measures it.
- pipeline-8 falls short of what the model can explain: the published 4.294x is 72% of the 6x that eight
  perfectly balanced checkpointed stages could reach (8 x (F + B) / (F + R + B) = 8 x 3/4), the model
  predicts 77% at the published balance and 89% at its own. Nothing in the model grows with the number
  of GPUs except the bubble, the copies and the imbalance, which it has; what a real 8-GPU server adds
  is not modelled: in a typical 8-GPU PCIe server half the GPUs sit behind the other CPU socket (peer
  copies staged through host memory, contending with each other),
  eight worker threads and the autograd threads sharing one Python interpreter, and a balance tuned by
  hand on hardware whose per-layer times the model does not reproduce exactly (previous point).

Memory. For each GPT-3 size: model-state bytes per parameter under mixed-precision Adam (the usual
16 to 18), and the bytes one block saves for backward against Korthikanti et al. (2022),
``s·b·h·(34 + 5·a·s/h)`` without recomputation (b = 1, s = 2048).

Run: ``.venv/bin/python -m benchmarks.published`` (under a minute); writes
``benchmarks/results/published.json``.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from benchmarks._shared.options import add_out, parser
from benchmarks._shared.record import command_line, results_path, write_json
from gpipe.schedule import gpipe
from sim.core.config import SimConfig
from sim.core.engine import simulate
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import ModelProfile, count_layers
from sim.planning.counting.models.gpt import CONFIGS, gpt, gpt_sample
from sim.planning.counting.models.resnet import resnet101, resnet_sample
from sim.planning.counting.training import training_policy
from sim.planning.hardware.catalog import DeviceSpec, get_device, get_link
from sim.planning.plan import block_partition

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


#: Other values of the model's a-priori assumptions, to show how much each moves the answer.
SENSITIVITY: dict[str, dict[str, float]] = {
    "datasheet bandwidth": {"memory_efficiency": 1.0},
    "half_dim 0": {"half_dim": 0.0},
    "half_dim 32": {"half_dim": 32.0},
    "kernel 0 us": {"kernel_seconds": 0.0},
    "kernel 10 us": {"kernel_seconds": 10e-6},
}


def _costs(profile: ModelProfile, p40: DeviceSpec, **options: float) -> FlopCosts:
    half_dim = options.pop("half_dim", None)
    if half_dim is not None and p40.roofline is not None:
        p40 = replace(p40, roofline=replace(p40.roofline, half_dim=half_dim))
    return FlopCosts(profile, p40, training_policy("fp32-sgd"), **options)


def _best_balance(costs: FlopCosts, stages: int, microbatch: int) -> tuple[int, ...]:
    """The balance that minimises the model's heaviest stage (F + R + B per checkpointed micro-batch)."""
    forward, backward = costs.layer_seconds(microbatch)
    return block_partition(2 * forward + backward, stages)


def _heaviest_share(costs: FlopCosts, balance: tuple[int, ...], microbatch: int) -> float:
    forward, backward = costs.layer_seconds(microbatch)
    bounds = np.cumsum([0, *balance])
    per_stage = [float((2 * forward + backward)[a:b].sum()) for a, b in itertools.pairwise(bounds)]
    return max(per_stage) / sum(per_stage)


def _predict(profile: ModelProfile, p40: DeviceSpec, config: SimConfig, **options: float
             ) -> tuple[float, float, list[float]]:
    """The P40's convolution fraction (set once, in the catalog), baseline throughput and each predicted speed-up."""
    costs = _costs(profile, p40, **options)
    base = _epoch_throughput(costs, (len(profile),), 118, 1, config)
    assert p40.roofline is not None
    return p40.roofline.convolution["fp32"], base, [_epoch_throughput(costs, balance, batch, chunks, config) / base
                              for _, batch, chunks, balance, _ in EXPERIMENTS]


def resnet_table() -> dict[str, Any]:
    """Predict every experiment; return the rows, the calibrated efficiency and the diagnostics."""
    with torch.device("meta"):
        model = resnet101()
    profile = count_layers(model, resnet_sample(2))
    p40 = get_device("tesla-p40")
    config = SimConfig(link=get_link("pcie3-x16"))
    efficiency, base, speedups = _predict(profile, p40, config)
    costs = _costs(profile, p40)
    rows = [{"experiment": "baseline", "batch": 118, "chunks": 1, "balance": [370],
             "published_throughput": BASELINE, "predicted_throughput": base,
             "published_speedup": 1.0, "predicted_speedup": 1.0, "error": base / BASELINE - 1}]
    for (name, batch, chunks, balance, speedup), predicted in zip(EXPERIMENTS, speedups, strict=True):
        microbatch = math.ceil(batch / chunks)
        best = _best_balance(costs, len(balance), microbatch)
        at_best = _epoch_throughput(costs, best, batch, chunks, config) / base
        rows.append({"experiment": name, "batch": batch, "chunks": chunks, "balance": list(balance),
                     "published_throughput": speedup * BASELINE, "predicted_throughput": predicted * base,
                     "published_speedup": speedup, "predicted_speedup": predicted,
                     "error": predicted / speedup - 1,
                     "heaviest_stage_share": _heaviest_share(costs, balance, microbatch),
                     "model_balance": list(best), "predicted_speedup_at_model_balance": at_best,
                     "error_at_model_balance": at_best / speedup - 1})
    sensitivity = []
    for variant, options in SENSITIVITY.items():
        eff, _, alt = _predict(profile, p40, config, **options)
        sensitivity.append({"variant": variant, "calibrated_efficiency": eff,
                            "errors": {name: s / published - 1
                                       for (name, *_, published), s in zip(EXPERIMENTS, alt, strict=True)}})
    return {"device": p40.name, "link": "pcie3-x16", "training": "fp32-sgd", "calibrated_efficiency": efficiency,
            "forward_gflop_per_sample": sum(c.forward_flops for c in profile.at(1)) / 1e9,
            "backward_gflop_per_sample": sum(c.backward_flops for c in profile.at(1)) / 1e9,
            "rows": rows, "within_tolerance": all(abs(r["error"]) <= TOLERANCE for r in rows),
            "sensitivity": sensitivity}


def gpt_memory_table() -> list[dict[str, Any]]:
    """Model-state bytes per parameter and one block's saved bytes against Korthikanti et al. (2022), whose count is of
    the math attention (the config's default form, not a spec's)."""
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
        out.append({"model": f"gpt:{name},kernels=eager,attention=math", "parameters": profile.parameters,
                    "model_state_bytes_per_parameter": stage.model_state_bytes / profile.parameters,
                    "block_saved_bytes": block.saved_bytes, "korthikanti_bytes": formula,
                    "activation_error": block.saved_bytes / formula - 1})
    return out


def main(argv: list[str] | None = None) -> int:
    flags = parser(__doc__)
    add_out(flags, results_path("published"))
    args = flags.parse_args(argv)
    start = time.perf_counter()
    speed = resnet_table()
    print(f"ResNet-101 on Tesla P40s (torchgpipe), predicted per kernel from the catalog's P40 roofline "
          f"(convolution fraction {speed['calibrated_efficiency']:.3f}, set once; Note [roofline sources])")
    print(f"{'experiment':<11} {'batch':>6} {'chunks':>6}  {'published':>16} {'predicted':>16} {'error':>7}")
    for r in speed["rows"]:
        print(f"{r['experiment']:<11} {r['batch']:>6} {r['chunks']:>6}  "
              f"{r['published_throughput']:>7.1f}/s {r['published_speedup']:>6.3f}x "
              f"{r['predicted_throughput']:>7.1f}/s {r['predicted_speedup']:>6.3f}x {100 * r['error']:>+6.1f}%")
    print(f"every speed-up within {TOLERANCE:.0%}: {'yes' if speed['within_tolerance'] else 'NO'}")
    print("\nDiagnostics (not fitted; see Note [what the errors say] in this file's docstring)")
    print(f"{'experiment':<11} {'heaviest stage (equal)':>22}  {'model-best balance':<34} "
          f"{'predicted':>9} {'error':>7}")
    for r in speed["rows"][1:]:
        ideal = 1 / len(r["balance"])
        print(f"{r['experiment']:<11} {r['heaviest_stage_share']:>13.1%} ({ideal:>6.1%})  "
              f"{str(r['model_balance']):<34} {r['predicted_speedup_at_model_balance']:>8.3f}x "
              f"{100 * r['error_at_model_balance']:>+6.1f}%")
    names = [name for name, *_ in EXPERIMENTS]
    print(f"\n{'assumption changed':<20} {'efficiency':>10} " + " ".join(f"{n:>11}" for n in names))
    print(f"{'(none)':<20} {speed['calibrated_efficiency']:>10.3f} "
          + " ".join(f"{100 * r['error']:>+10.1f}%" for r in speed["rows"][1:]))
    for v in speed["sensitivity"]:
        print(f"{v['variant']:<20} {v['calibrated_efficiency']:>10.3f} "
              + " ".join(f"{100 * v['errors'][n]:>+10.1f}%" for n in names))
    print("The published balances were tuned on P40s; at its own best balance the model is within about 2% at 2 and\n"
          "4 GPUs, so what remains there is its share of time per layer. At 8 GPUs the P40s reach 72% of a perfect\n"
          "pipeline and the model 77%: what a real 8-GPU server adds (two CPU sockets, one Python interpreter for\n"
          "all workers) is not modelled.")
    memory = gpt_memory_table()
    print("\nGPT-3 sizes, mixed-precision Adam (fp16): model state and one block's saved activations (b=1, s=2048)")
    print(f"{'model':<10} {'params':>9} {'bytes/param':>11} {'counted MB':>11} {'Korthikanti MB':>14} {'error':>8}")
    for r in memory:
        print(f"{r['model']:<10} {r['parameters'] / 1e9:>8.2f}B {r['model_state_bytes_per_parameter']:>11.1f} "
              f"{r['block_saved_bytes'] / 1e6:>11.1f} {r['korthikanti_bytes'] / 1e6:>14.1f} "
              f"{100 * r['activation_error']:>+7.3f}%")
    write_json(args.out, {"resnet101_speed": speed, "gpt_memory": memory, "seconds": time.perf_counter() - start},
               command=command_line(__file__, argv))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
