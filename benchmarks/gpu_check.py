"""The executor on CUDA: transparency for every checkpoint policy, and a measured timeline that follows the schedule.

Run on a machine with a CUDA device (under five minutes; without one it prints "no CUDA device: skipped"
and exits 0)::

    .venv/bin/python -m benchmarks.gpu_check            # writes benchmarks/results/gpu_check.json
    .venv/bin/python -m benchmarks.gpu_check --cpu --json /tmp/gpu_check.json   # the same checks on CPU devices

Checks, with four partitions spread over the GPUs there are (all four on ``cuda:0`` when it is alone, which
is the case CI's single-GPU machines have)::

    transparency  an MLP and a small conv net, checkpoint never / except_last / always, chunks 1 and 4:
                  GPipe's loss and every parameter gradient equal the un-pipelined model's on cuda:0
                  (TF32 off; float32 tolerance, since micro-batches change the kernels' summation order)
    timeline      one recorded step per model: per partition, the measured CUDA-event spans list the
                  schedule's tasks in the schedule's order; the timeline's summary and a short listing of
                  the spans are printed

The exit status is 1 when a check fails, 0 otherwise.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks._shared import options
from benchmarks._shared.record import command_line, results_path, write_json

RESULTS = results_path("gpu_check")
MODES = ("never", "except_last", "always")
CHUNKS = (1, 4)
PARTITIONS = 4
BATCH = 32
RTOL, ATOL = 1e-4, 1e-5


def mlp() -> tuple[nn.Sequential, list[int], torch.Tensor, torch.Tensor]:
    """8 x (Linear(256) + ReLU) then Linear(256 -> 10); input (B, 256), target (B, 10)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    layers.append(nn.Linear(256, 10))
    x, y = torch.randn(BATCH, 256), torch.randn(BATCH, 10)
    return nn.Sequential(*layers), [4, 4, 4, 5], x, y


def convnet() -> tuple[nn.Sequential, list[int], torch.Tensor, torch.Tensor]:
    """Conv-ReLU blocks, a pool and a classifier; input (B, 3, 32, 32), target (B, 10). No BatchNorm: its
    per-micro-batch statistics would differ from the full batch's by design, not by a bug."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),                 # (B, 32, 32, 32)
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),                                           # (B, 32, 16, 16)
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),                     # (B, 64)
        nn.Linear(64, 10),                                         # (B, 10)
    )
    x, y = torch.randn(BATCH, 3, 32, 32), torch.randn(BATCH, 10)
    return model, [3, 3, 3, 3], x, y


MODELS: dict[str, Callable[[], tuple[nn.Sequential, list[int], torch.Tensor, torch.Tensor]]] = {
    "mlp": mlp, "convnet": convnet,
}


def devices_for(partitions: int, cpu: bool = False) -> list[str]:
    """One device per partition, round-robin over the GPUs present (all on cuda:0 when there is one)."""
    if cpu:
        return ["cpu"] * partitions
    count = torch.cuda.device_count()
    return [f"cuda:{k % count}" for k in range(partitions)]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def reference_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   device: str) -> tuple[float, list[torch.Tensor]]:
    """Loss and parameter gradients of the un-pipelined model on ``device`` (a copy; the model is not changed)."""
    ref = copy.deepcopy(model).to(device)
    loss = F.mse_loss(ref(x.to(device)), y.to(device))
    loss.backward()
    return float(loss.detach()), [p.grad.detach().cpu() for p in ref.parameters()]  # type: ignore[union-attr]


def pipe_step(pipe: Any, x: torch.Tensor, y: torch.Tensor, devices: list[str]) -> tuple[float, list[torch.Tensor]]:
    pipe.zero_grad(set_to_none=True)
    out = pipe(x.to(devices[0]))
    loss = F.mse_loss(out, y.to(out.device))
    loss.backward()
    for d in sorted(set(devices)):
        synchronize(d)
    return float(loss.detach()), [p.grad.detach().cpu() for p in pipe.parameters()]


def transparency(gpipe_cls: Any, name: str, mode: str, chunks: int, cpu: bool = False) -> dict[str, Any]:
    model, balance, x, y = MODELS[name]()
    devices = devices_for(len(balance), cpu)
    want_loss, want_grads = reference_step(model, x, y, devices[0])
    pipe = gpipe_cls(copy.deepcopy(model), balance=balance, devices=devices, chunks=chunks, checkpoint=mode)
    got_loss, got_grads = pipe_step(pipe, x, y, devices)
    loss_ok = abs(got_loss - want_loss) <= ATOL + RTOL * abs(want_loss)
    worst = 0.0
    grads_ok = len(got_grads) == len(want_grads)
    for g, w in zip(got_grads, want_grads, strict=False):
        worst = max(worst, float((g - w).abs().max()))
        grads_ok = grads_ok and torch.allclose(g, w, rtol=RTOL, atol=ATOL)
    return {"model": name, "checkpoint": mode, "chunks": chunks, "devices": devices,
            "loss": got_loss, "loss_reference": want_loss, "max_grad_abs_diff": worst,
            "parameters": len(want_grads), "ok": bool(loss_ok and grads_ok)}


def timeline_check(gpipe_cls: Any, name: str, listing: int, cpu: bool = False) -> dict[str, Any]:
    """A recorded step: per partition, the measured task order equals the schedule's; print what was measured."""
    model, balance, x, y = MODELS[name]()
    devices = devices_for(len(balance), cpu)
    pipe = gpipe_cls(copy.deepcopy(model), balance=balance, devices=devices, chunks=4, checkpoint="except_last",
                     record=True)
    pipe_step(pipe, x, y, devices)  # warm-up (kernels, allocator)
    pipe_step(pipe, x, y, devices)
    tl, schedule = pipe.timeline, pipe.schedule
    orders_ok = tl is not None and all(
        tl.task_order(d) == list(schedule.tasks[d]) for d in range(len(schedule.tasks)))
    summary = tl.summary() if tl is not None else None
    clock = "host clock" if cpu else "CUDA events"
    print(f"\n{name}: measured timeline ({clock}), partitions on {devices}, m={schedule.m}, n={schedule.n}")
    if tl is not None:
        print(f"  makespan {tl.makespan * 1e3:.3f} ms, bubble {tl.bubble_fraction():.1%}")
        for d in range(tl.num_devices):
            row = summary["devices"][d] if summary else {}
            spans = tl.compute_spans(d)
            shown = " ".join(f"{s.task}[{s.start * 1e3:.2f}-{s.end * 1e3:.2f}]" for s in spans[:listing])
            more = f" ... (+{len(spans) - listing})" if len(spans) > listing else ""
            print(f"  partition {d}: busy {row.get('busy', 0.0) * 1e3:.3f} ms, "
                  f"peak {row.get('peak_memory_bytes', 0) / 2**20:.1f} MiB, {len(tl.copy_spans(d))} copies; "
                  f"{shown}{more}")
            if tl.task_order(d) != list(schedule.tasks[d]):
                print(f"    order differs: measured {' '.join(map(str, tl.task_order(d)))}\n"
                      f"                   schedule {' '.join(map(str, schedule.tasks[d]))}")
    print(f"  tasks in schedule order on every partition: {'yes' if orders_ok else 'NO'}")
    return {"model": name, "devices": devices, "m": schedule.m, "n": schedule.n, "orders_ok": bool(orders_ok),
            "summary": summary, "timeline": tl.to_dict() if tl is not None else None, "ok": bool(orders_ok)}


