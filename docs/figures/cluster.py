"""The figure and tables of "Pipeline parallelism in a cluster" (docs/concepts/cluster.md), from the planner's
sweeps in ``docs/cluster_numbers.py``."""

from __future__ import annotations

from pathlib import Path

import cluster_numbers

from figures import figure, forget, markdown
from figures.common import md_table, save

forget(cluster_numbers.clear_caches)


# --8<-- [start:cluster_tensor_parallel]
@figure("cluster_tensor_parallel.png")
def cluster_tensor_parallel(path: Path) -> None:
    cluster_numbers.draw_tensor_parallel(path, save)  # the planner's sweep: docs/cluster_numbers.py
# --8<-- [end:cluster_tensor_parallel]


@markdown
def cluster_fragments() -> dict[str, str]:
    return cluster_numbers.fragments(md_table)
