"""Test ordering for the README's test command (pytest-xdist, one worker per core, a file to a worker).

Note [slow files first]: a file runs on one worker from start to end, so the step ends no earlier than the
slowest file's start plus its length. xdist queues files largest first by test count, which put the site's build
and browser check (a few tests, minutes) near the end of the queue, and the run waited for it alone. The files
named here go first, longest first (``--no-loadscope-reorder`` keeps the collection's order); the rest follow in
collection order and fill in around them.
"""

from __future__ import annotations

import pytest

#: The files that take minutes, then those that take half a minute or more, longest first (measured with
#: ``--durations`` on this machine). The later ones come late in collection order (integration, sim), where a long
#: file started last would leave the other worker idle for its length.
SLOW_FIRST = (
    "tests/docs/test_site.py",
    "tests/docs/test_notebooks.py",
    "tests/distributed/test_processes_cli.py",
    "tests/benchmarks/test_search_gain_smoke.py",
    "tests/docs/test_figures.py",
    "tests/distributed/test_two_ranks.py",
    "tests/distributed/test_replicas.py",
    "tests/integration/test_cli_end_to_end.py",
    "tests/distributed/test_four_ranks.py",
    "tests/sim/test_compare_schedule_file.py",
    "tests/integration/test_placed_calibration.py",
    "tests/integration/test_executor_vs_simulator.py",
    "tests/docs/test_explorer.py",
    "tests/sim/test_cli_simulate.py",
    "tests/sim/test_count_reuse.py",
    "tests/sim/test_flops.py",
    "tests/sim/test_plan_interrupt.py",
    "tests/sim/test_bounded_sweep.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: k for k, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order
