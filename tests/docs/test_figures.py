"""The site's figures, fragments and notebook pages come from the project's code, and its examples run."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "img" not in p.parts)

#: Pages whose python blocks are fragments, not programs (with the reason).
NOT_RUN = {
    "how-to/compare.md": "reads timelines a comparison wrote",
    "how-to/distributed.md": "a script every rank of a torchrun launch runs (its batches are placeholders)",
    "dev/executor-api.md": "a contract sketch for contributors (its model, x and loss_fn are placeholders)",
}


def _load(name: str) -> ModuleType:
    """A module of ``docs/`` as the site's hook loads it: ``make_figures`` by its file, ``figures.bubble`` (a page's
    module) as a module of the package ``docs/figures``."""
    if name in sys.modules:
        return sys.modules[name]
    if "." in name:
        if str(DOCS) not in sys.path:
            sys.path.insert(0, str(DOCS))
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_every_figure_a_page_shows_is_drawn_by_make_figures() -> None:
    figures = _load("make_figures").FIGURES
    shown = {m for p in PAGES for m in re.findall(r"img/generated/([\w.-]+\.png)", p.read_text())}
    assert shown, "no page shows a generated figure"
    assert shown <= set(figures), f"pages show figures nobody draws: {sorted(shown - set(figures))}"
    assert set(figures) <= shown, f"figures drawn but shown nowhere: {sorted(set(figures) - shown)}"


@pytest.fixture(scope="module")
def fragments() -> dict[str, str]:
    """Computed once for the module (the planning fragment counts and sweeps a 13B GPT: seconds) and kept where the
    site's build reads them, with the stamp of their sources (:func:`make_figures.fragments`): a test run computes
    them once for both, and reads the build's when they are current."""
    mf = _load("make_figures")
    return dict(mf.fragments(mf.OUT))


def test_every_marker_has_a_fragment(fragments: dict[str, str]) -> None:
    markers = {m for p in PAGES for m in re.findall(r"<!--\s*generated:\s*(\w+)\s*-->", p.read_text())}
    assert markers <= set(fragments), f"markers without a fragment: {sorted(markers - set(fragments))}"
    assert all(text.strip() for text in fragments.values())


def test_fragments_state_the_closed_forms(fragments: dict[str, str]) -> None:
    for line in fragments["bubble_table"].splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[3] == cells[4], f"simulated bubble differs from (n-1)/(m+n-1): {line}"


def test_build_draws_pngs_and_then_skips(tmp_path: Path) -> None:
    mf = _load("make_figures")
    drawn = mf.build(tmp_path, only=["home_gantt.png", "bubble_vs_m.png"])
    assert [p.name for p in drawn] == ["home_gantt.png", "bubble_vs_m.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in drawn)
    with pytest.raises(KeyError, match="no figure named"):
        mf.build(tmp_path, only=["nope.png"])


def test_build_is_skipped_when_nothing_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mf = _load("make_figures")
    drawn: list[str] = []

    def draw(path: Path) -> None:
        drawn.append(path.name)
        path.write_bytes(b"x")

    monkeypatch.setattr(mf, "FIGURES", {"a.png": draw})
    assert [p.name for p in mf.build(tmp_path)] == ["a.png"]
    assert mf.build(tmp_path) == []
    assert [p.name for p in mf.build(tmp_path, force=True)] == ["a.png"]
    assert drawn == ["a.png", "a.png"]


def test_benchmark_results_render_as_tables(tmp_path: Path) -> None:
    benchmarks = _load("figures.benchmarks")
    (tmp_path / "sim_speed.json").write_text(json.dumps({
        "command": ".venv/bin/python benchmarks/sim_speed.py", "machine": {"cpu": "x86_64", "cores": 2},
        "rows": [{"m": 8, "n": 4, "tasks_per_s": 12345.678, "samples": [1.0, 2.0]},
                 {"m": 32, "n": 8, "tasks_per_s": 9876.5, "samples": [3.0]}],
    }))
    out = benchmarks.benchmark_fragments(tmp_path)
    text = out["bench_sim_speed"]
    assert "Command: `.venv/bin/python benchmarks/sim_speed.py`" in text
    assert "| m | n | tasks_per_s |" in text and "| 8 | 4 | 1.235e+04 |" in text
    assert "samples" not in text  # raw samples stay in the JSON
    assert "No results yet" in out["bench_fidelity"] and "-m benchmarks.fidelity`" in out["bench_fidelity"]


def test_notebook_pages_keep_text_and_code(tmp_path: Path) -> None:
    notebooks = _load("notebooks")
    found = notebooks.find_notebooks(ROOT / "tutorials")
    assert [nb.page for nb in found][:1] == ["tutorials/01_bubble.md"]
    assert found[0].title == "Micro-batches and the bubble"
    page = notebooks.notebook_markdown(found[0].path, found[0].path.name)
    assert page.startswith("# Micro-batches and the bubble")
    assert "```python\nfrom gpipe.schedule import gpipe" in page
    assert "(01_bubble.ipynb)" in page and "<details><summary>Answer</summary>" in page


def test_notebook_pages_show_what_the_notebook_printed_and_drew(tmp_path: Path) -> None:
    import nbformat

    outputs, notebooks = _load("notebook_outputs"), _load("notebooks")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Tiny"),
        nbformat.v4.new_code_cell("print(6 * 7)"),
        nbformat.v4.new_code_cell("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                                  "%matplotlib inline\nplt.plot([0, 1]);"),
    ])
    path, cache = tmp_path / "01_tiny.ipynb", tmp_path / "cache"
    nbformat.write(nb, path)
    assert outputs.cached(path, cache) is None
    ran = outputs.executed(path, cache)  # a real kernel runs it
    assert outputs.cached(path, cache) == ran
    page = notebooks.notebook_markdown(path, path.name, executed=ran, images="01_tiny")
    assert "```python\nprint(6 * 7)\n```\n\n```text\n42\n```" in page
    images = notebooks.output_images(ran)
    assert len(images) == 1 and all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in images.values())
    assert f"![Output of the cell above](01_tiny/{next(iter(images))})" in page
    nb.cells.append(nbformat.v4.new_code_cell("print('new')"))
    nbformat.write(nb, path)
    assert outputs.cached(path, cache) is None, "an edited notebook's old outputs must not be shown"
    with pytest.raises(ValueError, match="execute the notebook again"):
        notebooks.notebook_markdown(path, executed=ran)