def main(argv: list[str] | None = None) -> int:
    parser = options.parser(__doc__)
    options.add_out(parser, RESULTS)
    parser.add_argument("--listing", type=int, default=8, help="spans listed per partition (default 8)")
    parser.add_argument("--cpu", action="store_true",
                        help="run the same checks on CPU devices (tests this script where there is no GPU)")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print(f"no CUDA device: skipped (torch {torch.__version__}; nothing written)")
        return 0
    from gpipe import GPipe

    # The reference runs the whole batch at once and the pipeline runs micro-batches: TF32 would make the two
    # differ by far more than float32 rounding.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    started = time.perf_counter()
    if args.cpu:
        names = ["cpu"]
        print(f"CPU devices only (--cpu); torch {torch.__version__}")
    else:
        names = [torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())]
        print(f"{len(names)} CUDA device(s): {', '.join(names)}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"{'model':<9}{'checkpoint':<13}{'chunks':>7}{'loss diff':>12}{'max grad diff':>15}  ok")
    cases = []
    for name in MODELS:
        for mode in MODES:
            for chunks in CHUNKS:
                case = transparency(GPipe, name, mode, chunks, args.cpu)
                cases.append(case)
                print(f"{name:<9}{mode:<13}{chunks:>7}{abs(case['loss'] - case['loss_reference']):>12.2e}"
                      f"{case['max_grad_abs_diff']:>15.2e}  {'yes' if case['ok'] else 'NO'}", flush=True)
    timelines = [timeline_check(GPipe, name, args.listing, args.cpu) for name in MODELS]
    ok = all(c["ok"] for c in cases) and all(t["ok"] for t in timelines)
    doc = {
        "benchmark": "gpu_check",
        "note": f"{PARTITIONS} partitions on {devices_for(PARTITIONS, args.cpu)}; TF32 off; rtol {RTOL}, atol {ATOL}",
        "rows": [{k: v for k, v in c.items() if k != "devices"} for c in cases],
        "timelines": timelines,
        "ok": ok,
        "seconds": time.perf_counter() - started,
    }
    write_json(args.out, doc, command=command_line(__file__, argv), machine={"gpus": names, "cuda": torch.version.cuda})
    print(f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'} in {doc['seconds']:.1f} s; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
