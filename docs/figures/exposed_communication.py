"""The figure and table of "When communication is exposed" (docs/concepts/exposed-communication.md), from the
simulator and the catalog in ``docs/exposure_numbers.py``."""

from __future__ import annotations

from pathlib import Path

import exposure_numbers

from figures import figure, markdown
from figures.common import md_table, save, simulate


# --8<-- [start:exposure_buckets]
@figure("exposure_buckets.png")
def exposure_buckets(path: Path) -> None:
    exposure_numbers.draw_buckets(path, simulate, save)  # the simulator's step: docs/exposure_numbers.py
# --8<-- [end:exposure_buckets]


@markdown
def exposure_fragments() -> dict[str, str]:
    return exposure_numbers.fragments(simulate, md_table)