def test_a_notebook_another_process_is_running_is_taken_last_and_run_once(tmp_path: Path) -> None:
    """Note [one run per notebook]: while another process holds a notebook's lock, the build runs the others, then
    waits and reads the copy the holder stored instead of running it again."""
    import threading

    import nbformat
    from filelock import FileLock

    outputs = _load("notebook_outputs")
    cache = tmp_path / "cache"
    held, free = tmp_path / "01_held.ipynb", tmp_path / "02_free.ipynb"
    for path, text in ((held, "print('held')"), (free, "print('free')")):
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(text)]), path)
    cache.mkdir()
    holding = threading.Event()

    def other_process() -> None:  # holds the held notebook's lock, runs it once the build has run the free one
        with FileLock(str(cache / f"{held.name}.lock")):
            holding.set()
            while outputs.cached(free, cache) is None:
                threading.Event().wait(0.05)
            nb = outputs.execute(held)
            nb.metadata["ran_by"] = "the other process"
            outputs.store(held, nb, cache)

    thread = threading.Thread(target=other_process)
    thread.start()
    holding.wait()
    assert outputs.executed(held, cache, wait=False) is None
    done = outputs.executed_all([held, free], cache)
    thread.join()
    assert done[held.name]["metadata"]["ran_by"] == "the other process"
    assert "".join(done[free.name]["cells"][0]["outputs"][0]["text"]) == "free\n"


@pytest.mark.parametrize("page", [p for p in PAGES if "```python" in p.read_text()],
                         ids=lambda p: str(p.relative_to(DOCS)))
def test_python_examples_in_the_pages_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rel = str(page.relative_to(DOCS))
    if rel in NOT_RUN:
        pytest.skip(NOT_RUN[rel])
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # examples write their files here
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    with open(os.devnull, "w") as quiet:
        monkeypatch.setattr(sys, "stdout", quiet)
        for k, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)):
            if block.lstrip().startswith("--8<--"):
                continue  # a figure's drawing code, included from docs/figures/ (test_figure_code.py)
            exec(compile(block, f"{rel}, block {k + 1}", "exec"), namespace)  # noqa: S102 (our own docs)


def test_the_communication_table_has_dualpipe_v_ahead_only_with_communication(fragments: dict[str, str]) -> None:
    lines = fragments["communication_table"].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert rows[0][0] == "0 ms" and rows[0][1] == rows[0][2] and rows[0][3] == "0.00 ms"
    assert all(float(r[3].split()[0]) > 0 for r in rows[1:])
