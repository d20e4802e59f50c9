"""Hostile input to ``demo``, ``compare`` and ``search`` (issue 46): a step count past the cap refused before any
work, progress labels made one at a time, a large searched chart drawn with few artists and a heuristic within its
time limit, no folder that mixes two runs' files, and Ctrl-C during a CP-SAT search as exit 130 with nothing written.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from gpipe.schedule import looped, zb_h1
from gpipe.schedule.plot import COLOURS, plot_timeline
from gpipe.schedule.search import StageCosts, search
from gpipe.schedule.search_costs import Problem
from gpipe.schedule.search_greedy import RULES, Lists, Rule
from sim.calibration.experiment import Setup, progress_labels
from sim.cli import main
from sim.cli.demo import MAX_STEPS
from sim.cli.search import simulated

SEARCH = ["search", "--stages", "4", "--time-limit", "2", "--solver", "greedy"]


@pytest.mark.parametrize("command", [["demo"], ["compare", "no_such_module:build"]])
@pytest.mark.parametrize("steps", [MAX_STEPS + 1, 10**9])
def test_steps_past_the_cap_are_one_line_exit_2_before_any_work(command: list[str], steps: int, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 no_experiment: None) -> None:
    out = tmp_path / "out"
    assert main([*command, "--steps", str(steps), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpipe-sim {command[0]}: error: --steps {steps} "), err
    assert f"from 1 to {MAX_STEPS}" in err[0]  # the cap, stated
    assert not out.exists()


def test_progress_labels_are_made_one_at_a_time() -> None:
    tracemalloc.start()
    try:
        labels = progress_labels(Setup(steps=10**6))
        assert len(labels) == 3 + 2 + 10**6 + 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"{peak} bytes for the labels of a million steps"
    labels = progress_labels(Setup(steps=10**9, balance=(10, 10)))  # a list of them would fill the memory
    assert len(labels) == 2 + 2 + 10**9 + 2
    assert (labels[0], labels[2], labels[3], labels[4]) == ("calibrate", "warm-up step 1", "warm-up step 2", "step 1")
    assert labels[-3:] == ["step 1000000000", "simulate", "compare"]
    assert list(progress_labels(Setup(steps=2, warmup_steps=0))) == ["balance", "calibrate", "overheads", "step 1",
                                                                     "step 2", "simulate", "compare"]


def test_a_chart_of_48000_spans_is_a_few_collections() -> None:
    n, m = 40, 400
    timeline = simulated(zb_h1(m, n), StageCosts.uniform(n, 1, 1, 1))
    assert len(timeline.spans) == 3 * m * n
    fig = plot_timeline(timeline)
    try:
        ax = fig.axes[0]
        assert len(ax.collections) <= n * len(COLOURS)  # one per row and colour, not one per span
        assert len(ax.get_children()) < 20 * n
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_heuristic_tries_the_rules_that_fit_its_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    search_module = importlib.import_module("gpipe.schedule.search")  # the package's name search is the function
    tried: list[str] = []
    original = search_module.list_schedule

    def counted(problem: Problem, rule: Rule) -> tuple[Lists, float]:
        tried.append(rule.name)
        return original(problem, rule)

    monkeypatch.setattr(search_module, "list_schedule", counted)
    costs = StageCosts.uniform(20, 1, 2, 1)
    short = search(50, looped(20, 20), costs, time_limit=0.1, solver="greedy")  # 3,000 tasks: one rule fits
    assert tried == [RULES[0].name]
    short.schedule.validate()
    tried.clear()
    search(50, looped(20, 20), costs, time_limit=10.0, solver="greedy")
    assert tried == [rule.name for rule in RULES]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_an_interrupted_search_leaves_the_last_runs_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main([*SEARCH, "--chunks", "8", "--out", str(out)]) == 0
    first = _files(out)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the chart is drawn

    monkeypatch.setattr("gpipe.schedule.plot.plot_timeline", interrupted)
    assert main([*SEARCH, "--chunks", "6", "--out", str(out), "--force"]) == 130
    assert _files(out) == first


def test_ctrl_c_during_a_cp_sat_search_exits_130_and_writes_nothing(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """SIGINT while CP-SAT searches (its time limit an hour) stops it: exit 130, no files, within seconds."""
    pytest.importorskip("ortools")
    out = tmp_path / "out"
    finished = threading.Event()

    def interrupt_while_solving() -> None:
        give_up = time.monotonic() + 60.0  # the solver thread starts in well under a second; generous under load
        while time.monotonic() < give_up and not any(t.name == "cp-sat" for t in threading.enumerate()):
            time.sleep(0.02)
        time.sleep(0.3)  # inside the solve
        if not finished.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_while_solving, daemon=True)
    interrupter.start()
    try:
        status = main(["search", "--stages", "4", "--chunks", "8", "--forward-time", "1,2,1,3", "--backward-time",
                       "2,3,2,5", "--weight-time", "1,1,2,2", "--copy-time", "0.3", "--memory-limit", "3",
                       "--solver", "cp-sat", "--time-limit", "3600", "--out", str(out)])
    finally:
        finished.set()
    interrupter.join()
    assert status == 130, capsys.readouterr().out
    assert not out.exists()
    assert capsys.readouterr().out == ""
