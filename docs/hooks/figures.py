"""MkDocs hook: the site's figures, drawn by the simulator, and the tutorial notebooks, as pages.

- ``on_config``: the *Tutorials* section of the nav lists every ``tutorials/NN_*.ipynb``.
- ``on_pre_build``: :func:`make_figures.build` draws every PNG into ``docs/img/generated/`` (git-ignored),
  skipped when nothing it depends on changed since the last build.
- ``on_files``: each notebook becomes a page ``tutorials/NN_name.md`` and is offered for download.
- ``on_page_markdown``: a marker ``<!-- generated: NAME -->`` in a page is replaced by the markdown fragment
  ``NAME`` that :func:`make_figures.fragments` computes (tables of simulated numbers).
- ``on_page_content``: the project's docstrings cross-reference in Sphinx style (``:class:`Timeline```);
  the API reference renders each such role as a link (through mkdocs-autorefs) instead of as literal text.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.figures")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TUTORIALS = ROOT / "tutorials"
_MARKER = re.compile(r"<!--\s*generated:\s*([A-Za-z0-9_]+)\s*-->")
_ROLE = re.compile(
    r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):<code>(~?)([A-Za-z_][\w.]*)(\(\))?</code>")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_fragments: dict[str, str] = {}


def on_config(config: Any) -> Any:
    notebooks = _load("notebooks").find_notebooks(TUTORIALS)
    for entry in config.nav or []:
        if isinstance(entry, dict) and "Tutorials" in entry:
            entry["Tutorials"] = ["tutorials/index.md"] + [{nb.title: nb.page} for nb in notebooks]
    return config


def on_pre_build(config: Any) -> None:
    make_figures = _load("make_figures")
    out = DOCS / "img" / "generated"
    drawn = make_figures.build(out)
    if drawn:
        log.info("figures: drew %d PNGs into %s", len(drawn), out.relative_to(ROOT))
    _fragments.clear()
    _fragments.update(make_figures.fragments(out))


def on_files(files: Files, config: Any) -> Files:
    notebooks = _load("notebooks")
    for nb in notebooks.find_notebooks(TUTORIALS):
        ipynb = f"tutorials/{nb.path.name}"
        files.append(File.generated(config, nb.page, content=notebooks.notebook_markdown(nb.path, nb.path.name)))
        files.append(File.generated(config, ipynb, abs_src_path=str(nb.path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in _fragments:
            raise PluginError(f"{page.file.src_uri}: no generated fragment {name!r} (have {sorted(_fragments)})")
        return _fragments[name]

    return _MARKER.sub(replace, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """``:class:<code>Timeline</code>`` (a Sphinx role as markdown renders it) -> an optional autoref link."""
    src = page.file.src_uri
    module = src.removeprefix("reference/").removesuffix(".md") if src.startswith("reference/") else ""

    def replace(match: re.Match[str]) -> str:
        tilde, name, call = match.group(1), match.group(2), match.group(3) or ""
        identifier = name if "." in name.split("(")[0] or not module else f"{module}.{name}"
        shown = name.rsplit(".", 1)[-1] if tilde else name
        return f'<autoref optional identifier="{identifier}"><code>{shown}{call}</code></autoref>'

    return _ROLE.sub(replace, html)
