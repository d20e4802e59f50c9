"""The README keeps its promises: one picture made by the project, exactly two commands, links that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: (a) set everything up and run the main job; (b) set everything up and run the tests.
DEMO = "scripts/bootstrap && .venv/bin/gpipe-sim demo"
TESTS = "scripts/bootstrap && .venv/bin/python -m pytest"


def _text() -> str:
    return README.read_text(encoding="utf-8")


def test_exactly_two_commands_the_demo_then_the_tests() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", _text(), re.DOTALL)
    assert [b.strip() for b in blocks] == [DEMO, TESTS]


def test_ci_runs_the_readmes_test_command() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert TESTS in lines


def test_the_picture_is_a_committed_png_that_make_figures_draws() -> None:
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", _text())
    assert images == ["docs/img/demo_timeline.png"]
    png = ROOT / images[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "README_FIGURE" in (ROOT / "docs" / "figures" / "readme.py").read_text()
    assert "docs/img/generated/" not in images[0], "generated figures are git-ignored: the README's is committed"


def test_local_links_exist() -> None:
    links = [link for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text()) if "://" not in link]
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"


def test_sections() -> None:
    headings = re.findall(r"^## (.+)$", _text(), re.MULTILINE)
    for wanted in ("What's inside", "Coming from torchgpipe", "Documentation", "Benchmarks"):
        assert wanted in headings
    assert "from gpipe import GPipe" in _text() and "docs/benchmarks.md" in _text()
