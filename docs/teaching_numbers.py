"""The numbers of the pages past GPipe (parallelism, memory, balancing, micro-batch size, beyond 1F1B), as markdown
fragments.

Each table is computed here from the simulator, the planner, the hardware catalog or the model shapes, never typed
into a page; :func:`fragments` is registered in ``docs/figures/teaching.py`` and so reaches every
``<!-- generated: NAME -->`` marker.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from gpipe.schedule import SCHEDULES, Schedule
from gpipe.schedule.task import Checkpoint, Task
from sim.core.cost import CostModel, StageCost

__all__ = ["ACROSS", "BEYOND_A", "COMMUNICATION", "EXPENSIVE", "MEMORY_M", "MEMORY_P", "ROOFLINE_WIDTHS",
           "across_steps", "answer_numbers", "beyond_cost", "beyond_numbers", "communication_runs",
           "consecutive_steps", "fragments", "frontier", "memory_rows", "min_tokens", "peak_a", "saved_per_layer"]

MiB, GiB = 2**20, 2**30

Table = Callable[[list[str], list[list[str]]], str]


# -- memory per schedule -----------------------------------------------------------------------------------

#: The memory table's pipeline: 4 devices, 8 micro-batches; one device's share of the model keeps A = 64 MiB per
#: micro-batch for backward without checkpointing, and its input (A/8) with it.
MEMORY_P, MEMORY_M, MEMORY_A = 4, 8, 64 * MiB
POLICIES: tuple[Checkpoint, ...] = ("never", "except_last", "always")


def memory_rows(simulate: Callable[..., Any]) -> list[tuple[str, str, float, list[int]]]:
    """(schedule, checkpoint, makespan in seconds, peak bytes per device) for every registered schedule that
    takes (p=4, m=8) and every policy; a schedule with stages per device runs two per device, each 1/2 the work."""
    rows: list[tuple[str, str, float, list[int]]] = []
    for name, kind in SCHEDULES.items():
        v = 1 if kind.place is None else 2
        for policy in POLICIES:
            try:
                schedule: Schedule = kind(MEMORY_M, MEMORY_P * v, policy, devices=MEMORY_P).validate()
            except ValueError:
                continue
            v = schedule.stages // MEMORY_P  # DualPipe's slots each hold a whole stage of one of its two copies
            t, split = 1e-3 / v, schedule.splits_weight_gradient
            stage = StageCost(forward=t, backward=t if split else 2 * t, weight=t if split else 0.0,
                              saved_bytes=MEMORY_A // v, checkpoint_bytes=MEMORY_A // 8)
            tl = simulate(schedule, CostModel((stage,) * schedule.n))
            rows.append((name, policy, tl.makespan, [tl.peak_memory(d) for d in range(MEMORY_P)]))
    return rows


def _memory(simulate: Callable[..., Any], table: Table) -> dict[str, str]:
    rows = memory_rows(simulate)
    body = [[f"`{name}`", f"`{policy}`", f"{span * 1e3:.1f} ms"] + [f"{b / MEMORY_A:.3g} A" for b in peaks]
            for name, policy, span, peaks in rows]
    by = {(name, policy): peaks for name, policy, _, peaks in rows}
    two = by[("1f1b", "except_last")][0] / MEMORY_A
    note = (f"With `except_last`, 1F1B's first device peaks at {two:.3g} A: the last micro-batch keeps its full "
            f"activation (1 A, it is not checkpointed) while the micro-batch before it is recomputed (another "
            f"1 A, transient), on top of the checkpointed inputs still waiting ({two - 2:.3g} A).")
    return {"memory_schedules": table(["schedule", "checkpoint", "makespan"]
                                      + [f"peak, dev {d}" for d in range(MEMORY_P)], body),
            "memory_except_last": note}


def _model_state(table: Table) -> dict[str, str]:
    from sim.planning.counting.models.gpt import gpt_config
    from sim.planning.counting.training import TRAINING

    params = gpt_config("13b").parameters
    rows = [[f"`{t.name}`", str(t.weight_bytes), str(t.gradient_bytes), str(t.optimizer_bytes),
             str(t.model_state_bytes_per_parameter), f"{params * t.model_state_bytes_per_parameter / GiB:.0f} GiB"]
            for t in TRAINING.values() if t.compute != "tf32"]
    return {"memory_model_state": table(
        ["training", "weights B/param", "gradients B/param", "optimizer B/param", "total B/param",
         f"GPT-3 13B ({params / 1e9:.1f}e9 parameters)"], rows)}


def saved_per_layer(c: Any) -> float:
    """Bytes one transformer layer of the GPT config ``c`` keeps for backward per sample, 16-bit, no recompute and
    math attention: Korthikanti et al. (2022), ``s·h·(34 + 5·a·s/h)``."""
    return c.seq_len * c.d_model * (34 + 5 * c.n_head * c.seq_len / c.d_model)


def _activations(table: Table) -> dict[str, str]:
    from sim.planning.counting.models.gpt import gpt_config

    rows = []
    for name in ("125m", "1.3b", "13b", "175b"):
        c = gpt_config(name)
        s, h, a = c.seq_len, c.d_model, c.n_head
        per_layer = saved_per_layer(c)
        flash = s * h * 34 + 4 * a * s  # FlashAttention keeps no s x s tensor, a row's logsumexp in fp32
        rows.append([f"gpt:{name},attention=math", str(c.n_layer), str(h), str(a), str(s),
                     f"{per_layer / MiB:.0f} MiB", f"{2 * s * h / MiB:.0f} MiB",
                     f"{per_layer * c.n_layer / GiB:.1f} GiB", f"{flash / MiB:.0f} MiB"])
    return {"memory_activations": table(
        ["model", "layers", "h", "heads a", "s", "saved per layer, per sample", "layer input (2sh)",
         "all layers, per sample", "per layer with FlashAttention (gpt:SIZE)"], rows)}


# -- pipeline, data and tensor parallel traffic --------------------------------------------------------------


def _traffic(plan_result: Any, table: Table) -> dict[str, str]:
    """Bytes one GPU sends per step in the planner's fastest configurations, by kind of parallelism."""
    from sim.core.rings import allreduce_seconds
    from sim.planning.counting.models.gpt import gpt_config
    from sim.planning.counting.training import TRAINING
    from sim.planning.hardware.catalog import get_link

    cfg = gpt_config("13b")
    s, h, layers, word = cfg.seq_len, cfg.d_model, cfg.n_layer, 2  # bf16
    link = get_link(plan_result.link)
    rows = sorted((r for r in plan_result.rows if r.fits), key=lambda r: -r.throughput)
    seen, out = set(), []
    for r in rows:
        if (r.stages, r.replicas) in seen:
            continue
        seen.add((r.stages, r.replicas))
        boundary = r.microbatch * s * h * word  # one activation crossing one stage boundary
        pipeline = 2 * r.chunks * boundary  # a middle stage: activations forward, gradients back
        training = TRAINING[plan_result.training]
        grads = max(r.model_state_bytes) / training.model_state_bytes_per_parameter * training.gradient_bytes
        data = 2 * (r.replicas - 1) / r.replicas * grads
        t = r.stages  # tensor parallel over the same GPUs instead: 4 all-reduces of b·s·h per layer and step
        tensor = 4 * layers * 2 * (t - 1) / t * (r.chunks * r.microbatch) * s * h * word
        whole = allreduce_seconds(grads, r.replicas, link)  # the fullest device's all-reduce, if nothing hid it
        out.append([f"{r.stages} x {r.replicas}", f"{r.chunks} x {r.microbatch}", f"{boundary / MiB:.0f} MiB",
                    f"{pipeline / GiB:.2f} GiB", f"{data / GiB:.2f} GiB", f"{tensor / GiB:.1f} GiB",
                    f"{(pipeline + data) / link.bandwidth * 1e3:.0f} ms",
                    f"{whole * 1e3:.1f} ms / {r.allreduce_exposed_seconds * 1e3:.1f} ms",
                    f"{r.step_seconds * 1e3:.0f} ms"])
        if len(out) == 4:
            break
    head = (f"GPT-3 13B (s = {s}, h = {h}, {layers} layers, bf16), batch {plan_result.batch}, the planner's fastest "
            f"configuration of each shape (pipeline depth x replicas) on {plan_result.device} "
            f"over `{plan_result.link}` "
            f"({link.bandwidth / 1e9:.0f} GB/s). Bytes one GPU sends per step, and its data-parallel all-reduce's "
            f"seconds: in all, and the part that ran past the drained pipeline (`allreduce_exposed_seconds`):")
    return {"traffic_table": head + "\n\n" + table(
        ["pp x dp", "chunks x samples", "activation per boundary", "pipeline (middle stage)",
         "data-parallel all-reduce", "tensor parallel instead", "pp + dp on the link",
         "all-reduce: whole / exposed", "planner's step"], out)}


