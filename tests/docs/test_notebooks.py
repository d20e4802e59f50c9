"""The tutorial notebooks are their own source: each is a valid notebook, committed without outputs, linted, titled
and numbered as the site lists it, and runs top to bottom in this venv's kernel.

A teacher edits ``tutorials/NN_name.ipynb`` in Jupyter, clears its outputs and commits it; these tests hold for such a
file and name the fix when one does not. A run that passes is kept as the notebook's executed copy, whose outputs the
site shows (docs/notebook_outputs.py), one run for both (Note [one run per notebook]). In the notebooks of
``ANSWERS_RUN`` there the answers' code runs too, after the notebook, in its kernel.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.ipynb"))
INDEX = ROOT / "docs" / "tutorials" / "index.md"  # the section's page: a table with a row per notebook
BUDGET = 120  # seconds per notebook on two CPU cores, as the tutorials promise


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


def _as_stored(path: Path) -> nbformat.NotebookNode:
    """The notebook's JSON as the file holds it: ``nbformat.read`` would convert it and repair missing or repeated
    ids, so a broken file would pass."""
    return nbformat.from_dict(json.loads(path.read_text(encoding="utf-8")))


def test_there_are_notebooks() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"01_bubble.ipynb", "02_checkpointing.ipynb", "03_copy_streams.ipynb", "04_executor_vs_simulator.ipynb",
            "05_capacity_planning.ipynb", "06_ablation.ipynb", "07_own_schedule.ipynb",
            "08_beyond_1f1b.ipynb", "09_from_scratch.ipynb"} <= names
    assert _outputs().ANSWERS_RUN <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_a_valid_notebook_for_this_kernel(path: Path) -> None:
    nb = _as_stored(path)
    assert nb.get("nbformat") == 4, (
        f"{path.name} is nbformat {nb.get('nbformat')}; open and save it in Jupyter, which writes version 4")
    with warnings.catch_warnings():  # a missing or repeated cell id is a warning in nbformat: here it fails
        warnings.simplefilter("error")
        nbformat.validate(nb)  # raises ValidationError naming the offending field
    kernel = nb.metadata.get("kernelspec", {})
    assert kernel.get("name") == "python3" and kernel.get("language") == "python", (
        f"{path.name}: kernelspec {kernel or 'missing'}; the tests and the site run it in the python3 kernel: "
        f"choose Kernel > Change Kernel > Python 3 in Jupyter and save")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    """Outputs belong to the executed copy the site shows, not to the source: they bloat diffs and go stale."""
    kept = [k for k, c in enumerate(nbformat.read(path, as_version=4).cells)
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not kept, (
        f"{path.name}: cells {kept} keep outputs or execution counts. Clear them and save before committing: in "
        f"Jupyter, Edit > Clear Outputs of All Cells; or from the repository root, "
        f"`.venv/bin/jupyter nbconvert --clear-output --inplace tutorials/{path.name}` (nbconvert comes with "
        f"jupyterlab)")


def test_notebooks_are_numbered_and_titled_as_the_site_lists_them() -> None:
    """The site's navigation lists ``NN_name.ipynb`` in file order under the title of its first cell."""
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(1, len(NOTEBOOKS) + 1)), (
        f"the notebooks are numbered {numbers}: number them 01, 02, ... without gaps or repeats")
    index = INDEX.read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.cell_type == "markdown" and first.source.startswith("# "), (
            f"{path.name}: the first cell must be markdown starting with `# Title`, the page's title")
        assert f"]({path.stem}.md)" in index, f"{path.name} has no row linking ({path.stem}.md) in {INDEX.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_exercises_with_hidden_answers(path: Path) -> None:
    markdown = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    assert "## Exercises" in markdown
    assert markdown.count("<details><summary>Answer</summary>") >= 3


def test_notebooks_pass_the_linter() -> None:
    """``ruff check`` reads notebooks cell by cell, with the project's rules (pyproject.toml)."""
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "tutorials"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, f"`ruff check tutorials` found:\n{lint.stdout}{lint.stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path: Path) -> None:
    """Its executed copy for its current sources: run here, or by the docs build beside (Note [one run per
    notebook] in ``docs/notebook_outputs.py``); a cell that fails raises CellExecutionError with its traceback."""
    outputs = _outputs()
    nb = outputs.executed(path)
    assert nb is not None
    elapsed = nb["metadata"][outputs.SECONDS_KEY]
    assert elapsed < BUDGET, f"{path.name} took {elapsed:.0f} s; the tutorials promise under {BUDGET} s"
    images = sum(1 for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
                 if "image/png" in o.get("data", {}))
    assert images >= 1, f"{path.name} drew no figure"


def test_notebook_09s_ranks_send_their_gradients_by_value() -> None:
    """Note [gradients by value] in ``tutorials/from_scratch.py``: what a rank puts on its queue holds no shared
    tensor, whose storage the launcher would fetch from the rank's process after the rank may have exited."""
    from multiprocessing.reduction import ForkingPickler

    import torch

    if str(TUTORIALS) not in sys.path:
        sys.path.insert(0, str(TUTORIALS))
    from from_scratch import _by_value

    grads = {"0.weight": torch.arange(4.0).reshape(2, 2)}
    assert b"resource_sharer" in bytes(ForkingPickler.dumps(grads))  # a tensor as it is: a handle into the rank
    payload = bytes(ForkingPickler.dumps(_by_value(grads)))
    assert b"resource_sharer" not in payload and b"rebuild_storage" not in payload
    assert torch.equal(torch.from_numpy(ForkingPickler.loads(payload)["0.weight"]), grads["0.weight"])
