"""MkDocs hook: the site's figures, drawn by the simulator, and the tutorial notebooks, as pages.

- ``on_config``: the *Tutorials* section of the nav lists every ``tutorials/NN_*.ipynb``, and the *API reference*
  section every public module of ``gpipe`` and ``sim`` (:func:`reference_modules`).
- ``on_pre_build``: :func:`make_figures.build` draws every PNG into ``docs/img/generated/`` (git-ignored),
  skipped when nothing it depends on changed since the last build. Each figure is drawn by a function in the
  module of ``docs/figures/`` named for its page, and the page shows that function under the figure (a
  ``pymdownx.snippets`` include of the function's section, resolved by Markdown, not by this hook).
- ``on_pre_build`` also exports the schedule explorer's timelines (:mod:`explorer`), and makes sure each
  notebook has a current executed copy (:mod:`notebook_outputs`): the
  test run leaves one, and a notebook whose copy is missing or stale is executed here.
- ``on_files``: each notebook becomes a page ``tutorials/NN_name.md`` with its outputs (its figures as files
  ``tutorials/NN_name/cellKK_O.png``) and is offered for download; each public
  module becomes a page ``reference/<module>.md`` holding one mkdocstrings directive (``::: gpipe.schedule``), so
  the reference is rendered from the docstrings and a new module gets its page without anyone writing it, and
  ``reference/index.md`` lists them with the first line of each module's docstring.
- ``on_page_markdown``: a marker ``<!-- generated: NAME -->`` in a page is replaced by the markdown fragment
  ``NAME`` that :func:`make_figures.fragments` gathers from the modules of ``docs/figures/`` (tables of simulated
  numbers, schedule grids, benchmark results).
- ``on_page_content``: the project's docstrings cross-reference in Sphinx style (``:class:`Timeline```);
  the API reference renders each such role as a link (through mkdocs-autorefs) instead of as literal text.
"""

from __future__ import annotations

import ast
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
_executed: dict[str, dict[str, Any]] = {}

#: The packages whose public modules get a reference page, in the order of the nav.
PACKAGES = ("gpipe", "sim")