# -- balancing ------------------------------------------------------------------------------------------------

#: The balancing example: 16 layers whose forward times (ms) vary, seeded; backward twice forward.
BALANCE_LAYERS, BALANCE_STAGES, BALANCE_SEED = 16, 4, 16


def balance_example() -> list[float]:
    rng = random.Random(BALANCE_SEED)
    return [round(rng.uniform(0.5, 3.0), 1) for _ in range(BALANCE_LAYERS)]


def _balancing(simulate: Callable[..., Any], table: Table) -> dict[str, str]:
    from gpipe.balance.blockpartition import bottleneck, solve
    from gpipe.schedule import gpipe

    layers = balance_example()
    m, n = 8, BALANCE_STAGES
    rows = []
    for label, balance in (("equal layer counts", [BALANCE_LAYERS // n] * n),
                           ("block partition (`balance_by_time`)", solve(layers, n))):
        f, k = [], 0
        for size in balance:
            f.append(sum(layers[k:k + size]) * 1e-3)
            k += size
        b = [2 * x for x in f]
        tl = simulate(gpipe(m, n, "never"), CostModel.from_lists(forward=f, backward=b))
        formula = sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)
        rows.append([label, str(balance), " ".join(f"{x * 1e3:.1f}" for x in f),
                     f"{bottleneck(layers, balance):.1f} ms", f"{tl.makespan * 1e3:.1f} ms",
                     f"{formula * 1e3:.1f} ms"])
    return {"balance_layers": " ".join(f"{x:.1f}" for x in layers),
            "balance_table": table(["balance", "layers per stage", "forward per stage (ms)", "bottleneck",
                                    "simulated makespan", "Σt_f + (m-1)max t_f + Σt_b + (m-1)max t_b"], rows)}


# -- the smallest useful micro-batch: a roofline ------------------------------------------------------------------

#: Hidden sizes of the roofline table: GPT-3 125M, 1.3B, 13B and 175B.
ROOFLINE_WIDTHS = (768, 2048, 5120, 12288)


def min_tokens(h: int, ridge: float) -> float:
    """Fewest tokens T for which the MLP's first GEMM, (T x h) @ (h x 4h) in 16 bits, reaches ``ridge``
    FLOP/byte: its intensity is 2·T·h·4h / (2·(T·h + 4h² + 4T·h)) = 4Th / (5T + 4h); ``inf`` if it never does."""
    return 4 * h * ridge / (4 * h - 5 * ridge) if 4 * h > 5 * ridge else float("inf")


def _roofline(table: Table) -> dict[str, str]:
    from sim.planning.hardware.catalog import DEVICES

    rows = []
    for d in DEVICES.values():
        dtype = "bf16" if "bf16" in d.peak_flops else "fp16" if "fp16" in d.peak_flops else None
        if dtype is None:
            continue
        ridge = d.peak_flops[dtype] / d.memory_bandwidth
        rows.append([d.name, dtype, f"{d.peak_flops[dtype] / 1e12:.0f}", f"{d.memory_bandwidth / 1e9:.0f}",
                     f"{ridge:.0f}"] + [_tokens(min_tokens(h, ridge)) for h in ROOFLINE_WIDTHS])
    from sim.planning.counting.models.gpt import gpt_config
    from sim.planning.hardware.catalog import get_device

    a100, cfg = get_device("a100-80gb"), gpt_config("13b")
    ridge = a100.peak_flops["bf16"] / a100.memory_bandwidth
    tokens = min_tokens(cfg.d_model, ridge)
    worked = (f"With `h = {cfg.d_model}` and `s = {cfg.seq_len}`, the A100's ridge is {ridge:.0f} FLOP/byte "
              f"({a100.peak_flops['bf16'] / 1e12:.0f} TFLOP/s over {a100.memory_bandwidth / 1e9:.0f} GB/s), and the "
              f"MLP's GEMM is compute-bound from {tokens:.0f} tokens: one sample ({cfg.seq_len} tokens) is "
              f"{cfg.seq_len / tokens:.0f} times that.")
    header = ["device", "dtype", "peak TFLOP/s", "GB/s", "ridge FLOP/byte"]
    header += [f"tokens, h={h}" for h in ROOFLINE_WIDTHS]
    return {"roofline_worked": worked, "roofline_table": table(header, rows)}


def answer_numbers(simulate: Callable[..., Any]) -> dict[str, dict[str, str]]:
    """The numbers the exercise answers of memory.md and micro-batch-size.md state, as they write them, by page
    (tests/docs/test_concept_answers.py finds each and checks them against their closed forms)."""
    from sim.planning.counting.models.gpt import gpt_config
    from sim.planning.hardware.catalog import get_device

    # memory 1: 13B on 8 A100s as 8 stages, mixed-precision Adam (16 B per parameter)
    a100, h100, c, stages = get_device("a100-80gb"), get_device("h100-sxm"), gpt_config("13b"), 8
    state, capacity = 16 * c.parameters / GiB, a100.memory_bytes / GiB
    layers = c.n_layer // stages
    left, five = capacity - state / stages, layers * saved_per_layer(c) / GiB
    gpipe_always = {(n, policy): peaks for n, policy, _, peaks in memory_rows(simulate)}[("gpipe", "always")]
    # micro-batch size 2 and 3: the H100 against the A100, and Q·Kᵀ of heads of 128, whose intensity tends to 128
    ridge = {d.name: d.peak_flops["bf16"] / d.memory_bandwidth for d in (a100, h100)}
    d = 128
    return {
        "concepts/memory.md": {
            "state": f"`{state:.0f} GiB / {stages} ≈ {state / stages:.0f} GiB`",
            "left": f"`{capacity:.0f} − {state / stages:.0f} ≈ {left:.0f} GiB`",
            "capacity": f"{a100.memory_bytes / MiB:,.0f} MiB",
            "layers": f"`{layers} × {saved_per_layer(c) / MiB:.0f} MiB ≈ {five:.1f} GiB`",
            "gpipe always": f"peak at {max(gpipe_always) / MEMORY_A:.0f} A",
        },
        "concepts/micro-batch-size.md": {
            "peak": f"{h100.peak_flops['bf16'] / a100.peak_flops['bf16']:.1f} times an A100's 16-bit peak",
            "bandwidth": f"{h100.memory_bandwidth / a100.memory_bandwidth:.1f} times its bandwidth",
            "ridges": f"about {round(ridge['h100-sxm'], -2):.0f} against {round(ridge['a100-80gb'], -1):.0f} FLOP/byte",
            "qk": f"`d = {d}` FLOP/byte: {'below' if d < ridge['a100-80gb'] else 'above'} the A100's ridge",
        },
    }


def _tokens(t: float) -> str:
    return "never" if t == float("inf") else f"{t:.0f}"


# -- beyond 1F1B: communication inside tasks, and bubble against memory ------------------------------------------

#: The "Beyond 1F1B" page's pipelines (``docs/figures/beyond_1f1b.py``'s beyond_schedules at p = 4): p devices,
#: m = 2p micro-batches; a device's share costs 1 ms of each of F, B and W (a backward that is not split: 2 ms) and
#: keeps A per micro-batch, a schedule with v stages per device gives each stage 1/v of both.
BEYOND_A = 64 * MiB
#: Seconds of communication per F, R and B of one stage of the V (Note [communication] in sim.core.cost): free, and
#: up to twice the stage's compute; EXPENSIVE equals it, DeepSeek-V3's 1:1 of cross-node expert parallelism.
COMMUNICATION, EXPENSIVE = (0.0, 0.25e-3, 0.5e-3, 1e-3), 0.5e-3


def beyond_cost(schedule: Schedule, communication: float = 0.0) -> CostModel:
    """The page's cost model for ``schedule`` (its stages per device from its shape)."""
    # stages per device of one copy: DualPipe's slots each hold a whole stage of one of its two copies
    v, split = schedule.stages // schedule.num_devices, schedule.splits_weight_gradient
    t = 1e-3 / v
    stage = StageCost(forward=t, backward=t if split else 2 * t, weight=t if split else 0.0,
                      saved_bytes=BEYOND_A // v, communication=communication)
    return CostModel((stage,) * schedule.n)


def communication_runs(simulate: Callable[..., Any], p: int = 4, m: int = 8) -> list[tuple[float, Any, Any]]:
    """``(communication, ZB-V's timeline, DualPipe-V's)`` for each of :data:`COMMUNICATION`."""
    zbv, dpv = (SCHEDULES[name](m, 2 * p, "never", devices=p) for name in ("zb-v", "dualpipe-v"))
    return [(x, simulate(zbv, beyond_cost(zbv, x)), simulate(dpv, beyond_cost(dpv, x))) for x in COMMUNICATION]


def frontier(simulate: Callable[..., Any], p: int) -> list[tuple[str, Schedule, Any]]:
    """Every registered schedule on ``p`` devices and ``m = 2p`` micro-batches (two stages per device where it
    places several), interleaved 1F1B breadth-first (``round=m``), and the search's schedule on the V under 1F1B's
    memory (``p`` micro-batches of a device's share): ``(name, schedule, simulated timeline)``."""
    from gpipe.schedule import schedule_kind
    from gpipe.schedule.placement import v_shape
    from gpipe.schedule.search import StageCosts, search

    m, out = 2 * p, []
    for name in [*SCHEDULES, f"interleaved-1f1b:round={2 * p}"]:
        kind = schedule_kind(name)
        schedule = kind(m, p * (1 if kind.place is None else 2), "never", devices=p)
        out.append((name, schedule, simulate(schedule, beyond_cost(schedule))))
    found = search(m, v_shape(2 * p, p), StageCosts.uniform(2 * p, 0.5e-3, 0.5e-3, 0.5e-3), memory_limit=p,
                   time_limit=5.0).schedule
    out.append(("searched", found, simulate(found, beyond_cost(found))))
    return out


def peak_a(timeline: Any) -> float:
    """The most activation any device of ``timeline`` holds, in A."""
    return max(timeline.peak_memory(d) for d in range(timeline.num_devices)) / BEYOND_A


# -- across steps -------------------------------------------------------------------------------------------

#: The schedules drawn over two steps on the "Beyond 1F1B" page: one whose step ends on its first device, one whose
#: first device ends early, and the V.
ACROSS = ("zb-h1", "zb-h2", "zb-v")


# Note [across steps]: an optimizer step that clips by the global gradient norm or skips on an inf or NaN waits for
# every stage's gradients, so no device starts step k + 1 before the last device ends step k. Qi et al. (Zero Bubble
# Pipeline Parallelism, ICLR 2024, section 4) replace that barrier with post-validation: each stage updates with a
# partial reduction passed on from the stage before, the full one comes back during the next step's warm-up, and a
# failed check rolls the update back. A device's step k + 1 then waits only for its own step k and its inputs: one
# device list after another. The optimizer's time and the few bytes of the partial reduction are left out.
def consecutive_steps(schedule: Schedule, steps: int) -> Schedule:
    """``steps`` training steps of ``schedule`` back to back, without a barrier between them (Note [across steps]).

    Step ``k`` runs micro-batches ``k·m .. (k + 1)·m - 1``; each device runs its list once per step, in order.

    Raises:
        ValueError: ``steps`` is below 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    m = schedule.m

    def shifted(task: Task, k: int) -> Task:
        return Task(task.op, task.microbatch + k * m, task.stage)

    tasks = tuple(tuple(shifted(t, k) for k in range(steps) for t in device) for device in schedule.tasks)
    pairs = tuple((shifted(a, k), shifted(b, k)) for k in range(steps) for a, b in schedule.pairs)
    return Schedule(m=steps * m, n=schedule.n, checkpoint=schedule.checkpoint, placement=schedule.placement,
                    tasks=tasks, name=f"{schedule.name}, {steps} steps", pairs=pairs).validate()


def across_steps(simulate: Callable[..., Any], p: int = 4, m: int = 8) -> list[tuple[str, Any, Any]]:
    """``(name, one step's timeline, two steps' timeline)`` for each of :data:`ACROSS`, on the page's costs."""
    out = []
    for name in ACROSS:
        kind = SCHEDULES[name]
        schedule = kind(m, p * (1 if kind.place is None else 2), "never", devices=p)
        cost = beyond_cost(schedule)
        out.append((name, simulate(schedule, cost), simulate(consecutive_steps(schedule, 2), cost)))
    return out


def beyond_numbers(simulate: Callable[..., Any]) -> dict[str, str]:
    """The numbers the page's exercises state, as the page writes them (tests/docs/test_teaching_numbers.py finds
    each in the page)."""
    wide = {name: tl for name, _, tl in frontier(simulate, 8)}
    runs = {x: (zbv, dpv) for x, zbv, dpv in communication_runs(simulate)}
    zbv, dpv = runs[EXPENSIVE]
    s = SCHEDULES["dualpipe-v"](8, 8, "never", devices=4)
    pairs = [sum(1 for a, _ in s.pairs if s.device_of(a.stage) == d) for d in range(4)]
    narrow = {name: tl for name, _, tl in frontier(simulate, 4)}
    longer = [simulate(k, beyond_cost(k, EXPENSIVE)) for k in (SCHEDULES[name](16, 8, "never", devices=4)
                                                                for name in ("zb-v", "dualpipe-v"))]

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.3g} ms"

    steps = {name: (one, two) for name, one, two in across_steps(simulate)}
    across = {f"{name} {k}": ms(tl.makespan) for name, (one, two) in steps.items() for k, tl in (("one", one),
                                                                                                  ("two", two))}
    first_ends = {name: ms(max(s.end for s in one.compute_spans(0)) - one.start) for name, (one, _) in steps.items()}
    return {
        **across, "zb-h2 first device ends": first_ends["zb-h2"], "zb-h1 first device ends": first_ends["zb-h1"],
        "zb-h2 per step": ms(steps["zb-h2"][1].makespan - steps["zb-h2"][0].makespan),
        "1f1b p8": ms(wide["1f1b"].makespan), "zb-h1 p8": ms(wide["zb-h1"].makespan),
        "1f1b idle p8": ms(wide["1f1b"].makespan - wide["1f1b"].busy(0)),
        "zb-h1 idle p8": ms(wide["zb-h1"].makespan - wide["zb-h1"].busy(0)),
        "zb-v expensive": f"{zbv.makespan * 1e3:.1f} ms", "dualpipe-v expensive": f"{dpv.makespan * 1e3:.1f} ms",
        "saved": ms(zbv.makespan - dpv.makespan), "pairs": f"{len(s.pairs)} pairs",
        "saved m16": ms(longer[0].makespan - longer[1].makespan),
        "pairs per device": ", ".join(map(str, pairs)),
        "device 0 busy zb-v": ms(zbv.busy(0)), "device 0 busy dualpipe-v": ms(dpv.busy(0)),
        "dualpipe-v peak": f"{peak_a(narrow['dualpipe-v']):.3g} A", "zb-v p4": ms(narrow["zb-v"].makespan),
        "searched p4": ms(narrow["searched"].makespan),
        "round=8 peak": f"{peak_a(narrow['interleaved-1f1b:round=8']):.3g} A",
        "round=4 peak": f"{peak_a(narrow['interleaved-1f1b']):.3g} A",
        "interleaved p4": ms(narrow["interleaved-1f1b"].makespan),
        "1f1b p4": ms(narrow["1f1b"].makespan), "zb-h1 p4": ms(narrow["zb-h1"].makespan),
        "1f1b idle p4": ms(narrow["1f1b"].makespan - narrow["1f1b"].busy(0)),
        "zb-h1 idle p4": ms(narrow["zb-h1"].makespan - narrow["zb-h1"].busy(0)),
    }


def _beyond(simulate: Callable[..., Any], table: Table) -> dict[str, str]:
    rows = [[f"{x * 1e3:g} ms", f"{zbv.makespan * 1e3:.2f} ms", f"{dpv.makespan * 1e3:.2f} ms",
             f"{(zbv.makespan - dpv.makespan) * 1e3:.2f} ms", f"{zbv.bubble_fraction():.1%}",
             f"{dpv.bubble_fraction():.1%}"] for x, zbv, dpv in communication_runs(simulate)]
    out = {"communication_table": table(["communication per F and B", "ZB-V", "DualPipe-V", "DualPipe-V ahead by",
                                         "ZB-V bubble", "DualPipe-V bubble"], rows)}
    out["across_steps_table"] = table(
        ["schedule", "one step", "two steps with a barrier", "two steps without", "each step after the first"],
        [[f"`{name}`", f"{one.makespan * 1e3:.1f} ms", f"{2 * one.makespan * 1e3:.1f} ms",
          f"{two.makespan * 1e3:.1f} ms", f"{(two.makespan - one.makespan) * 1e3:.1f} ms"]
         for name, one, two in across_steps(simulate)])
    for p in (4, 8):
        out[f"frontier_table_p{p}"] = table(
            ["schedule", "makespan", "bubble", "peak activations (A)"],
            [[f"`{name}`", f"{tl.makespan * 1e3:.1f} ms", f"{tl.bubble_fraction():.1%}", f"{peak_a(tl):.3g}"]
             for name, _, tl in frontier(simulate, p)])
    return out


def fragments(simulate: Callable[..., Any], table: Table, plan_result: Any) -> dict[str, str]:
    """Every fragment of the pages past GPipe; ``simulate`` and ``table`` are the site figures'
    (``docs/figures/common.py``), ``plan_result`` the planner's answer for its worked example."""
    out: dict[str, str] = {}
    out.update(_memory(simulate, table))
    out.update(_model_state(table))
    out.update(_activations(table))
    out.update(_traffic(plan_result, table))
    out.update(_balancing(simulate, table))
    out.update(_roofline(table))
    out.update(_beyond(simulate, table))
    return out
