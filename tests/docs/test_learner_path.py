"""The learner's path (docs/learner-path.md): in the nav, offered first by "Getting started", in the issue's order
(the bubble and one picture, checkpointing, 1F1B, the executor, the calibrated comparison last), and every page it
links exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGE = DOCS / "learner-path.md"


def test_the_path_is_in_the_nav_and_getting_started_offers_it_first() -> None:
    assert "  - A learner's way in: learner-path.md\n" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    start = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    assert start.index("(learner-path.md)") < start.index("```bash"), "the path comes before the demo's commands"


def test_the_steps_come_in_the_learners_order() -> None:
    headings = re.findall(r"^## (.+)$", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert headings == ["1. The bubble, and one picture", "2. Checkpointing", "3. 1F1B, and beyond", "4. The executor",
                        "5. The calibrated comparison", "Where next"]


def test_every_page_it_links_exists() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", PAGE.read_text(encoding="utf-8"))
    assert len(links) > 15
    for link in links:
        if link.startswith("tutorials/") and link != "tutorials/index.md":  # a notebook, rendered as a page
            assert (ROOT / "tutorials" / Path(link).with_suffix(".ipynb").name).is_file(), link
        else:
            assert (DOCS / link).is_file(), link


def test_getting_started_leads_with_the_bubble_before_the_demo() -> None:
    """Its first section is the bubble, whose formula it states as the simulator computes it, then the demo."""
    from gpipe.schedule import gpipe
    from sim.core.cost import CostModel
    from sim.core.engine import simulate

    start = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", start, flags=re.MULTILINE)
    assert headings[:2] == ["First, the bubble", "What the demo shows"]
    assert "`(p − 1) / (m + p − 1)`" in start and "(img/generated/bubble_gantt.png)" in start
    for p, m in ((4, 1), (4, 8), (2, 4)):
        timeline = simulate(gpipe(m, p, "never"), CostModel.uniform(p, 1.0, 2.0))
        assert abs(timeline.bubble_fraction() - (p - 1) / (m + p - 1)) < 1e-12
