"""``gpipe-sim plan``'s tables: a plan's rows, fastest first, and the buyer's answers, each configuration in words."""

from __future__ import annotations

from typing import Any

from sim.planning.buyer import Answer
from sim.planning.plan import Plan, PlanRow

__all__ = ["describe", "gib", "print_answers", "print_table"]

GiB = 2**30


def gib(n: float) -> str:
    return f"{n / GiB:.1f}"


def _number(value: float | None, spec: str, width: int) -> str:
    """``value`` formatted, or a dash for a configuration that was not simulated (Note [not simulated])."""
    if value is None or value != value:  # None or NaN
        return f"{'-':>{width}}"
    return f"{value:>{width}{spec}}"


def _columns(result: Plan, width: int) -> list[tuple[str, int, Any]]:
    """The table's columns: (title, width, row -> text); a dimension the plan does not vary is left out."""
    rows = result.rows
    tp = any(r.tensor_parallel > 1 for r in rows)  # the table of a plan without one keeps its columns
    cp = any(r.context_parallel > 1 for r in rows)
    cols: list[tuple[str, int, Any]] = [
        ("gpus", 4, lambda r: f"{r.gpus:>4}"),
        _layout(tp, cp),
        ("chunks", 6, lambda r: f"{r.chunks:>6}"),
        ("mb", 5, lambda r: f"{r.microbatch:>5}"),
        ("checkpoint", 11, lambda r: f"{r.checkpoint:>11}"),
        ("sched", width, lambda r: f"{r.schedule:>{width}}"),
        ("v", 2, lambda r: f"{r.virtual:>2}"),
    ]
    if any(r.zero for r in rows):  # ZeRO-3 kept gathered through the step: 3k; hybrid sharding: /group
        cols.append(("zero", 6, lambda r: f"{_zero(r):>6}"))
    if any(r.sequence_parallel for r in rows):
        cols.append(("sp", 3, lambda r: f"{'on' if r.sequence_parallel else 'off':>3}"))
    if result.expert_imbalance is not None:  # a mixture of experts: its layout and its all-to-all, per step a device
        cols += [("ep", 6, lambda r: f"{_experts(r):>6}"),
                 ("a2a (s)", 8, lambda r: _number(r.all_to_all_seconds if r.simulated else None, ".4g", 8)),
                 ("exposed", 8, lambda r: _number(r.all_to_all_exposed_seconds if r.simulated else None, ".4g", 8))]
    cols.append(("samples/s", 11, lambda r: _number(r.throughput, ".2f", 11)))
    if any(r.tokens_per_second for r in rows):
        cols.append(("tokens/s", 10, lambda r: _number(r.tokens_per_second, ".4g", 10)))
    if any(r.mfu for r in rows):
        cols.append(("MFU", 5, lambda r: _number(None if r.mfu is None else 100 * r.mfu, ".1f", 5)))
    cols += [("step (s)", 9, lambda r: _number(r.step_seconds, ".4g", 9)),
             ("bubble", 6, lambda r: _number(r.bubble_fraction, ".1%", 6)),
             ("GiB/dev", 8, lambda r: f"{gib(r.peak_memory_bytes):>8}"),
             ("fits", 4, lambda r: f"{'yes' if r.fits else 'OOM':>4}")]
    if any(r.bound for r in rows):
        cols.append(("bound", 15, lambda r: f"{r.bound:>15}"))
    if result.price_per_gpu_hour is not None:
        cols.append(("$/M samp", 9, lambda r: _number(r.cost_per_million, ".2f", 9)))
    return cols


#: The layout column's titles, each left-aligned.
_LAYOUTS = ("tp x cp x pp x dp", "tp x pp x dp", "pp x dp")


def _layout(tp: bool, cp: bool) -> tuple[str, int, Any]:
    """The layout column: ``pp x dp``, after ``tp`` where a row splits its layers, and ``cp`` where its sequence."""
    if cp:
        return _LAYOUTS[0], 17, lambda r: (f"{r.tensor_parallel:>2}x{r.context_parallel:>3}x{r.stages:>3}"
                                           f"x{r.replicas:<6}")
    if tp:
        return _LAYOUTS[1], 10, lambda r: f"{r.tensor_parallel:>2}x{r.stages:>3}x{r.replicas:<3}"
    return _LAYOUTS[2], 7, lambda r: f"{r.stages:>3}x{r.replicas:<3}"


def _balance(r: PlanRow) -> str:
    text = ",".join(map(str, r.balance))
    return text if len(text) <= 28 else text[:25] + "..."


def _order(r: PlanRow) -> tuple[bool, float]:
    """Fitting rows first, fastest first; then the rest, smallest peak first (they have no speed)."""
    return (not r.fits, -r.throughput if r.fits else float(r.peak_memory_bytes))


