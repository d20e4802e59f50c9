"""The figure of "FP8 training" (docs/concepts/fp8.md), from the planner in ``docs/fp8_numbers.py``."""

from __future__ import annotations

from pathlib import Path

import fp8_numbers

from figures import figure
from figures.common import save


# --8<-- [start:fp8_parts]
@figure("fp8_parts.png")
def fp8_parts(path: Path) -> None:
    fp8_numbers.draw_parts(path, save)  # the planner's step, part by part: docs/fp8_numbers.py
# --8<-- [end:fp8_parts]
