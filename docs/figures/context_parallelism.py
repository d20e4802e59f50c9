"""The figure of "Context parallelism" (docs/concepts/context-parallelism.md), from the planner in
``docs/cp_numbers.py``."""

from __future__ import annotations

from pathlib import Path

import cp_numbers

from figures import figure
from figures.common import save


# --8<-- [start:cp_ring]
@figure("cp_ring.png")
def cp_ring(path: Path) -> None:
    cp_numbers.draw_ring(path, save)  # the planner's layer on one rank: docs/cp_numbers.py
# --8<-- [end:cp_ring]
