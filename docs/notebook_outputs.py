"""The tutorial notebooks' outputs for the site: each notebook executed once per change of what it runs.

An executed copy of ``tutorials/NN_name.ipynb`` lives in ``docs/img/generated/notebooks/`` (git-ignored) with
the :func:`stamp` of its sources in its metadata. The test of each notebook (``tests/docs/test_notebooks.py``)
and the docs build both ask :func:`executed` for it, which runs a notebook whose copy is missing or stale (Note
[one run per notebook]). So each notebook runs once per change of its sources, in whichever asks first; a build
alone executes only what changed; and a page never shows an output its code no longer produces.

Note [stamp]: the stamp hashes the notebook, every ``.py`` under ``gpipe/``, ``sim/`` and ``tutorials/``, and
the matplotlib and torch versions: whatever a cell imports or draws with. Anything else a cell reads (none
does) would have to join it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["ANSWERS_RUN", "CACHE", "SECONDS_KEY", "STAMP_KEY", "answers", "cached", "executed", "executed_all",
           "execute", "stamp", "store"]

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "docs" / "img" / "generated" / "notebooks"
STAMP_KEY = "gpipe_sim_stamp"
CELL_TIMEOUT = 120  # seconds per cell; the slowest cell takes a few
SECONDS_KEY = "gpipe_sim_seconds"
#: Notebooks whose answers state their numbers as assertions: each answer's ```python block runs after the notebook.
ANSWERS_RUN = frozenset({"01_bubble.ipynb", "02_checkpointing.ipynb", "03_copy_streams.ipynb",
                         "04_executor_vs_simulator.ipynb", "05_capacity_planning.ipynb", "06_ablation.ipynb",
                         "07_own_schedule.ipynb", "08_beyond_1f1b.ipynb", "09_from_scratch.ipynb"})
_ANSWER = re.compile(r"<details><summary>Answer</summary>.*?</details>", re.DOTALL)
_PYTHON = re.compile(r"```python\n(.*?)```", re.DOTALL)


def stamp(path: Path, root: Path = ROOT) -> str:
    """The hash of what the notebook at ``path`` runs (Note [stamp])."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256(path.read_bytes())
    for package in ("matplotlib", "torch"):
        try:
            h.update(f"{package}={version(package)}".encode())
        except PackageNotFoundError:
            h.update(f"{package}=none".encode())
    for folder in ("gpipe", "sim", "tutorials"):
        for p in sorted((root / folder).rglob("*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def cached(path: Path, cache: Path = CACHE) -> dict[str, Any] | None:
    """The executed copy of the notebook at ``path`` if it is there and its stamp is current, else ``None``."""
    copy = cache / path.name
    if not copy.is_file():
        return None
    nb: dict[str, Any] = json.loads(copy.read_text(encoding="utf-8"))
    return nb if nb.get("metadata", {}).get(STAMP_KEY) == stamp(path) else None


def store(path: Path, nb: Any, cache: Path = CACHE) -> Path:
    """Keep ``nb``, the notebook at ``path`` as it was just executed, as its current executed copy.

    Written to a temporary file and renamed, so a reader never sees half a notebook.
    """
    import nbformat

    nb.metadata[STAMP_KEY] = stamp(path)
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    os.replace(tmp, cache / path.name)
    return cache / path.name


def answers(nb: Any) -> list[str]:
    """The code of every answer's ```python blocks in the notebook ``nb``, in order."""
    return [code for c in nb.cells if c.cell_type == "markdown"
            for block in _ANSWER.findall(c.source) for code in _PYTHON.findall(block)]


def execute(path: Path) -> Any:
    """Run the notebook at ``path`` top to bottom in this interpreter's ``python3`` kernel, from ``tutorials/``.

    In the notebooks of :data:`ANSWERS_RUN` the answers' code runs too, after the last cell in the same kernel, and
    is dropped from the result: the site shows the notebook. The seconds the run took are kept in its metadata
    (``SECONDS_KEY``).

    Raises:
        nbclient.exceptions.CellExecutionError: a cell failed (the error names the cell and shows its traceback).
        ValueError: a notebook of :data:`ANSWERS_RUN` whose answers have fewer than three blocks of code.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    cells = len(nb.cells)
    if path.name in ANSWERS_RUN:
        code = answers(nb)
        if len(code) < 3:
            raise ValueError(f"{path.name}: its answers have {len(code)} blocks of code to run, fewer than three")
        nb.cells.extend(nbformat.v4.new_code_cell(c) for c in code)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    del nb.cells[cells:]
    nb.metadata[SECONDS_KEY] = round(time.perf_counter() - t0, 1)
    return nb


def executed(path: Path, cache: Path = CACHE, wait: bool = True) -> dict[str, Any] | None:
    """The notebook at ``path`` with its outputs: the current executed copy, or a fresh run (then kept).

    Note [one run per notebook]: the test run and the docs build both ask for a notebook's executed copy, and
    under pytest-xdist they ask at once (the site's build and the notebooks' tests start first, on two workers).
    A lock per notebook makes the second asker wait for the first's run and read its copy, so each notebook runs
    once per change of its sources, with its answers, whichever asks first. ``wait=False``: ``None`` at once
    where another process holds the notebook's lock.
    """
    from filelock import FileLock, Timeout

    cache.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(cache / f"{path.name}.lock"), timeout=-1 if wait else 0):
            nb = cached(path, cache)
            if nb is None:
                store(path, execute(path), cache)
                nb = cached(path, cache)
                assert nb is not None
            return nb
    except Timeout:
        return None


def executed_all(paths: list[Path], cache: Path = CACHE) -> dict[str, dict[str, Any]]:
    """:func:`executed` for each notebook, by file name; one that another process is running is taken last, so
    this process runs the others meanwhile (Note [one run per notebook])."""
    done = {p.name: nb for p in paths if (nb := executed(p, cache, wait=False)) is not None}
    for path in paths:
        if path.name not in done:
            nb = executed(path, cache)
            assert nb is not None
            done[path.name] = nb
    return done
