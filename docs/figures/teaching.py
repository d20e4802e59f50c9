"""The numbers of the pages past GPipe (memory, balancing, traffic, the roofline, beyond 1F1B), computed in
``docs/teaching_numbers.py``."""

from __future__ import annotations

import teaching_numbers as tn

from figures import markdown
from figures.common import md_table, simulate
from figures.plan import plan_example


@markdown
def teaching_fragments() -> dict[str, str]:
    return tn.fragments(simulate, md_table, plan_example())
