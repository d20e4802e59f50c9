"""Tutorial notebooks as site pages: markdown cells as they are, code cells as Python blocks, nothing executed.

The site shows what a student will run; the test suite (``tests/docs/test_notebooks.py``) is what executes
the notebooks, so a page can never show an output that the code no longer produces.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Notebook", "find_notebooks", "notebook_markdown"]

_HEADING = re.compile(r"^#\s+(.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Notebook:
    """One tutorial: its file, the page it becomes (a path inside ``docs/``) and its title."""

    path: Path
    page: str
    title: str


def _source(cell: dict[str, object]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _title(cells: list[dict[str, object]], fallback: str) -> str:
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            match = _HEADING.search(_source(cell))
            if match:
                return match.group(1)
    return fallback


def find_notebooks(folder: Path, page_dir: str = "tutorials") -> list[Notebook]:
    """The ``NN_name.ipynb`` notebooks in ``folder``, sorted by name, each with its page path and title."""
    out = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        out.append(Notebook(path, f"{page_dir}/{path.stem}.md", _title(cells, path.stem)))
    return out


def notebook_markdown(path: Path, download: str | None = None) -> str:
    """The markdown page for the notebook at ``path``.

    Args:
        path: the ``.ipynb`` file (nbformat 4 JSON).
        download: a link, relative to the page, to the notebook file itself; shown under the title.

    Returns:
        Markdown: each markdown cell verbatim, each code cell as a fenced ``python`` block.
    """
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    parts: list[str] = []
    for k, cell in enumerate(cells):
        text = _source(cell).rstrip()
        if not text:
            continue
        if cell.get("cell_type") == "code":
            parts.append(f"```python\n{text}\n```")
        else:
            parts.append(text)
        if k == 0 and download is not None:
            parts.append(
                f"!!! note \"Run it yourself\"\n"
                f"    This page is the notebook [`tutorials/{path.name}`]({download}), shown without its outputs. "
                f"Open it in Jupyter (for instance `.venv/bin/pip install jupyterlab && .venv/bin/jupyter lab "
                f"tutorials/`) and run it top to bottom: it takes seconds on a laptop. The test suite runs it too, "
                f"so the code here is known to work."
            )
    return "\n\n".join(parts) + "\n"
