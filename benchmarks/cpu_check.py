"""Predicted from counts against the executor's measurement, on this machine's CPU (goal: within 10%).

The chain a buyer trusts on hardware they do not have, checked where it can run: this CPU's roofline is measured
on generic kernels (:func:`sim.planning.costs.calibrate_device.calibrate_cpu`, one thread), each model is counted on the
``meta`` device, each kernel timed by that roofline (:class:`sim.planning.costs.from_flops.FlopCosts`) and the step
simulated; the executor (:class:`gpipe.GPipe`, one CPU device, one thread) runs the same step on real tensors.
Models: the demo's CNN (batch 64) and a small GPT (2 blocks, d_model 256, 128 tokens; no dropout and math
attention, so the CPU runs the operators the count sees). The loss is counted too, as a last layer.

Both sides are measured in one run, back to back, as medians of several repeats, in the thread's (calibration)
and the process's (executor) CPU seconds: on a machine shared with other work those count what this work costs,
not how long it waited for a core. The step's wall-clock median is reported beside it, with the load average.

Run: ``.venv/bin/python -m benchmarks.cpu_check [--device cpu.json]`` (a minute); writes
``benchmarks/results/cpu_check.json``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch
from torch import nn

from benchmarks._shared import options
from benchmarks._shared.machine import set_threads
from benchmarks._shared.record import command_line, results_path, write_json
from gpipe import GPipe
from gpipe.schedule import gpipe
from sim.calibration.experiment import demo_model
from sim.calibration.machine import keep_freed_memory
from sim.core.config import SimConfig
from sim.core.engine import simulate
from sim.planning.costs.calibrate_device import calibrate_cpu
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models.gpt import GPTConfig, gpt, gpt_sample
from sim.planning.hardware.catalog import DeviceSpec, get_link, load_device

TOLERANCE = 0.10
STEPS = 5
ROUNDS = 7

# Note [one run, back to back]: other work on a shared machine slows this process's kernels too (shared caches and
# memory), so a calibration made in a quiet minute would not describe a loaded one. The calibration's passes over
# its kernels and the executor's steps alternate (one step of every case after each pass), and both sides take
# medians over the same minutes.


class _MSE(nn.Module):
    """The step's loss as a layer, for counting: mean squared error against a zero target."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(x, torch.zeros_like(x))


class _Steps:
    """The executor's step of one case, ready to run: each :meth:`step` appends its CPU, kernel-mode CPU (page
    faults, mostly) and wall seconds."""

    def __init__(self, model: nn.Sequential, x: torch.Tensor, chunks: int) -> None:
        self.pipe = GPipe(model, [len(model)], devices=["cpu"], chunks=chunks, checkpoint="never")
        self.x = x
        with torch.no_grad():
            self.target = torch.zeros_like(model(x))
        self.cpu: list[float] = []
        self.system: list[float] = []
        self.wall: list[float] = []
        self.step()  # warm-up
        for samples in (self.cpu, self.system, self.wall):
            samples.clear()

    def step(self) -> None:
        start, start_cpu, start_system = time.perf_counter(), time.process_time(), os.times().system
        self.pipe.step(self.x, self.target, nn.functional.mse_loss)
        self.cpu.append(time.process_time() - start_cpu)
        self.system.append(os.times().system - start_system)
        self.wall.append(time.perf_counter() - start)


def _predict(model: nn.Sequential, x: torch.Tensor, chunks: int, device: DeviceSpec) -> float:
    costs = FlopCosts(count_layers(nn.Sequential(*model, _MSE()), x), device, "fp32-sgd")
    size = x.shape[0] // chunks
    timeline = simulate(gpipe(chunks, 1, "never"), costs.cost_model((len(model) + 1,), size),
                        SimConfig(link=get_link("cpu-memcpy")))
    return timeline.makespan


