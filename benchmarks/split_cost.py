"""What the split backward costs: ``B`` + ``W`` against one whole backward of the same stage, and every schedule's step
against 1F1B's, on the fidelity grid's two models (conv: compute-heavy; mlp: 64 x Linear(64), host-bound).

Two tables per model::

    split       each stage of a two-stage cut (ZB-H1's), one micro-batch (batch 64 / --chunks): the seconds of a
                whole backward (``torch.autograd.backward``), and of ``B`` and ``W`` as the executor runs them once
                the stage's plan is learnt (Note [learnt split] in gpipe.autograd.split_backward); ``learning`` is the
                same with the plan learnt afresh (a stage's first micro-batch, and the first after its graph changes:
                Note [plans across steps]). Ratio: (B + W) / backward, the median of per-round ratios.
    schedules   every registered schedule's step (``GPipe.step``, MSE loss, two CPU devices, one worker each,
                checkpoint never), as the median of per-round ratios to 1F1B's step; the split schedules also
                against interleaved 1F1B's. Each pipe's gradients are checked equal to the plain model's first.

Note [before and after]: ``--baseline REV`` loads ``gpipe/autograd/split_backward.py`` as it was at git revision REV (it
imports torch alone) and times it in the same rounds, as ``before`` rows: in the split table its ``B`` and ``W``; in the
schedules table the split schedules' steps with it in the executor's place (``gpipe.autograd.gradients.backward_input``
swapped for that step, in this process only). Its plans live as the executor of REV kept them: across steps where REV's
module has ``StagePlans``, for one step where it has ``SplitPlans`` alone, none (learnt every ``B``) before that. Ratios
within one run are what this shared machine can compare, so the mode stays in this script rather than an
investigation of its own: a second script would time the current split again. Its finding: plans kept across steps
make the split schedules 3-4% faster than ``f1a86ff``'s on ``mlp`` and no slower on ``conv`` (docs/benchmarks.md,
"Split backward").

Note [the floor]: the ``unsplit`` rows run each split schedule with a ``B`` that is the whole backward and a ``W``
that does nothing: the schedule's own step with a split that costs nothing, which bounds what any split can reach.

Set deliberately, and recorded: ``OMP_NUM_THREADS=1`` before torch loads and ``torch.set_num_threads(1)``, so each
worker thread computes on one core (Note [threads] in _shared/machine.py); the partitions are cut by
``balance_by_time`` as ``fidelity.py`` cuts them; workers are not pinned.

Run: ``.venv/bin/python -m benchmarks.split_cost --baseline REV`` (about two minutes on two cores) or ``--quick``;
writes ``benchmarks/results/split_cost.json``, whose ``rows`` (the schedules tables, flat) the docs render.
"""

from __future__ import annotations

import copy
import gc
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks._shared.machine import THREADS, omp_threads, set_threads

omp_threads()  # before torch loads: see the module docstring

import torch  # noqa: E402
from torch import nn  # noqa: E402

import gpipe.autograd.gradients  # noqa: E402
from benchmarks._shared import options  # noqa: E402
from benchmarks._shared.fidelity import BATCH, MODELS, stages_for  # noqa: E402
from benchmarks._shared.record import command_line, results_path, write_json  # noqa: E402
from benchmarks._shared.rounds import Runner, interleaved  # noqa: E402
from benchmarks._shared.workload import gradients_match, pipe_step  # noqa: E402
from gpipe import GPipe, microbatch  # noqa: E402
from gpipe.autograd.split_backward import SplitPlans, backward_input  # noqa: E402
from gpipe.balance import balance_by_time  # noqa: E402
from gpipe.schedule import SCHEDULES, schedule_kind  # noqa: E402
from sim.calibration.calibrate import partitions_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = results_path("split_cost")
DEVICES = 2
Split = Callable[..., tuple[list[torch.Tensor | None], Any]]  # gpipe.autograd.split_backward.backward_input's signature