def print_table(result: Plan, top: int) -> None:
    """Print the plan as a table, fastest first, ``top`` rows (the best row always among them)."""
    rows = sorted(result.rows, key=_order)
    shown = rows if top <= 0 else rows[:top]
    if result.best is not None and result.best not in shown:
        shown.append(result.best)
    fitting = sum(r.fits for r in result.rows)
    print(f"{result.model}: batch {result.batch} on {result.device} ({gib(result.device_memory_bytes)} GiB), "
          f"link {result.link}{f', network {result.network}' if result.network else ''}, training {result.training}"
          + (f", expert imbalance {result.expert_imbalance:g}"
             f"{' (balanced routing)' if result.expert_imbalance == 1 else ''}"
             if result.expert_imbalance is not None else "")
          + f"; {len(result.rows) + result.skipped} configurations, {fitting} fit"
          + (f", {result.skipped} skipped (slower at their compute alone than the fastest shown)"
             if result.skipped else ""))
    cols = _columns(result, max(5, *(len(r.schedule) for r in shown)))
    print("  " + " ".join(f"{title:>{w}}" if title not in _LAYOUTS else f"{title:<{w}}"
                          for title, w, _ in cols) + "  balance")
    for r in shown:
        print(f"{'*' if r.best else ' '} " + " ".join(cell(r) for _, _, cell in cols) + f"  {_balance(r)}")
    if len(shown) < len(rows) + result.skipped:
        print(f"  ... {len(rows) + result.skipped - len(shown)} more (--top 0 shows and evaluates all, --json gives "
              "every row)")
    for name, why in result.missing.items():
        print(f"{name}: no configuration ran ({why})")
    for g in result.searches:
        c = g.configuration
        where = f"{c['stages']} stages x {c['replicas']} replicas, {c['chunks']} chunks, v {c['virtual']}"
        if c["tensor_parallel"] > 1:
            where = f"tensor parallel {c['tensor_parallel']}, " + where
        if c.get("context_parallel", 1) > 1:
            where = f"context parallel {c['context_parallel']}, " + where
        found = "" if g.searched_step is None else f" -> searched {g.searched_step:.6g} s ({g.gain:+.1%} throughput)"
        print(f"search, {where}: {g.named} {g.named_step:.6g} s/step{found}; {g.method}")
    best = result.best
    if best is None:
        print("nothing fits in device memory: try more GPUs, more chunks with checkpointing, or a smaller batch")
    else:
        print(f"best: {describe(best)}")


def describe(r: PlanRow) -> str:
    """One configuration in words, with its speed."""
    virtual = f" ({r.virtual} stages per device)" if r.virtual > 1 else ""
    split = f"tensor parallel {r.tensor_parallel}{' with sequence parallelism' if r.sequence_parallel else ''} x " \
        if r.tensor_parallel > 1 else ""
    split += f"context parallel {r.context_parallel} x " if r.context_parallel > 1 else ""
    zero = f", ZeRO-{r.zero}" if r.zero else ""
    if r.expert_parallel * r.expert_tensor_parallel > 1:
        zero += f", expert parallel {_experts(r)}"
    if r.all_to_all_seconds:
        zero += f" (all-to-all {r.all_to_all_seconds:.3g} s a step, {r.all_to_all_exposed_seconds:.3g} s exposed)"
    if r.zero == 3 and not r.reshard_after_forward:
        zero += " (gathered once a step)"
    if r.zero and r.shard_group is not None:
        zero += f" sharded in groups of {r.shard_group} replicas"
    tokens = f", {r.tokens_per_second:,.0f} tokens/s" if r.tokens_per_second else ""
    mfu = f", MFU {r.mfu:.1%}" if r.mfu else ""
    return (f"{r.gpus} GPUs as {split}{r.stages} stages x {r.replicas} replicas{zero}, {r.chunks} chunks, "
            f"{r.schedule}{virtual}, checkpoint {r.checkpoint}: {r.throughput:.2f} samples/s{tokens}{mfu}")


def print_answers(answers: list[Answer]) -> None:
    first = answers[0].plan
    tokens = first.tokens_per_sample
    goal = f"{answers[0].target * tokens:,.0f} tokens/s ({answers[0].target:g} samples/s)" if tokens else \
        f"{answers[0].target:g} samples/s"
    print(f"{first.model}: batch {first.batch}, target {goal}; the cheapest configuration per device that reaches it "
          "and fits")
    for a in answers:
        r = a.row
        if r is None:
            print(f"  {a.plan.device}: nothing tried reaches the target and fits (try more --gpus)")
            continue
        cost = f", ${a.dollars_per_hour:.2f}/h, ${r.cost_per_million:.2f} per million samples" \
            if a.dollars_per_hour is not None and r.cost_per_million is not None else ""
        print(f"  {a.plan.device}: {describe(r)}, {gib(r.peak_memory_bytes)} GiB peak per device{cost}")


def _experts(r: PlanRow) -> str:
    """The ep column: the expert-parallel degree, ``/etp`` where each expert is split over tensor-parallel ranks."""
    return f"{r.expert_parallel}{f'/{r.expert_tensor_parallel}' if r.expert_tensor_parallel > 1 else ''}"


def _zero(r: PlanRow) -> str:
    """The zero column: the stage, ``k`` where ZeRO-3 keeps its layers gathered through the step, ``/g`` for a hybrid
    sharding group of ``g`` replicas."""
    kept = "k" if r.zero == 3 and not r.reshard_after_forward else ""
    group = f"/{r.shard_group}" if r.zero and r.shard_group is not None else ""
    return f"{r.zero}{kept}{group}"
