"""A page shows the code that draws its figures: every ``--8<--`` include in a page names a section of a module that
exists, and each figure a page shows comes with its drawing function, included from ``docs/figures/`` (issue 37).

Cheap: the pages and modules are read as text; nothing is drawn and no site is built.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.test_figures import _load

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "img" not in p.parts)
MODULES = sorted((DOCS / "figures").glob("*.py"))
INCLUDE = re.compile(r'^[ \t]*--8<--[ \t]+"([^"]+)"[ \t]*$', re.MULTILINE)
MARKER = re.compile(r"[ \t]*# --8<-- \[(start|end):([a-z][-_0-9a-z]*)\][ \t]*")
REGISTERED = re.compile(r'^@figure\("([^"]+)"\)', re.MULTILINE)
SHOWN = re.compile(r"img/generated/([\w.-]+\.png)")


def sections(path: Path) -> dict[str, range]:
    """``name -> the line numbers (0-based) inside it`` for each ``# --8<-- [start:name]`` ... ``[end:name]``."""
    starts: dict[str, int] = {}
    found: dict[str, range] = {}
    for k, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        marker = MARKER.fullmatch(line)
        if marker is None:
            continue
        kind, name = marker.groups()
        if kind == "start":
            assert name not in starts and name not in found, f"{path.name}: section {name!r} starts twice"
            starts[name] = k
        else:
            assert name in starts, f"{path.name}: section {name!r} ends where none started"
            found[name] = range(starts.pop(name) + 1, k)
    assert not starts, f"{path.name}: sections that never end: {sorted(starts)}"
    return found


def includes(page: Path) -> list[tuple[str, str]]:
    """``(path, section)`` of each ``--8<-- "path:section"`` line of ``page``."""
    return [(target.partition(":")[0], target.partition(":")[2]) for target in INCLUDE.findall(page.read_text())]


def registered() -> dict[str, tuple[Path, int]]:
    """``figure name -> (module, line of its @figure)`` over docs/figures/, read as text."""
    out: dict[str, tuple[Path, int]] = {}
    for module in MODULES:
        text = module.read_text(encoding="utf-8")
        for match in REGISTERED.finditer(text):
            assert match.group(1) not in out, f"two figures named {match.group(1)}"
            out[match.group(1)] = (module, text.count("\n", 0, match.start()))
    return out


def test_every_include_names_a_section_that_exists() -> None:
    """A section, not line numbers: those would drift silently as the code above them changes."""
    found = [(page, path, section) for page in PAGES for path, section in includes(page)]
    assert found, "no page includes code"
    for page, path, section in found:
        where = f"{page.relative_to(DOCS)}: --8<-- {path}:{section}"
        assert (ROOT / path).is_file(), f"{where}: no such file"
        assert re.fullmatch(r"[a-z][-_0-9a-z]*", section), f"{where}: include a named section"
        lines = sections(ROOT / path).get(section)
        assert lines, f"{where}: no such section, or an empty one"


def test_the_registry_is_what_the_modules_declare() -> None:
    assert set(_load("make_figures").FIGURES) == set(registered())


def test_every_figure_is_shown_with_the_code_that_draws_it() -> None:
    figures = registered()
    shown: dict[str, set[Path]] = {}
    for page in PAGES:
        for name in SHOWN.findall(page.read_text()):
            shown.setdefault(name, set()).add(page)
    assert set(figures) <= set(shown), f"figures drawn but shown nowhere: {sorted(set(figures) - set(shown))}"
    for name, pages in shown.items():
        assert name in figures, f"{name} is shown but no module of docs/figures/ registers it"
        module, line = figures[name]
        drawing = {s for s, lines in sections(module).items() if line in lines}
        assert drawing, f"{module.name}: @figure({name!r}) is in no --8<-- section"
        path = str(module.relative_to(ROOT))
        for page in pages:
            assert any((path, s) in includes(page) for s in drawing), \
                f"{page.relative_to(DOCS)} shows {name} without its code: add --8<-- \"{path}:{min(drawing)}\""
