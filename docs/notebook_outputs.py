"""The tutorial notebooks' outputs for the site: each notebook executed once per change of what it runs.

An executed copy of ``tutorials/NN_name.ipynb`` lives in ``docs/img/generated/notebooks/`` (git-ignored) with
the :func:`stamp` of its sources in its metadata. Two things write it: the test that executes every notebook
(``tests/docs/test_notebooks.py`` calls :func:`store` after a run passes) and the docs build (:func:`executed`
runs a notebook whose copy is missing or stale). So CI, which tests before it builds, executes each notebook
once; a build alone executes only what changed; and a page never shows an output its code no longer produces.

Note [stamp]: the stamp hashes the notebook, every ``.py`` under ``gpipe/``, ``sim/`` and ``tutorials/``, and
the matplotlib and torch versions: whatever a cell imports or draws with. Anything else a cell reads (none
does) would have to join it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["CACHE", "STAMP_KEY", "cached", "executed", "execute", "stamp", "store"]

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "docs" / "img" / "generated" / "notebooks"
STAMP_KEY = "gpipe_sim_stamp"
CELL_TIMEOUT = 120  # seconds per cell; the slowest cell takes a few


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


def execute(path: Path) -> Any:
    """Run the notebook at ``path`` top to bottom in this interpreter's ``python3`` kernel, from ``tutorials/``.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell failed (the error names the cell and shows its traceback).
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def executed(path: Path, cache: Path = CACHE) -> dict[str, Any]:
    """The notebook at ``path`` with its outputs: the current executed copy, or a fresh run (then kept)."""
    nb = cached(path, cache)
    if nb is None:
        store(path, execute(path), cache)
        nb = cached(path, cache)
        assert nb is not None
    return nb
