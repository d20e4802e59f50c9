"""Fixtures the simulator's command-line tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_experiment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``demo`` and ``compare`` fail the test if they get as far as labelling or running the experiment."""
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the experiment started")

    monkeypatch.setattr("sim.cli.demo.run", started)
    monkeypatch.setattr("sim.cli.demo.progress_labels", started)
