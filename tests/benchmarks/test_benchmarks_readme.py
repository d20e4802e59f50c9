"""``benchmarks/README.md`` lists every script, and only scripts there are: each row's command runs that script as
a module, and each link lands on a section of the docs' Benchmarks page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
README = BENCHMARKS / "README.md"
ROW = re.compile(r"^\| `(?P<script>[\w/]+\.py)` \|[^|]*\| `(?P<command>[^`]*)`", re.M)


def scripts() -> set[str]:
    """Every script, as its path below ``benchmarks/``."""
    return {p.relative_to(BENCHMARKS).as_posix() for folder in (BENCHMARKS, BENCHMARKS / "investigations")
            for p in folder.glob("*.py") if p.name != "__init__.py"}


def rows() -> dict[str, str]:
    """The README's table rows: script -> command."""
    found = [(m["script"], m["command"]) for m in ROW.finditer(README.read_text())]
    assert len(found) == len(dict(found)), "a script is listed twice"
    return dict(found)


def test_every_script_has_a_row_and_every_row_a_script() -> None:
    listed = set(rows())
    assert scripts() - listed == set(), "scripts missing from benchmarks/README.md"
    assert listed - scripts() == set(), "rows of benchmarks/README.md with no script"


def test_each_command_runs_its_script_as_a_module() -> None:
    for script, command in rows().items():
        module = "benchmarks." + script.removesuffix(".py").replace("/", ".")
        assert command.split()[:3] == ["python", "-m", module], (script, command)


def test_each_link_lands_on_a_section_of_the_docs_page() -> None:
    from markdown.extensions.toc import slugify

    page = (ROOT / "docs" / "benchmarks.md").read_text()
    sections = {slugify(title.replace("`", ""), "-") for title in re.findall(r"^#{2,3} (.+)$", page, re.M)}
    links = re.findall(r"\(\.\./docs/benchmarks\.md#([\w-]+)\)", README.read_text())
    assert links and not [link for link in links if link not in sections]