def reference_modules(root: Path = ROOT) -> list[str]:
    """The dotted names of the public modules of :data:`PACKAGES`: each ``pkg/name.py`` and each subpackage
    ``pkg/name/`` whose name does not start with ``_``. A subpackage with an ``__all__`` is one page (its
    modules are documented through it); one without, a layer such as ``sim.core``, gives each of its modules
    a page instead."""
    def under(folder: Path, dotted: str) -> list[str]:
        children = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        children += [p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
        names = []
        for child in sorted(set(children)):
            if child.startswith("_"):
                continue
            init = folder / child / "__init__.py"
            if init.is_file() and "__all__" not in init.read_text(encoding="utf-8"):
                names += under(folder / child, f"{dotted}.{child}")
            else:
                names.append(f"{dotted}.{child}")
        return names

    return [name for package in PACKAGES for name in under(root / package, package)]


def module_summary(module: str, root: Path = ROOT) -> str:
    """The first line of ``module``'s docstring (read with ``ast``, nothing is imported), or ``""``."""
    path = root.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def shadowed_exports(module: str, root: Path = ROOT) -> list[str]:
    """Names in a package's ``__all__`` that are also the names of its submodules.

    ``gpipe.skip`` exports the function ``skippable`` from its submodule ``gpipe.skip.skippable``; a static
    reader of the package (griffe) sees the submodule under that name and the function would be left out of
    the page, so :func:`reference_page` renders each such object explicitly.
    """
    folder = root.joinpath(*module.split("."))
    init = folder / "__init__.py"
    if not init.is_file():
        return []
    exported: list[str] = []
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                exported = [e.value for e in node.value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return [name for name in exported if (folder / f"{name}.py").is_file() and _defines(folder / f"{name}.py", name)]


def _defines(source: Path, name: str) -> bool:
    """True when the file defines a function or class ``name`` at its top level."""
    return any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name
               for node in ast.parse(source.read_text(encoding="utf-8")).body)


def reference_page(module: str, root: Path = ROOT) -> str:
    """The markdown of ``module``'s reference page: mkdocstrings directives, nothing written by hand.

    A package's page ends with the docstring of each of its public modules, without their members (the package
    exports those): a module's notes stay on the site, and ``:mod:`pkg.sub.module``` links to its section.
    """
    page = f"# `{module}`\n\n::: {module}\n"
    for name in shadowed_exports(module, root):
        page += (f"\n::: {module}.{name}.{name}\n    options:\n      show_root_heading: true\n"
                 f"      show_root_full_path: false\n")
    for name in submodules(module, root):
        page += (f"\n::: {module}.{name}\n    options:\n      members: false\n      show_root_heading: true\n"
                 f"      show_root_full_path: true\n")
    return page


def submodules(module: str, root: Path = ROOT) -> list[str]:
    """The public modules (``name.py``, not starting with ``_``) of the package ``module``; none for a module."""
    folder = root.joinpath(*module.split("."))
    if not (folder / "__init__.py").is_file():
        return []
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def _reference_index(modules: list[str]) -> str:
    rows = "\n".join(f"| [`{m}`]({m}.md) | {_cell(module_summary(m))} |" for m in modules)
    return ("# API reference\n\n"
            "Rendered from the docstrings by mkdocstrings when the site is built: one page per public module of "
            "`gpipe` (the executor and the shared language: schedules, timelines, plots) and `sim` (the "
            "simulator, cost models, hardware catalog, comparison and planning).\n\n"
            "| module | what it is for |\n| :--- | :--- |\n" + rows + "\n")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def on_config(config: Any) -> Any:
    notebooks = _load("notebooks").find_notebooks(TUTORIALS)
    for entry in config.nav or []:
        if isinstance(entry, dict) and "Tutorials" in entry:
            entry["Tutorials"] = ["tutorials/index.md"] + [{nb.title: nb.page} for nb in notebooks]
        if isinstance(entry, dict) and "API reference" in entry:
            entry["API reference"] = ["reference/index.md"] + [{m: f"reference/{m}.md"} for m in reference_modules()]
    return config


def on_pre_build(config: Any) -> None:
    make_figures = _load("make_figures")
    out = DOCS / "img" / "generated"
    drawn = make_figures.build(out)
    if drawn:
        log.info("figures: drew %d PNGs into %s", len(drawn), out.relative_to(ROOT))
    _fragments.clear()
    _fragments.update(make_figures.fragments(out))
    _load("explorer").write(out, make_figures._stamp())
    outputs = _load("notebook_outputs")
    _executed.clear()
    paths = [nb.path for nb in _load("notebooks").find_notebooks(TUTORIALS)]
    stale = [p.name for p in paths if outputs.cached(p) is None]
    if stale:
        log.info("notebooks: executing %s (no executed copy for their current sources)", ", ".join(stale))
    # last first: the notebooks' tests, which may run beside this build, take them first first
    _executed.update(outputs.executed_all(paths[::-1]))


def on_files(files: Files, config: Any) -> Files:
    notebooks = _load("notebooks")
    for nb in notebooks.find_notebooks(TUTORIALS):
        ipynb = f"tutorials/{nb.path.name}"
        ran = _executed.get(nb.path.name)
        if ran is None:
            raise PluginError(f"{nb.path.name} was not executed in on_pre_build")
        page = notebooks.notebook_markdown(nb.path, nb.path.name, executed=ran, images=nb.path.stem)
        files.append(File.generated(config, nb.page, content=page))
        for name, png in notebooks.output_images(ran).items():
            files.append(File.generated(config, f"tutorials/{nb.path.stem}/{name}", content=png))
        files.append(File.generated(config, ipynb, abs_src_path=str(nb.path)))
    modules = reference_modules()
    files.append(File.generated(config, "reference/index.md", content=_reference_index(modules)))
    for module in modules:
        files.append(File.generated(config, f"reference/{module}.md", content=reference_page(module)))
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
    module = "" if module == "index" else module

    def replace(match: re.Match[str]) -> str:
        tilde, name, call = match.group(1), match.group(2), match.group(3) or ""
        identifier = name if "." in name.split("(")[0] or not module else f"{module}.{name}"
        shown = name.rsplit(".", 1)[-1] if tilde else name
        return f'<autoref optional identifier="{identifier}"><code>{shown}{call}</code></autoref>'

    return _ROLE.sub(replace, html)
