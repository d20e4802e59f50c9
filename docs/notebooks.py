"""Tutorial notebooks as site pages: markdown cells as they are, code cells as Python blocks, each followed by
its outputs (printed text and figures) from an executed copy of the notebook (:mod:`notebook_outputs`), so a
page shows what a student running it sees, and never an output the code no longer produces.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Notebook", "find_notebooks", "notebook_markdown", "output_images"]

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


def _text(value: object) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _image_name(cell: int, output: int) -> str:
    return f"cell{cell:02d}_{output}.png"


def output_images(executed: dict[str, object]) -> dict[str, bytes]:
    """Every PNG among the outputs of ``executed`` (an executed notebook's JSON), by the file name its page uses."""
    out = {}
    cells = executed.get("cells", [])
    assert isinstance(cells, list)
    for k, cell in enumerate(cells):
        for o, output in enumerate(cell.get("outputs", [])):
            png = output.get("data", {}).get("image/png")
            if png:
                out[_image_name(k, o)] = base64.b64decode(_text(png))
    return out


def _outputs(cell: dict[str, object], k: int, images: str) -> list[str]:
    """Markdown for one code cell's outputs: printed text as a ``text`` block, figures as images."""
    parts = []
    outputs = cell.get("outputs", [])
    assert isinstance(outputs, list)
    for o, output in enumerate(outputs):
        kind = output.get("output_type")
        data = output.get("data", {})
        if kind == "stream":
            parts.append(f"```text\n{_text(output.get('text', '')).rstrip()}\n```")
        elif "image/png" in data:
            parts.append(f"![Output of the cell above]({images}/{_image_name(k, o)})")
        elif "text/plain" in data:
            parts.append(f"```text\n{_text(data['text/plain']).rstrip()}\n```")
        elif kind == "error":
            raise ValueError(f"cell {k} of the executed notebook failed: {output.get('ename')}: "
                             f"{output.get('evalue')}; run the notebook and fix the cell")
    return parts


def notebook_markdown(path: Path, download: str | None = None, executed: dict[str, object] | None = None,
                      images: str | None = None) -> str:
    """The markdown page for the notebook at ``path``.

    Args:
        path: the ``.ipynb`` file (nbformat 4 JSON).
        download: a link, relative to the page, to the notebook file itself; shown under the title.
        executed: the same notebook executed (its JSON); each code cell is then followed by its outputs.
        images: the folder, relative to the page, that holds :func:`output_images` of ``executed``.

    Returns:
        Markdown: each markdown cell verbatim, each code cell as a fenced ``python`` block and its outputs.

    Raises:
        ValueError: ``executed`` is not the notebook at ``path`` run (its code differs), or one of its cells failed.
    """
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    ran = executed.get("cells", []) if executed is not None else None
    if ran is not None and [_source(c) for c in ran] != [_source(c) for c in cells]:  # type: ignore[union-attr]
        raise ValueError(f"the executed copy of {path.name} has other cells: execute the notebook again")
    parts: list[str] = []
    for k, cell in enumerate(cells):
        text = _source(cell).rstrip()
        if not text:
            continue
        if cell.get("cell_type") == "code":
            parts.append(f"```python\n{text}\n```")
            if ran is not None:
                parts += _outputs(ran[k], k, images or ".")  # type: ignore[index]
        else:
            parts.append(text)
        if k == 0 and download is not None:
            shown = ("shown with the outputs it printed and drew when the site was built"
                     if ran is not None else "shown without its outputs")
            parts.append(
                f"!!! note \"Run it yourself\"\n"
                f"    This page is the notebook [`tutorials/{path.name}`]({download}), {shown}. "
                f"Open it in Jupyter (for instance `.venv/bin/pip install jupyterlab && .venv/bin/jupyter lab "
                f"tutorials/`) and run it top to bottom: it takes seconds on a laptop. The test suite runs it too, "
                f"so the code here is known to work."
            )
    return "\n\n".join(parts) + "\n"
