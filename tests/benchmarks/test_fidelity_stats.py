"""The fidelity benchmark's statistics on hand-made samples: trimmed means, a row's own noise, the steady-row gate;
and its schedule axis (``benchmarks/_shared/fidelity.py``)."""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest


@pytest.fixture(scope="module")
def fidelity() -> ModuleType:
    return importlib.import_module("benchmarks.fidelity")


def test_trimmed_mean_drops_a_fifth_at_each_end() -> None:
    from benchmarks._shared.fidelity import trimmed_mean

    values = (100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, -50.0)
    assert trimmed_mean(values) == statistics.mean([2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    assert trimmed_mean((3.0, 1.0, 2.0), cut=0.0) == 2.0


def _attempts(drifts: list[float | None], backgrounds: list[float] | None = None
              ) -> tuple[Callable[[], tuple[Any, float]], list[int]]:
    """An attempt function handing out stand-in outcomes of the given drifts, and a count of its calls."""
    calls: list[int] = []
    backgrounds = backgrounds or [0.0] * len(drifts)

    def attempt() -> tuple[Any, float]:
        k = len(calls)
        calls.append(k)
        # the error is the opposite of the drift's order: the gate must not look at it
        return SimpleNamespace(drift=drifts[k], error=-k, name=f"try {k}"), backgrounds[k]
    return attempt, calls


def test_a_steady_first_attempt_is_kept_alone(fidelity: ModuleType) -> None:
    attempt, calls = _attempts([0.05, 0.0, 0.0])
    (kept, _), tries = fidelity.steadiest(attempt)
    assert kept.name == "try 0" and len(tries) == 1 and calls == [0]


def test_an_unsteady_row_runs_again_and_keeps_its_steadiest_attempt(fidelity: ModuleType) -> None:
    attempt, calls = _attempts([0.2, -0.12, 0.3])
    (kept, _), tries = fidelity.steadiest(attempt, tries=3)
    assert calls == [0, 1, 2] and [t[0].name for t in tries] == ["try 0", "try 1", "try 2"]
    assert kept.name == "try 1"  # the smallest drift in size, whatever its error

    attempt, calls = _attempts([0.2, 0.07, 0.0])
    (kept, _), tries = fidelity.steadiest(attempt, tries=3)
    assert calls == [0, 1] and kept.name == "try 1"  # fit at the limit's near side: no third attempt


def test_a_busy_machine_runs_again_and_a_quiet_attempt_wins(fidelity: ModuleType) -> None:
    attempt, calls = _attempts([0.0, 0.1, 0.0], backgrounds=[0.9, 0.0, 0.9])
    (kept, background), tries = fidelity.steadiest(attempt, tries=3)
    assert calls == [0, 1, 2] and kept.name == "try 1" and background == 0.0
    assert not fidelity.fit(SimpleNamespace(drift=None), 0.0)  # too few steps to tell: not steady


def test_standard_error_of_the_block_errors(fidelity: ModuleType) -> None:
    errors = [0.0, 0.1, 0.0, -0.1, 0.0]
    assert fidelity.standard_error(errors) == pytest.approx(statistics.stdev(errors) / math.sqrt(5))
    assert fidelity.standard_error([0.04] * 5) == 0.0
    assert fidelity.standard_error([0.1]) is None


def test_the_schedule_axis_takes_any_registered_name(fidelity: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """Note [schedule axis]: two stages per worker for a schedule with a layout, one otherwise; a shape the generator
    refuses is named, not run; an unregistered name is refused before anything runs."""
    from benchmarks._shared.fidelity import refusal, stages_for
    from gpipe.schedule import Checkpoint, Schedule, gpipe, looped, register, unregister

    def picky(m: int, n: int, checkpoint: Checkpoint = "never", placement: Any = None) -> Schedule:
        if m < n:
            raise ValueError(f"picky needs m >= n, got m={m}, n={n}")
        return gpipe(m, n, checkpoint, placement)

    register("picky-looped", "GPipe's fill-drain, looped, at least n micro-batches", layout=looped)(picky)
    try:
        assert stages_for("gpipe") == stages_for("1f1b") == 2
        assert stages_for("picky-looped") == 4
        assert refusal("picky-looped", 1, 4, "never") == "picky needs m >= n, got m=1, n=4"
        assert refusal("picky-looped", 4, 4, "never") is None
        assert refusal("gpipe", 1, 2, "always") is None
    finally:
        unregister("picky-looped")
    with pytest.raises(SystemExit) as exit_info:
        fidelity.main(["--schedules", "gpipe,zigzag"])
    assert exit_info.value.code == 2
    assert "unknown schedule(s) zigzag; registered: gpipe, 1f1b" in capsys.readouterr().err
