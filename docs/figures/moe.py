"""The figure and the DeepSeek-V3 table of "Mixture of experts in a pipeline" (docs/concepts/mixture-of-experts.md),
from the simulator and the planner in ``docs/moe_numbers.py``."""

from __future__ import annotations

from pathlib import Path

import moe_numbers

from figures import figure
from figures.benchmarks import RESULT_FRAGMENTS
from figures.common import md_table, save


# --8<-- [start:moe_pair]
@figure("moe_pair.png")
def moe_pair(path: Path) -> None:
    moe_numbers.draw_pair(path, save)  # the simulator's spans of one pair: docs/moe_numbers.py
# --8<-- [end:moe_pair]


# Note [results read at every build]: the planner's DeepSeek-V3 rows come from benchmarks/results/deepseek_v3.json,
# which its benchmark rewrites; a fragment of figures.markdown is cached until a source of the simulator changes, so
# the table is one of figures.benchmarks' fragments instead, read anew at every build as docs/benchmarks.md's are.
def deepseek_fragment(results: Path) -> str:
    """The planner's DeepSeek-V3 rows, their summary and the command that wrote them; how to produce them if absent."""
    path = results / moe_numbers.RESULTS.name
    if not path.exists():
        return (f"*No results yet.* Run `.venv/bin/python -m benchmarks.deepseek_v3` to produce "
                f"`benchmarks/results/{path.name}`; the next site build renders it here.")
    table = md_table(moe_numbers.DEEPSEEK_COLUMNS, moe_numbers.deepseek_rows(path))
    return (f"{table}\n\n{moe_numbers.deepseek_summary(path)} "
            f"(Planned by {moe_numbers.deepseek_provenance(path)}.)")


RESULT_FRAGMENTS["moe_deepseek_v3"] = deepseek_fragment