def baseline(rev: str) -> ModuleType:
    """``gpipe/autograd/split_backward.py`` at git revision ``rev``, as a module of its own (Note [before and
    after])."""
    # where it lives, and where it lived before
    for path in ("gpipe/autograd/split_backward.py", "gpipe/autograd/split.py", "gpipe/split.py"):
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"split_cost: revision {rev} has no gpipe/autograd/split_backward.py (nor an earlier home)")
    source = shown.stdout
    spec = importlib.util.spec_from_loader("split_baseline", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102 - our own file, at rev
    return module


class _Nothing:
    """The ``W`` of Note [the floor]."""

    groups: list[Any] = []

    def accumulate(self) -> None:
        return None


def unsplit(outputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
            params: Sequence[torch.Tensor], plans: Any = None) -> tuple[list[torch.Tensor | None], Any]:
    """Note [the floor]: ``B`` is the whole backward (into ``.grad``, where ``W`` would put it), ``W`` nothing."""
    wanted = [*inputs, *params]
    if wanted:
        torch.autograd.backward(list(outputs), list(grads), inputs=wanted)
    return [t.grad for t in inputs], _Nothing()


class OldSplit:
    """REV's ``backward_input`` in the executor's place, with its plans kept as REV's executor kept them (Note
    [before and after]): one of REV's ``SplitPlans`` per one of ours, dropped at each step (:meth:`step`) where REV's
    plans lasted one step."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.learns = hasattr(module, "SplitPlans")
        self.per_step = self.learns and not hasattr(module, "StagePlans")
        self.theirs: dict[int, tuple[Any, Any]] = {}  # by id of our plans: (ours, kept so the id stays theirs; REV's)

    def __call__(self, outputs: Any, grads: Any, inputs: Any, params: Any, plans: Any = None) -> Any:
        if not self.learns or plans is None:
            return self.module.backward_input(outputs, grads, inputs, params)
        held = self.theirs.get(id(plans))
        if held is None:
            held = self.theirs[id(plans)] = (plans, self.module.SplitPlans(plans.params))
        return self.module.backward_input(outputs, grads, inputs, params, held[1])

    def step(self, step: Callable[[], object]) -> Callable[[], object]:
        """``step``, after dropping REV's plans where they lasted one step."""
        def run() -> object:
            if self.per_step:
                self.theirs.clear()
            return step()
        return run


# -- B + W against one backward ----------------------------------------------------------------------------


def split_rows(model: nn.Sequential, batch: torch.Tensor, balance: Sequence[int], rows: int, rounds: int,
               before: ModuleType | None) -> list[dict[str, Any]]:
    """Per stage of ``balance``: the median seconds of a whole backward, and of B and W of each split, and the
    median per-round ratio (B + W) / backward (Note [before and after])."""
    parts = partitions_of(model, list(balance))
    results = []
    for j, part in enumerate(parts):
        x = batch[:rows]
        with torch.no_grad():
            for earlier in parts[:j]:
                x = earlier(x)
        stage_input = x.detach()
        params = [p for p in part.parameters() if p.requires_grad]
        plans = SplitPlans(params)
        grad = torch.randn_like(part(stage_input))

        def forward() -> tuple[list[torch.Tensor], torch.Tensor]:
            leaf = stage_input.detach().requires_grad_(j > 0)  # noqa: B023
            return ([leaf] if j > 0 else []), part(leaf)  # noqa: B023

        def whole() -> tuple[float, float]:
            _, out = forward()
            start = time.perf_counter()
            torch.autograd.backward([out], [grad])  # noqa: B023
            return time.perf_counter() - start, 0.0

        def timed(split: Split, fresh: bool) -> Callable[[], tuple[float, float]]:
            def b_and_w() -> tuple[float, float]:
                inputs, out = forward()
                start = time.perf_counter()
                _, kept = split([out], [grad], inputs, params, None if fresh else plans)  # noqa: B023
                middle = time.perf_counter()
                kept.accumulate()
                return middle - start, time.perf_counter() - middle
            return b_and_w

        kinds: dict[str, Callable[[], tuple[float, float]]] = {
            "backward": whole, "split": timed(backward_input, False), "learning": timed(backward_input, True)}
        if before is not None:
            kinds["before"] = timed(OldSplit(before), False)
        samples: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for run in kinds.values():  # warm-up; the plan is learnt here
            run()
        gc.collect()
        order = random.Random(j)
        for _ in range(rounds):
            for kind in order.sample(list(kinds), len(kinds)):
                samples[kind].append(kinds[kind]())
        part.zero_grad(set_to_none=True)
        whole_s = [b for b, _ in samples["backward"]]
        row: dict[str, Any] = {"stage": j, "layers": len(part),
                               "backward_us": round(statistics.median(whole_s) * 1e6, 1)}
        for kind in kinds:
            if kind == "backward":
                continue
            b = [x for x, _ in samples[kind]]
            w = [y for _, y in samples[kind]]
            row[kind] = {"b_us": round(statistics.median(b) * 1e6, 1), "w_us": round(statistics.median(w) * 1e6, 1),
                         "vs_backward": round(statistics.median((x + y) / z for x, y, z in zip(b, w, whole_s,
                                                                                                 strict=True)), 3)}
        results.append(row)
    return results


# -- every schedule's step ------------------------------------------------------------------------------------


def swapped(split: Split, step: Callable[[], object]) -> Callable[[], object]:
    """``step`` with ``split`` in the executor's place (Note [before and after]; Note [the floor])."""
    def run() -> object:
        ours = gpipe.autograd.gradients.backward_input
        gpipe.autograd.gradients.backward_input = split  # type: ignore[assignment]
        try:
            return step()
        finally:
            gpipe.autograd.gradients.backward_input = ours
    return run


def schedule_rows(model: nn.Sequential, batch: torch.Tensor, balances: dict[int, tuple[int, ...]], chunks: int,
                  names: Sequence[str], rounds: int,
                  before: ModuleType | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Every schedule's step as a ratio to 1F1B's and to interleaved 1F1B's, per-round medians."""
    torch.manual_seed(1)
    y = torch.randn_like(model(batch)).detach()
    runners: list[Runner] = []
    notes = []
    for name in names:
        stages = stages_for(name)
        try:
            pipe = GPipe(copy.deepcopy(model), list(balances[stages]), devices=["cpu"] * DEVICES, chunks=chunks,
                         checkpoint="never", schedule=name)
        except ValueError as error:
            notes.append(f"{name}: not run ({str(error).splitlines()[0]})")
            continue
        if not gradients_match(copy.deepcopy(model), pipe, batch, y, step=pipe_step):
            raise SystemExit(f"gpipe.GPipe ({name}) does not match the plain model")

        def stepped(p: GPipe = pipe) -> object:
            return pipe_step(p, batch, y)

        runners.append(Runner(name, stepped, []))
        if pipe.schedule.splits_weight_gradient:
            runners.append(Runner(f"{name} unsplit", swapped(unsplit, stepped), []))
            if before is not None:
                old = OldSplit(before)
                runners.append(Runner(f"{name} before", old.step(swapped(old, stepped)), []))
    interleaved(runners, 3, rounds)
    samples = {r.name: r.samples for r in runners}

    def ratio(a: str, b: str) -> float | None:
        if a not in samples or b not in samples:
            return None
        return round(statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True)), 3)

    rows = []
    for runner in runners:
        if " " in runner.name:
            continue
        name = runner.name
        row: dict[str, Any] = {"schedule": name, "ms": round(statistics.median(runner.samples) * 1e3, 3),
                               "vs_1f1b": ratio(name, "1f1b"), "vs_interleaved": ratio(name, "interleaved-1f1b")}
        for variant in ("before", "unsplit"):
            if f"{name} {variant}" in samples:
                row[variant] = {"ms": round(statistics.median(samples[f"{name} {variant}"]) * 1e3, 3),
                                "vs_1f1b": ratio(f"{name} {variant}", "1f1b"),
                                "vs_interleaved": ratio(f"{name} {variant}", "interleaved-1f1b")}
        if f"{name} before" in samples:
            row["vs_before"] = ratio(name, f"{name} before")
        rows.append(row)
    return rows, notes