def main(argv: list[str] | None = None) -> int:
    parser = options.parser(__doc__)
    parser.add_argument("--device", help="a saved calibration (gpipe-sim hardware --calibrate-cpu --out)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"calibration passes, each followed by one step of every case ({ROUNDS})")
    options.add_out(parser, results_path("cpu_check"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    set_threads(1)  # one thread, calibration and executor alike (Note [threads] in _shared.machine)
    keep_freed_memory()  # as gpipe-sim's commands do (Note [allocator] in sim.calibration.machine)
    demo, demo_x = demo_model()
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=256, seq_len=128, vocab_size=1024, dropout=0.0)
    small_gpt = gpt(cfg)
    tokens = gpt_sample(cfg, 8, "cpu")
    cases = [("demo CNN", demo, demo_x, 1), ("demo CNN", demo, demo_x, 4),
             ("GPT 2x256", small_gpt, tokens, 1), ("GPT 2x256", small_gpt, tokens, 2)]
    load_before = os.getloadavg()[0]
    steps = [_Steps(model, x, chunks) for _, model, x, chunks in cases]

    def between() -> None:  # Note [one run, back to back]
        for case in steps:
            case.step()

    if args.device:
        device = load_device(args.device)
        for _ in range(args.rounds):
            between()
    else:
        device = calibrate_cpu(repeats=args.rounds, between=between).device
    load = (load_before, os.getloadavg()[0])
    rows: list[dict[str, Any]] = []
    print(f"{'model':<10} {'batch':>5} {'chunks':>6} {'measured':>10} {'predicted':>10} {'error':>7} {'wall':>9} "
          f"{'system':>9}")
    for (name, model, x, chunks), case in zip(cases, steps, strict=True):
        cpu, wall, system = (statistics.median(s) for s in (case.cpu, case.wall, case.system))
        predicted = _predict(model, x, chunks, device)
        error = predicted / cpu - 1
        rows.append({"model": name, "batch": x.shape[0], "chunks": chunks, "measured_seconds": cpu,
                     "predicted_seconds": predicted, "measured_throughput": x.shape[0] / cpu,
                     "predicted_throughput": x.shape[0] / predicted, "error": error, "wall_seconds": wall,
                     "error_against_wall": predicted / wall - 1, "system_seconds": system,
                     "cpu_seconds_per_step": case.cpu})
        print(f"{name:<10} {x.shape[0]:>5} {chunks:>6} {1e3 * cpu:>7.1f} ms {1e3 * predicted:>7.1f} ms "
              f"{100 * error:>+6.1f}% {1e3 * wall:>6.1f} ms {1e3 * system:>6.1f} ms  (steps: "
              + ", ".join(f"{1e3 * c:.0f}" for c in case.cpu) + " ms)")
    within = all(abs(r["error"]) <= TOLERANCE for r in rows)
    print(f"every step time within {TOLERANCE:.0%}: {'yes' if within else 'NO'} (load average {load[0]:.2f}, "
          f"then {load[1]:.2f}, on {os.cpu_count()} cores)")
    roof = device.roofline
    assert roof is not None
    print(f"calibrated: {device.peak_flops['fp32'] / 1e9:.1f} GFLOP/s, half_dim {roof.half_dim:g}, convolution "
          f"{roof.convolution['fp32']:.2f}, backward {roof.convolution_backward['fp32']:.2f}, half_dim "
          f"{roof.half_dims()[2]:g}, memory-bound "
          f"{device.memory_bandwidth * roof.memory / 1e9:.1f} GB/s, vector math "
          f"{device.memory_bandwidth * (roof.vector_math or 0) / 1e9:.1f} GB/s, "
          f"{roof.kernel_seconds * 1e6:.2f} us/kernel")
    note = (f"Measured: the executor's step, median process CPU seconds (wall-clock beside it); predicted: the "
            f"simulated step from counts and this CPU's roofline, calibrated on generic kernels in the same run: "
            f"{args.rounds} passes over the calibration's kernels, each followed by one step of every case; medians "
            f"over them; system: the step's kernel-mode CPU seconds (page faults of freshly mapped activations, which "
            f"the roofline does not model; glibc keeps freed memory here, as in gpipe-sim's commands). Load average "
            f"{load[0]:.2f} before and {load[1]:.2f} after (other work on the same {os.cpu_count()} cores). "
            f"Within {TOLERANCE:.0%}: {'yes' if within else 'no'}.")
    write_json(args.out, {"note": note, "device": device.to_dict(), "rows": rows, "within_tolerance": within},
               command=command_line(__file__, argv),
               machine={"cores": os.cpu_count(), "threads": 1, "load average": f"{load[0]:.2f} then {load[1]:.2f}"})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
