"""Predicted against measured for schedules that place several stages on a worker or split the backward.

Two schedules registered for these tests only, both GPipe's fill-drain underneath: ``looped-calib`` with the
registry's looped layout (stage j on device j % p), and ``split-calib`` with every ``B`` followed by its ``W``
(one stage per device). The experiment calibrates by the schedule's placement and tasks, never by its name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

from gpipe.schedule import Checkpoint, Op, Schedule, Task, gpipe, looped, register, unregister
from sim.calibration.experiment import Setup, run
from sim.calibration.host import executor_costs
from sim.calibration.outcome import Outcome
from sim.cli import main

LOOPED, SPLIT = "looped-calib", "split-calib"


def looped_gpipe(m: int, n: int, checkpoint: Checkpoint = "except_last",
                 placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's fill-drain, placed as given (by the looped layout, from ``GPipe``'s devices)."""
    return dataclasses.replace(gpipe(m, n, checkpoint, placement), name=LOOPED)


def split(m: int, n: int, checkpoint: Checkpoint = "except_last", placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's fill-drain with every backward split: ``B(i, j)`` then ``W(i, j)``."""
    base = gpipe(m, n, checkpoint, placement)
    lists = tuple(tuple(u for t in ts for u in ((t, Task(Op.W, t.microbatch, t.stage)) if t.op is Op.B else (t,)))
                  for ts in base.tasks)
    return dataclasses.replace(base, tasks=lists, name=SPLIT)


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    register(LOOPED, "GPipe's fill-drain, stage j on device j % p", layout=looped)(looped_gpipe)
    register(SPLIT, "GPipe's fill-drain, every B followed by its W")(split)
    try:
        yield
    finally:
        unregister(LOOPED)
        unregister(SPLIT)


def _model() -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(32, 32), nn.Tanh()]
    return nn.Sequential(*layers), torch.randn(16, 32)


QUICK = {"steps": 2, "warmup_steps": 1, "warmup": 0, "repeats": 1, "pair_rounds": 1}


def _same_orders(outcome: Outcome) -> None:
    c = outcome.comparison
    assert c.matched == sum(map(len, outcome.schedule.tasks)) and c.order_agreement == 1.0
    assert not c.only_predicted and not c.only_measured
    for d, tasks in enumerate(outcome.schedule.tasks):
        for timeline in (outcome.predicted, outcome.measured):
            assert tuple(s.task for s in timeline.compute_spans(d)) == tasks
    assert c.predicted_makespan > 0 and c.measured_makespan > 0


@pytest.mark.slow
def test_a_looped_schedule_runs_four_stages_on_two_workers_end_to_end() -> None:
    model, batch = _model()
    outcome = run(model, batch, Setup(chunks=2, schedule=LOOPED, stages=4, devices=("cpu", "cpu"), **QUICK))
    assert outcome.schedule.placement == (0, 1, 0, 1) and outcome.schedule.num_devices == 2
    assert outcome.predicted.num_devices == outcome.measured.num_devices == 2
    assert len(outcome.setup.balance or ()) == 4 and outcome.setup.devices == ("cpu", "cpu")
    report = outcome.report()
    assert report["placement"] == [0, 1, 0, 1] and report["schedule"] == LOOPED and report["n"] == 4
    _same_orders(outcome)
    pairs = executor_costs(outcome.cost).overheads.pairs  # only stages on different workers run at once
    assert pairs and all(j % 2 != k % 2 for _, j, _, k, _ in pairs)


@pytest.mark.slow
def test_a_split_schedule_prices_its_w_tasks_from_their_own_measurement() -> None:
    model, batch = _model()
    outcome = run(model, batch, Setup(chunks=2, schedule=SPLIT, balance=(4, 4), devices=("cpu", "cpu"), **QUICK))
    assert outcome.schedule.splits_weight_gradient
    assert all(s.weight > 0 for s in outcome.cost.stages)
    assert all(e.weight_recorded is not None and e.weight_recorded > 0 for e in executor_costs(outcome.cost).stages)
    assert {s.task.op for s in outcome.predicted.compute_spans()} == {Op.F, Op.R, Op.B, Op.W}
    _same_orders(outcome)
    assert any(op.op == "W" and op.count == 4 for op in outcome.comparison.ops)


@pytest.mark.slow
def test_the_demo_runs_a_looped_schedule_on_fewer_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--schedule", LOOPED, "--stages", "4", "--devices", "2", "--chunks", "2", "--steps", "1",
                 "--json", "--no-progress", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schedule"] == LOOPED and report["placement"] == [0, 1, 0, 1] and report["devices"] == ["cpu"] * 2
    assert report["predicted_makespan"] > 0 and report["measured_makespan"] > 0
    assert report["comparison"]["order_agreement"] == 1.0
    assert json.loads((out / "report.json").read_text())["placement"] == [0, 1, 0, 1]
