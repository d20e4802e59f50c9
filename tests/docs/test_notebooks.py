"""Every tutorial notebook runs top to bottom in this venv's kernel, and matches its source in make_notebooks.py.

A run that passes is kept as the notebook's executed copy, whose outputs the site shows (docs/notebook_outputs.py).
In the notebooks of :data:`ANSWERS_RUN` the answers' code runs too, after the notebook, in its kernel.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = 60  # seconds per cell; the notebooks take seconds in all
BUDGET = 120  # seconds per notebook on two CPU cores, as the tutorials promise
#: Notebooks whose answers state their numbers as assertions: each answer's ```python block runs after the notebook.
ANSWERS_RUN = {"08_beyond_1f1b.ipynb", "09_from_scratch.ipynb"}
_ANSWER_CODE = re.compile(r"<details><summary>Answer</summary>.*?</details>", re.DOTALL)
_PYTHON = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _outputs() -> ModuleType:
    """``docs/notebook_outputs.py``: where an executed notebook is kept for the site."""
    if "notebook_outputs" in sys.modules:
        return sys.modules["notebook_outputs"]
    spec = importlib.util.spec_from_file_location("notebook_outputs", ROOT / "docs" / "notebook_outputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["notebook_outputs"] = module
    spec.loader.exec_module(module)
    return module


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_notebooks", TUTORIALS / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _answers(nb: nbformat.NotebookNode) -> list[str]:
    """The code of every answer's ```python blocks, in order."""
    return [code for c in nb.cells if c.cell_type == "markdown"
            for block in _ANSWER_CODE.findall(c.source) for code in _PYTHON.findall(block)]


def test_there_are_notebooks() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"01_bubble.ipynb", "02_checkpointing.ipynb", "03_copy_streams.ipynb", "04_executor_vs_simulator.ipynb",
            "05_capacity_planning.ipynb", "06_ablation.ipynb", "07_own_schedule.ipynb",
            "08_beyond_1f1b.ipynb", "09_from_scratch.ipynb"} <= names
    assert ANSWERS_RUN <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_matches_its_source(path: Path) -> None:
    """The committed file is what ``tutorials/make_notebooks.py`` writes: edit there, then run it."""
    gen = _generator()
    assert path.name in gen.NOTEBOOKS, f"{path.name} is not in tutorials/make_notebooks.py"
    assert path.read_text(encoding="utf-8") == gen.render(path.name), (
        f"{path.name} differs from tutorials/make_notebooks.py: run `.venv/bin/python tutorials/make_notebooks.py`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_exercises_with_hidden_answers(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "## Exercises" in markdown
    assert markdown.count("<details><summary>Answer</summary>") >= 3
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path: Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    cells = len(nb.cells)
    if path.name in ANSWERS_RUN:  # run after the notebook in its kernel, then dropped: the site shows the notebook
        answers = _answers(nb)
        assert len(answers) >= 3, f"{path.name}: its answers have no code to run"
        nb.cells.extend(nbformat.v4.new_code_cell(code) for code in answers)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(TUTORIALS)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on the first failure
    elapsed = time.perf_counter() - t0
    del nb.cells[cells:]
    assert elapsed < BUDGET, f"{path.name} took {elapsed:.0f} s; the tutorials promise under {BUDGET} s"
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "image/png" in o.get("data", {}))
    assert images >= 1, f"{path.name} drew no figure"
    _outputs().store(path, nb)  # the site shows these outputs (docs/notebook_outputs.py): run once, used twice
