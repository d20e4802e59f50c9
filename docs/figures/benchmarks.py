"""The tables of "Benchmarks" (docs/benchmarks.md): each benchmark's JSON results, read anew at every build."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from figures.common import ROOT, md_table

BENCHMARKS = ("sim_speed", "executor_speed", "executor_speed_large", "executor_speed_wide", "schedule_speed",
              "split_cost", "distributed_speed", "gloo_directions", "rng_cost", "fidelity", "fidelity_quick",
              "fidelity_gaps", "step_spread", "fidelity_processes", "switch_interval",
              "pair_probes", "gpu_check", "fidelity_cuda", "published", "unet_memory", "cpu_check", "plan_speed")
#: Other pages' fragments of a benchmark's results, by name: each a function of the results folder, called at every
#: build as the tables above are read (docs/figures/moe.py registers DeepSeek-V3's).
RESULT_FRAGMENTS: dict[str, Callable[[Path], str]] = {}


def benchmark_fragments(results: Path | None = None) -> dict[str, str]:
    """``bench_NAME`` for each benchmark: its JSON results as tables, or how to produce them."""
    folder = results if results is not None else ROOT / "benchmarks" / "results"
    out = {}
    for name in BENCHMARKS:
        path = folder / f"{name}.json"
        if path.exists():
            out[f"bench_{name}"] = render_result(path)
        else:
            found = (ROOT / "benchmarks" / "investigations" / f"{name}.py").exists()
            module = f"benchmarks.investigations.{name}" if found else f"benchmarks.{name}"
            out[f"bench_{name}"] = (f"*No results yet.* Run `.venv/bin/python -m {module}` to produce "
                                    f"`benchmarks/results/{name}.json`; the next site build renders it here.")
    out.update({name: render(folder) for name, render in RESULT_FRAGMENTS.items()})
    return out


def render_result(path: Path) -> str:
    """A benchmark's JSON as markdown: its command and machine, then a table of its rows.

    Understood shapes: an object with ``rows`` (a list of objects) and optional ``command``,
    ``machine`` (a string or an object) and ``note``; or a bare list of objects. Columns that hold lists
    or objects (raw samples, such as each step's makespan) stay in the JSON and out of the table.
    Anything else is shown as JSON.
    """
    import json

    data = json.loads(path.read_text())
    parts: list[str] = []
    rows = data if isinstance(data, list) else data.get("rows") if isinstance(data, dict) else None
    if isinstance(data, dict):
        if "command" in data:
            parts.append(f"Command: `{data['command'].strip()}`" + (f" ({data['date']})" if "date" in data else ""))
        machine = data.get("machine")
        if isinstance(machine, dict):
            parts.append("Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
        elif machine:
            parts.append(f"Machine: {machine}")
        if data.get("note"):
            parts.append(str(data["note"]))
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        header = [k for k in dict.fromkeys(k for r in rows for k in r)
                  if not any(isinstance(r.get(k), (list, dict)) for r in rows)]
        parts.append(md_table(header, [[_cell(r.get(k, "")) for k in header] for r in rows]))
    else:
        parts.append("```json\n" + json.dumps(data, indent=1)[:4000] + "\n```")
    return "\n\n".join(parts)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")
