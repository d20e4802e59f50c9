"""Predicted against published: Megatron-LM's GPT runs on A100s (Narayanan et al., 2021, Table 1, rows 1 to 4).

"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" trains GPT models with sequence
2048 and vocabulary 51,200 on A100 80GB GPUs, eight per node on NVSwitch, eight InfiniBand HDR ports per node, with
full activation recomputation and mixed precision. Rows 1 to 4 of Table 1 use tensor parallelism and data
parallelism only (pipeline depth 1):

    parameters  hidden  layers  heads  tensor  GPUs  batch  TF/s per GPU
    1.7B        2304    24      24     1       32    512    137
    3.6B        3072    30      32     2       64    512    138
    7.5B        4096    36      32     4       128   512    142
    18.4B       6144    40      48     8       256   1024   135

Their TF/s counts the model's FLOPs with their Eq. 3, ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` per step
(recompute included), so a step took ``F / (n·X)``. Here each row is planned from FLOP and byte counts on the
``meta`` device (one tensor-parallel rank's shard) divided by the catalog's A100 80GB, whose parameters are set
once for every model (Note [roofline sources] in :mod:`sim.planning.hardware.catalog`): nothing is fitted here. The
model runs with ``kernels=megatron,attention=math`` (Note [fused kernels] in
:mod:`sim.planning.counting.models.decoder_layers`), because
those were the kernels these runs used: Megatron-LM's defaults of 2021 fuse the scores' scale, mask and softmax, the
MLP's bias and GELU, and each residual branch's bias, dropout and add (the paper's section 4.2), and write attention
out over the ``b·a·s²`` scores; FlashAttention, a spec's default today, came a year later. The
configuration is pinned as published (tensor parallel ``t``, one stage, ``n / t`` replicas, ``--checkpoint
layers``, Megatron's mixed precision with 32-bit gradients, NVLink 3 inside a node, HDR between nodes); the
micro-batch is the planner's choice (the paper does not state it for these rows), and the best of its rows is
compared. Rows 5 to 10, which pipeline the model, were kept back while the device was set and are checked here
unchanged (Note [held back]); the rest of the record (sequence parallelism, memory) is still kept back.

Run: ``.venv/bin/python -m benchmarks.megatron``; writes ``benchmarks/results/megatron.json``. One process.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks._shared.options import add_out, parser
from benchmarks._shared.record import command_line, results_path, write_json
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_device
from sim.planning.plan import PlanRequest, plan

SEQ, VOCAB = 2048, 51_200
GOAL = 0.10  # |predicted / published - 1| on each row's step time

#: (name, hidden, layers, heads, tensor parallel, pipeline, GPUs, batch, published TF/s per GPU)
ROWS = (
    ("1.7B", 2304, 24, 24, 1, 1, 32, 512, 137.0),
    ("3.6B", 3072, 30, 32, 2, 1, 64, 512, 138.0),
    ("7.5B", 4096, 36, 32, 4, 1, 128, 512, 142.0),
    ("18.4B", 6144, 40, 48, 8, 1, 256, 1024, 135.0),
)
#: Table 1's pipelined rows, kept back while the device's parameters were set (Note [held back]).
HELD_BACK = (
    ("39.1B", 8192, 48, 64, 8, 2, 512, 1536, 138.0),
    ("76.1B", 10240, 60, 80, 8, 4, 1024, 1792, 140.0),
    ("145.6B", 12288, 80, 96, 8, 8, 1536, 2304, 148.0),
    ("310.1B", 16384, 96, 128, 8, 16, 1920, 2160, 155.0),
    ("529.6B", 20480, 105, 128, 8, 35, 2520, 2520, 163.0),
    ("1008.0B", 25600, 128, 160, 8, 64, 3072, 3072, 163.0),
)

# Note [held back]: rows 5 to 10 of Table 1 pipeline the model too (8 to 64 stages of 1F1B or its interleaved form,
# which the paper introduces). They were not looked at while the A100's parameters and the fused kernels were set
# on rows 1 to 4; they check that the planner generalises from data-and-tensor parallelism to pipelines it was not
# fitted to. The paper states the pipeline depth but not the micro-batch or schedule of each row: the planner picks
# among micro-batches of 1, 2 and 4 samples, 1F1B and interleaved 1F1B (2, 3 or 4 stages per device), as for rows 1 to
# 4 it picks the micro-batch.


def model_flops(batch: int, layers: int, hidden: int) -> float:
    """Narayanan et al.'s Eq. 3: a step's FLOPs with full recomputation."""
    return 96 * batch * SEQ * layers * hidden**2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def main(argv: list[str] | None = None) -> int:
    flags = parser(__doc__)
    add_out(flags, results_path("megatron"))
    args = flags.parse_args(argv)
    device = get_device("a100-80gb")
    training = "fp16-adam-fp32grad"
    results: list[dict[str, object]] = []
    errors: list[float] = []
    print(f"{'model':>7} {'t':>2} {'p':>2} {'gpus':>5} {'batch':>5} {'mb':>4} {'published s':>12} {'predicted s':>12} "
          f"{'error':>7} {'TF/s pub':>9} {'TF/s pred':>10} {'exposed dp s':>13}")
    held = []
    for name, hidden, layers, heads, t, p, gpus, batch, tflops in ROWS + HELD_BACK:
        spec = (f"gpt:layers={layers},hidden={hidden},heads={heads},seq={SEQ},vocab={VOCAB},"
                "kernels=megatron,attention=math")  # the kernels of these runs (the module's docstring)
        start = time.perf_counter()
        profile = get_model(spec).tensor_parallel(t).count(torch.float16)
        replicas = gpus // (t * p)
        per_replica = batch // replicas
        pipelined = dict(schedules=["1f1b", "interleaved-1f1b"], virtual=[2, 3, 4],
                         chunks=[per_replica // mb for mb in (1, 2, 4) if per_replica % mb == 0]) if p > 1 else \
            dict(schedules=["gpipe"])
        result = plan(PlanRequest(profile={t: profile}, batch=batch, device=device, gpus=[gpus], link="nvlink3",
                                  training=training, checkpoints=["layers"], stages=[p], replicas=[replicas],
                                  tensor_parallel=[t], gpus_per_node=8, network="infiniband-hdr", network_ports=8,
                                  model_name=spec, **pipelined))  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
        best = result.best
        flops = model_flops(batch, layers, hidden)
        published = flops / (gpus * tflops * 1e12)
        if best is None:
            print(f"{name:>7}: nothing fits ({len(result.rows)} configurations)")
            results.append({"model": name, "fits": False})
            continue
        predicted = best.step_seconds
        error = predicted / published - 1
        (errors if p == 1 else held).append(abs(error))
        achieved = flops / (gpus * predicted) / 1e12
        print(f"{name:>7} {t:>2} {p:>2} {gpus:>5} {batch:>5} {best.microbatch:>4} {published:>12.3f} "
              f"{predicted:>12.3f} {error:>+7.1%} {tflops:>9.0f} {achieved:>10.1f} "
              f"{best.allreduce_exposed_seconds:>13.3f}")
        results.append({"model": name, "held_back": p > 1, "hidden": hidden, "layers": layers, "heads": heads,
                        "tensor_parallel": t, "pipeline": p, "schedule": best.schedule, "virtual": best.virtual,
                        "gpus": gpus, "batch": batch, "microbatch": best.microbatch, "chunks": best.chunks,
                        "published_tflops_per_gpu": tflops, "published_step_seconds": published,
                        "predicted_step_seconds": predicted, "error": error, "predicted_tflops_per_gpu": achieved,
                        "allreduce_exposed_seconds": best.allreduce_exposed_seconds,
                        "memory_gib": best.peak_memory_bytes / 2**30, "plan_seconds": seconds})
    within = sum(e <= GOAL for e in errors)
    print(f"rows 1-4: within {GOAL:.0%}: {within} of {len(ROWS)}; mean |error| {sum(errors) / max(1, len(errors)):.1%}")
    print(f"held back, rows 5-10 (Note [held back]): within {GOAL:.0%}: {sum(e <= GOAL for e in held)} of "
          f"{len(HELD_BACK)}; mean |error| {sum(held) / max(1, len(held)):.1%}")
    out = write_json(args.out, {"device": device.name, "training": training, "link": "nvlink3",
                                "network": "infiniband-hdr x8 per node", "goal": GOAL, "rows": results},
                     command=command_line(__file__, argv))
    print(f"wrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
