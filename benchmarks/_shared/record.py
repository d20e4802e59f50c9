"""What a benchmark writes: its results as JSON, stamped with the command that produced them, the date and the machine.

The docs render each ``benchmarks/results/NAME.json`` (``docs/figures/benchmarks.py``: ``render_result``) from its
``command``, ``date``, ``machine``, ``note`` and ``rows``; :func:`write_json` sets the first three, the script the rest.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpipe.schedule.size import replace_file

from .machine import facts

__all__ = ["BENCHMARKS", "RESULTS", "STAMPS", "command_line", "results_path", "utc_now", "write_json"]

BENCHMARKS = Path(__file__).resolve().parents[1]  # the package the scripts are modules of
RESULTS = BENCHMARKS / "results"
STAMPS = ("command", "date", "machine")  # the keys write_json sets


def results_path(name: str) -> Path:
    """Where the benchmark ``name`` writes by default: ``benchmarks/results/NAME.json``."""
    return RESULTS / f"{name}.json"


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that runs ``script`` (a benchmark's ``__file__``) with ``argv`` (this process's arguments when
    ``None``) as a module, from the repository's root, as the docs show it: ``.venv/bin/python -m benchmarks.NAME``.

    Raises:
        ValueError: ``script`` is not a file of the benchmarks package.
    """
    module = Path(script).resolve().with_suffix("").relative_to(BENCHMARKS.parent)
    words = list(sys.argv[1:] if argv is None else argv)
    return " ".join([f".venv/bin/python -m {'.'.join(module.parts)}", *map(shlex.quote, words)])


def utc_now() -> str:
    """The date and time now, UTC, to the minute: ``2026-12-06 08:28 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write_json(path: Path, payload: Mapping[str, Any], *, command: str,
               machine: Mapping[str, Any] | None = None) -> Path:
    """Write ``payload`` to ``path`` as JSON (one space of indent, a final newline), stamped first with ``command``,
    ``date`` (:func:`utc_now`) and ``machine``: :func:`_shared.machine.facts` and then ``machine``, what the script
    itself records of the machine (the threads it set, its GPUs). The file is written whole or not at all (a
    ``.tmp`` beside it, then renamed), so one rewritten after every row is never left half written.

    Raises:
        ValueError: ``payload`` holds a key the stamp sets, or ``machine`` one of the facts: neither is overwritten.
        TypeError: ``payload`` holds what JSON cannot (nothing is written then).
    """
    clash = [key for key in STAMPS if key in payload]
    if clash:
        raise ValueError(f"{path.name}: the payload sets {', '.join(clash)}, which write_json stamps; "
                         "pass the command as command= and the script's own machine facts as machine=")
    found = facts()
    clash = [key for key in (machine or {}) if key in found]
    if clash:
        raise ValueError(f"{path.name}: machine= sets {', '.join(clash)}, which the machine's facts hold already")
    doc = {"command": command, "date": utc_now(), "machine": {**found, **(machine or {})}, **payload}
    text = json.dumps(doc, indent=1) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_file(path, lambda tmp: tmp.write_text(text))  # Note [written whole] in gpipe.schedule.size
