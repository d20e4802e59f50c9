"""sim.core.sharing.SharedCores: exact processor sharing, uniform or by measured pairs, against closed forms."""

from __future__ import annotations

from collections.abc import Generator, Hashable
from typing import Any

import pytest
import simpy

from sim.core.sharing import SharedCores


def finish_times(cores_of: Any, jobs: list[tuple[float, float, Hashable]]) -> list[float]:
    """Start each ``(at, work, key)`` job at its time on one SharedCores; when each ends."""
    env = simpy.Environment()
    cores = cores_of(env)
    ends = [0.0] * len(jobs)

    def job(k: int, at: float, work: float, key: Hashable) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(at)
        yield cores.run(work, key)
        ends[k] = env.now

    for k, (at, work, key) in enumerate(jobs):
        env.process(job(k, at, work, key))
    env.run()
    return ends


def test_uniform_contention_shares_equally_while_both_run() -> None:
    # both at rate 1/2 until the first ends at 2 (1 s of work); the second's last second runs alone
    ends = finish_times(lambda env: SharedCores(env, 1.0), [(0.0, 1.0, None), (0.0, 2.0, None)])
    assert ends == pytest.approx([2.0, 3.0])


def test_a_late_job_slows_the_running_one_from_its_start() -> None:
    # the first runs alone for 1 s (1 of 2 s done), then both at 1/2: both end at 3
    ends = finish_times(lambda env: SharedCores(env, 1.0), [(0.0, 2.0, None), (1.0, 1.0, None)])
    assert ends == pytest.approx([3.0, 3.0])


def test_no_contention_means_no_slowdown() -> None:
    ends = finish_times(lambda env: SharedCores(env, 0.0), [(0.0, 1.0, None), (0.5, 2.0, None)])
    assert ends == pytest.approx([1.0, 2.5])


def test_pairs_slow_each_job_by_what_it_runs_beside() -> None:
    # a beside b runs at 1/2, b beside a at full speed: b ends at 1 (a has done 0.5), a's last 0.5 alone
    pairs = [("a", "b", 1.0), ("b", "a", 0.0)]
    ends = finish_times(lambda env: SharedCores(env, 5.0, pairs), [(0.0, 1.0, "a"), (0.0, 1.0, "b")])
    assert ends == pytest.approx([1.5, 1.0])


def test_a_pair_not_listed_falls_back_to_contention() -> None:
    # a beside b: 1/(1 + 1); c beside anything: contention 3 -> 1/4 beside one, 1/7 beside two
    pairs = [("a", "b", 1.0), ("b", "a", 1.0)]
    ends = finish_times(lambda env: SharedCores(env, 3.0, pairs), [(0.0, 1.0, "a"), (0.0, 1.0, "b")])
    assert ends == pytest.approx([2.0, 2.0])
    # three at once: a and b each slowed by 1 (the other) + 3 (c) -> 1/5; c by 3 + 3 -> 1/7.
    # a and b end at 5; c has done 5/7 of 1, then runs alone: ends at 5 + 2/7
    ends = finish_times(lambda env: SharedCores(env, 3.0, pairs),
                        [(0.0, 1.0, "a"), (0.0, 1.0, "b"), (0.0, 1.0, "c")])
    assert ends == pytest.approx([5.0, 5.0, 5.0 + 2.0 / 7.0])


def test_host_seconds_are_not_slowed_but_slow_the_others() -> None:
    # a: 2 s of work, 1 of them host: beside b its rate is 1 / (1 + 1 * 1/2), so it ends at 3
    # (1 host second + 1 stage second * (1 + 1)); b runs at 1/2 all that time, then its last 8.5 alone
    env = simpy.Environment()
    cores = SharedCores(env, 1.0)
    ends: dict[str, float] = {}

    def job(name: str, work: float, host: float) -> Generator[simpy.Event, Any, None]:
        yield cores.run(work, name, host)
        ends[name] = env.now

    env.process(job("a", 2.0, 1.0))
    env.process(job("b", 10.0, 0.0))
    env.run()
    assert ends == pytest.approx({"a": 3.0, "b": 11.5})


@pytest.mark.parametrize("host", [-0.1, 1.5])
def test_host_seconds_outside_the_work_are_refused(host: float) -> None:
    cores = SharedCores(simpy.Environment(), 1.0)
    with pytest.raises(ValueError, match="host seconds"):
        cores.run(1.0, "a", host)