def goals(model: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goals, each with its measured ratio: on mlp ZB-H1 <= 1F1B, ZB-V and DualPipeV <= interleaved
    1F1B (with the floor of Note [the floor] beside); on conv each split schedule no slower than before."""
    by = {r["schedule"]: r for r in rows}
    found: list[dict[str, Any]] = []
    for name, against, key in (("zb-h1", "1f1b", "vs_1f1b"), ("zb-v", "interleaved-1f1b", "vs_interleaved"),
                               ("dualpipe-v", "interleaved-1f1b", "vs_interleaved")):
        row = by.get(name)
        if row is None:
            continue
        if model == "mlp" and row[key] is not None:
            found.append({"goal": f"{name} <= {against}", "ratio": row[key], "met": row[key] <= 1.0,
                          "before": row.get("before", {}).get(key), "floor": row.get("unsplit", {}).get(key)})
        elif model != "mlp" and row.get("vs_before") is not None:
            found.append({"goal": f"{name} <= before", "ratio": row["vs_before"], "met": row["vs_before"] <= 1.0})
    return found


def flat_rows(models: dict[str, Any]) -> list[dict[str, Any]]:
    """The schedules tables of every model as one list of flat rows (the docs render it as a table)."""
    rows = []
    for model, found in models.items():
        for row in found["schedules"]:
            flat = {"model": model, "schedule": row["schedule"], "step_ms": row["ms"], "vs_1f1b": row["vs_1f1b"],
                    "vs_interleaved": row["vs_interleaved"]}
            for variant in ("before", "unsplit"):
                if variant in row:
                    flat[f"{variant}_vs_1f1b"] = row[variant]["vs_1f1b"]
                    flat[f"{variant}_vs_interleaved"] = row[variant]["vs_interleaved"]
            if "vs_before" in row:
                flat["vs_before"] = row["vs_before"]
            rows.append(flat)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = options.parser(__doc__)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--chunks", type=int, default=8, help="micro-batches per step (default 8)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="registered schedules (default: all)")
    parser.add_argument("--baseline", default=None,
                        help="git revision whose gpipe/autograd/split_backward.py gives the before rows "
                             "(Note [before and after])")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the schedules table (default 40)")
    parser.add_argument("--split-rounds", type=int, default=None, help="rounds of the split table (default 200)")
    options.add_quick(parser, "few rounds (a smoke test)")
    options.add_out(parser, RESULTS)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    names = [s for s in args.schedules.split(",") if s]
    for name in names:
        schedule_kind(name)
    if "1f1b" not in names:
        parser.error("--schedules needs 1f1b, which the ratios are to")
    rounds = args.rounds or (3 if args.quick else 40)
    split_rounds = args.split_rounds or (10 if args.quick else 200)
    set_threads(THREADS)  # Note [threads] in _shared.machine
    before = baseline(args.baseline) if args.baseline else None
    rows_per_microbatch = microbatch.sizes(BATCH, args.chunks)[0]
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, {THREADS} thread per worker; batch {BATCH}, chunks "
          f"{args.chunks}; baseline {args.baseline or '-'}", flush=True)
    doc: dict[str, Any] = {
        "baseline": args.baseline, "batch": BATCH, "chunks": args.chunks, "rounds": rounds,
        "split_rounds": split_rounds, "models": {}}
    for name in models:
        model, batch = MODELS[name](0)
        micro = batch[:microbatch.sizes(BATCH, 4)[0]]
        balances = {n: tuple(balance_by_time(n, model, micro, timeout=2.0, device="cpu"))
                    for n in sorted({stages_for(s) for s in names})}
        print(f"\n{name}: balances {balances}", flush=True)
        split = split_rows(model, batch, balances[DEVICES], rows_per_microbatch, split_rounds, before)
        print(f"{'stage':>5} {'layers':>6} {'backward us':>12} " + " ".join(
            f"{k + ' B+W us':>16} {'ratio':>6}" for k in split[0] if isinstance(split[0][k], dict)))
        for row in split:
            cells = [f"{row[k]['b_us'] + row[k]['w_us']:16.0f} {row[k]['vs_backward']:6.2f}"
                     for k in row if isinstance(row[k], dict)]
            print(f"{row['stage']:>5} {row['layers']:>6} {row['backward_us']:12.0f} " + " ".join(cells), flush=True)
        schedules, notes = schedule_rows(model, batch, balances, args.chunks, names, rounds, before)
        print(f"\n{'schedule':16s} {'ms':>7s} {'/1f1b':>6s} {'/inter':>6s}  {'before:':7s} {'/1f1b':>6s} "
              f"{'/inter':>6s}  {'unsplit:':8s} {'/1f1b':>6s} {'/inter':>6s}  {'/before':>7s}")
        for row in schedules:
            def cell(value: float | None, width: int = 6) -> str:
                return f"{value:{width}.3f}" if value is not None else f"{'-':>{width}s}"
            before_row, floor_row = row.get("before", {}), row.get("unsplit", {})
            print(f"{row['schedule']:16s} {row['ms']:7.2f} {cell(row['vs_1f1b'])} {cell(row['vs_interleaved'])}  "
                  f"{'':7s} {cell(before_row.get('vs_1f1b'))} {cell(before_row.get('vs_interleaved'))}  {'':8s} "
                  f"{cell(floor_row.get('vs_1f1b'))} {cell(floor_row.get('vs_interleaved'))}  "
                  f"{cell(row.get('vs_before'), 7)}", flush=True)
        for note in notes:
            print("note:", note)
        met = goals(name, schedules)
        for goal in met:
            extra = ", ".join(f"{k} {goal[k]:.3f}" for k in ("before", "floor") if goal.get(k) is not None)
            print(f"goal {goal['goal']}: {goal['ratio']:.3f} {'met' if goal['met'] else 'missed'}"
                  + (f" ({extra})" if extra else ""))
        doc["models"][name] = {"balances": {str(k): list(v) for k, v in balances.items()},
                               "rows_per_microbatch": rows_per_microbatch, "split": split,
                               "schedules": schedules, "notes": notes, "goals": met}
    doc["rows"] = flat_rows(doc["models"])
    doc["note"] = ("Each schedule's step and its ratios to 1F1B's and interleaved 1F1B's (medians of per-round "
                   "ratios); before: gpipe/autograd/split_backward.py at the baseline revision; unsplit: a split "
                   "that costs nothing (Note [the floor]). B + W against a whole backward: models.<model>.split.")
    write_json(args.out, doc, command=command_line(__file__, argv), machine={"threads_per_worker": THREADS})
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
