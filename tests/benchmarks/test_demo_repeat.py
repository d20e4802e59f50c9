"""The demo series' noisy neighbour (Note [a noisy neighbour] in benchmarks/demo_repeat.py): its pattern is read as
BUSY,IDLE seconds or refused with the form to use, and the process it starts spins until it is ended."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.demo_repeat import burst, neighbour


def test_a_burst_is_busy_then_idle_seconds() -> None:
    assert burst("0.2,0.3") == (0.2, 0.3)
    assert burst("1,0.5") == (1.0, 0.5)


@pytest.mark.parametrize("text", ["0.2", "0.2,0.3,1", "a,b", "0,0.3", "0.2,-1"])
def test_a_burst_that_is_not_two_positive_seconds_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="BUSY,IDLE|positive seconds"):
        burst(text)


def test_the_neighbour_runs_until_it_is_ended() -> None:
    other = neighbour(0.01, 0.01)
    try:
        with pytest.raises(Exception, match="timed out"):
            other.wait(timeout=0.5)  # still spinning and sleeping: it never ends by itself
    finally:
        other.kill()
    assert other.wait(timeout=10) != 0
