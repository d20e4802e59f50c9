"""How fast the planner sweeps (goal: each case's sweep in under 10 s on this two-core machine).

Cases:

- ``gpt:1.3b`` on H100s, every registered schedule: every GPU count from 1 to 8, each pipeline depth that divides it,
  chunks 4, 8 and 16, checkpointing never or except_last; about 1,200 configurations.
- ``gpt:175b`` on 1,024 A100 80GB (NVLink 3 in a node, InfiniBand HDR between nodes), tensor parallel 1, 2, 4 and 8,
  every pipeline depth, the default chunks, checkpoint policies and schedules: the sweep the planner must answer
  in seconds for the models clusters are bought for (a few thousand configurations, most of which do not fit and
  are not simulated: Note [not simulated] in :mod:`sim.planning.rows`).
- the same with ZeRO 0 and 1 and sequence parallelism off and on as well (four times the configurations).
- ``gpipe-sim plan``'s default for ``gpt:175b`` on 1,024 A100s and for ``llama:405b`` on 16,384 H100s (NVLink 4,
  InfiniBand NDR; batch 2,048 of 8,192 tokens): today's layouts (Note [today's defaults] in
  :mod:`sim.planning.request`), the fastest 20 per GPU count ranked exactly and the rest skipped (Note [bounded
  sweep] in :mod:`sim.planning.sweep_workers`). Goals: 15 s and 30 s.

Counting the model on the meta device happens once per tensor-parallel degree, before, and is timed apart. The
sweep runs in worker processes, one per core this process may use (Note [sweep workers] in
:mod:`sim.planning.sweep_workers`), and in one process for the ratio; each process is single-threaded (pure Python).

Run: ``.venv/bin/python -m benchmarks.plan_speed``; writes ``benchmarks/results/plan_speed.json``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from benchmarks._shared.options import add_out, parser
from benchmarks._shared.record import command_line, results_path, write_json
from gpipe.interpreter.affinity import available_cores
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_device
from sim.planning.plan import PlanRequest, default_training, plan
from sim.planning.request import PRACTICE_ZERO, practice_checkpoints, practice_degrees, shard_keys

GOAL_SECONDS = 10.0
TOP = 20  # the table's rows, which the CLI's default sweep ranks exactly


def _case(name: str, spec: str, device: str, gpus: Sequence[int], link: str, degrees: Sequence[int],
          splits: Sequence[bool] = (False,), *, batch: int, goal: float = GOAL_SECONDS, **kwargs: Any
          ) -> dict[str, Any]:
    dev = get_device(device)
    training = default_training(dev)
    model = get_model(spec)
    start = time.perf_counter()
    counts = {(t, sp): model.tensor_parallel(t, sequence_parallel=sp).count(training.torch_dtype)
              for t, sp in shard_keys(degrees, splits)}
    counted = time.perf_counter() - start
    seconds = {}
    for workers in (len(available_cores()), 1):
        start = time.perf_counter()
        result = plan(PlanRequest(profile=counts, batch=batch, device=dev, gpus=gpus, link=link, training=training,
                                  tensor_parallel=degrees, sequence_parallel=splits, model_name=spec,
                                  **kwargs), workers=workers)
        seconds[workers] = time.perf_counter() - start
    n, swept = len(result.rows) + result.skipped, seconds[len(available_cores())]
    best = result.best
    row = {"case": name, "configurations": n, "skipped": result.skipped, "fit": sum(r.fits for r in result.rows),
           "count_s": round(counted, 2), "sweep_s": round(swept, 2), "one_process_s": round(seconds[1], 2),
           "workers": len(available_cores()), "ms_per_configuration": round(1e3 * swept / n, 2),
           "goal": f"< {goal:.0f} s: {'yes' if swept < goal else 'NO'}",
           "best": "" if best is None else (f"t{best.tensor_parallel} x p{best.stages} x d{best.replicas}, "
                                            f"{best.schedule}, {best.chunks} chunks, {best.checkpoint}"
                                            + (f", ZeRO-{best.zero}" if best.zero else "")
                                            + (", SP" if best.sequence_parallel else ""))}
    print(f"{name}: {n} configurations ({row['fit']} fit) in {swept:.2f} s on {row['workers']} workers "
          f"({seconds[1]:.2f} s in one process); counted in {counted:.2f} s; best: {row['best']}")
    return row


def main(argv: list[str] | None = None) -> int:
    flags = parser(__doc__)
    add_out(flags, results_path("plan_speed"))
    args = flags.parse_args(argv)
    rows = [
        _case("gpt:1.3b, 1-8 H100s, every schedule", "gpt:1.3b", "h100-sxm", list(range(1, 9)), "nvlink", [1],
              batch=512, chunks=[4, 8, 16], checkpoints=["never", "except_last"]),
        _case("gpt:175b, 1,024 A100s, t 1-8", "gpt:175b", "a100-80gb", [1024], "nvlink3", [1, 2, 4, 8],
              batch=1536, network="infiniband-hdr", tokens_per_sample=2048),
        _case("gpt:175b, 1,024 A100s, t 1-8, ZeRO 0-1, SP off/on", "gpt:175b", "a100-80gb", [1024], "nvlink3",
              [1, 2, 4, 8], (False, True), batch=1536, network="infiniband-hdr", zero=[0, 1], tokens_per_sample=2048),
    ]
    for name, spec, device, gpus, link, network, batch, goal in [
            ("gpt:175b, 1,024 A100s, the CLI's default", "gpt:175b", "a100-80gb", 1024, "nvlink3", "infiniband-hdr",
             1536, 15.0),
            ("llama:405b, 16,384 H100s, the CLI's default", "llama:405b", "h100-sxm", 16384, "nvlink4",
             "infiniband-ndr", 2048, 30.0)]:
        model = get_model(spec)
        rows.append(_case(name, spec, device, [gpus], link, practice_degrees(model.splits_over, [gpus]), (True,),
                          batch=batch, goal=goal, network=network, zero=PRACTICE_ZERO, keep=TOP,
                          checkpoints=practice_checkpoints(model.attention_core is not None),
                          tokens_per_sample=int(model.sample(1, "meta").shape[1])))
    write_json(args.out, {
        "note": "sweep_s: the sweep on one worker process per core; one_process_s: the same sweep in one process; "
                "counting (count_s) is apart. Goal: each sweep under 10 s; the CLI's default sweeps, which rank the "
                f"fastest {TOP} exactly and skip the rest, under 15 s and 30 s.",
        "rows": rows}, command=command_line(__file__, argv), machine={"cores": len(available_cores())})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
