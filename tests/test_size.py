"""A schedule's size against this machine's memory (gpipe.schedule.size, sim.core.size): refused at once and in
one line, with a small memory figure passed in; nothing here builds a large schedule."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from gpipe.checks import check_chunks
from gpipe.schedule import available_bytes, check_schedule_size, gpipe, schedule_bytes, zb_v
from gpipe.schedule.size import PAIR_BYTES, format_bytes
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.size import check_simulation_size, simulation_bytes

MiB = 2**20


def test_the_estimate_is_arithmetic_and_grows_with_the_pairs() -> None:
    start = time.perf_counter()
    assert schedule_bytes(10**12, 10**6) == 10**18 * PAIR_BYTES  # no task built
    assert time.perf_counter() - start < 5.0  # microseconds; building 10**18 tasks would never return
    assert simulation_bytes(8, 4) > schedule_bytes(8, 4)
    assert simulation_bytes(8, 4, written_spans=100, plot_rows=4) > simulation_bytes(8, 4)
    assert format_bytes(512) == "512 B" and format_bytes(3 * MiB) == "3 MiB" and format_bytes(2.5 * 2**40) == "2.5 TiB"


def test_a_schedule_over_the_memory_given_is_refused_in_one_line() -> None:
    check_schedule_size(8, 2, available=lambda: 64 * MiB)  # 16 pairs fit
    with pytest.raises(ValueError) as error:
        check_schedule_size(100_000, 2, "chunks=", available=lambda: 64 * MiB)
    message = str(error.value)
    assert message == ("chunks=100000 on 2 stages: the schedule (200,000 micro-batch-stage pairs) needs about "
                       f"{format_bytes(200_000 * PAIR_BYTES)} of memory, more than the 64 MiB available on this "
                       "machine: lower chunks=")
    with pytest.raises(ValueError, match="^--chunks 100000 on 1 stage: .*: lower --chunks$"):
        check_schedule_size(100_000, 1, "--chunks", available=lambda: 64 * MiB)
    check_schedule_size(10**9, 10**9, available=lambda: None)  # an unknown figure lets any size pass


def test_gpipe_s_chunks_are_bounded_before_any_task_is_built() -> None:
    """GPipe(m, [2, 2], chunks=10**9) once spent 53 s in its constructor before a MemoryError."""
    assert check_chunks(4, 2) == 4
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"^chunks=1000000000 on 2 stages: the schedule .* available on this "
                                         r"machine: lower chunks=$"):
        check_chunks(10**9, 2)
    with pytest.raises(ValueError, match="chunks=1000 on 4 stages"):
        check_chunks(1000, 4, available=lambda: MiB)
    assert time.perf_counter() - start < 10.0  # milliseconds; the bug took 53 s, generous on a loaded machine
    with pytest.raises(ValueError, match="chunks .* must be a positive integer, got 0"):
        check_chunks(0, 2)


def test_this_machine_s_memory_is_read() -> None:
    have = available_bytes()
    assert have is None or have > 0


def test_a_simulation_over_the_memory_given_is_refused() -> None:
    check_simulation_size(8, 4, given="x", fix="y", available=lambda: 64 * MiB)
    with pytest.raises(ValueError, match=r"^--chunks 100000 on --stages 4: the simulation \(400,000 micro-batch-stage "
                                         r"pairs\) needs about .* more than the 64 MiB available on this machine: "
                                         r"lower --chunks or --stages$"):
        check_simulation_size(100_000, 4, given="--chunks 100000 on --stages 4", fix="lower --chunks or --stages",
                              available=lambda: 64 * MiB)


def test_many_stages_cost_memory_linear_in_the_stages() -> None:
    """The copies' per-link times were a list per device pair: 20,000 stages took 3.2 GB; now a few MB."""
    n = 3000
    schedule = gpipe(1, n, "never")
    cost = CostModel((StageCost(1.0, 2.0),) * n, copy_seconds=0.0)
    tracemalloc.start()
    try:
        simulate(schedule, cost, SimConfig())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < simulation_bytes(1, n) < 30 * MiB  # n * n floats would be 72 MB


@pytest.mark.timeout(30)
def test_zb_v_on_many_stages_and_few_micro_batches_builds_in_linear_time() -> None:
    """ZB-V counted through every padding step of ``max(m, 2p - 1)`` micro-batches on every device: one
    micro-batch on 20,000 stages took minutes; its tasks take a fraction of a second."""
    start = time.perf_counter()
    schedule = zb_v(1, 20_000).validate()
    assert sum(map(len, schedule.tasks)) == 3 * 20_000
    assert time.perf_counter() - start < 10
