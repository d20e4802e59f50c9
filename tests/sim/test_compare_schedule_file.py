"""``gpipe-sim compare --schedule FILE``: a schedule from a file (``.txt`` the text form, ``.csv`` torch pipelining's)
runs as it is on the executor and the simulator (Note [a schedule file] in :mod:`sim.cli.compare`); the flags it
decides follow it; every bad file or disagreement is one line and exit status 2, before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpipe.schedule import (
    Schedule,
    from_pipelining,
    one_f_one_b,
    parse_schedule,
    read_pipelining_csv,
    read_schedule,
    schedule_text,
    to_pipelining,
    write_pipelining_csv,
    write_schedule,
    zb_v,
)
from sim.calibration.experiment import Setup, run
from sim.cli import CommandError, main
from sim.cli.compare import load

MODEL = '''
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)]
    return nn.Sequential(*layers), torch.randn(8, 8)
'''

# 1F1B with device 0's list reordered (its F1@0 after B0@0): valid, and not what any generator builds
EDITED = parse_schedule(schedule_text(one_f_one_b(4, 2, "always")).replace("device 0: F0@0 F1@0 R0@0 B0@0",
                                                                           "device 0: F0@0 R0@0 B0@0 F1@0")
                        .replace("name: 1f1b", "name: edited"))


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's model and schedule files in the current folder: ``edited.txt`` (1F1B reordered, always) and
    ``zbv.csv`` (ZB-V's 4 stages on 2 devices)."""
    (tmp_path / "tiny.py").write_text(MODEL)
    write_schedule(EDITED, tmp_path / "edited.txt")
    write_pipelining_csv(zb_v(4, 4, placement=(0, 1, 1, 0)), tmp_path / "zbv.csv")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def setups(monkeypatch: pytest.MonkeyPatch) -> list[Setup]:
    """The experiment is not run: each Setup ``compare`` would run lands in the list, and the command fails."""
    seen: list[Setup] = []

    def experiment(model: object, batch: object, setup: Setup, **kwargs: object) -> None:
        seen.append(setup)
        raise CommandError("stopped before the experiment")

    monkeypatch.setattr("sim.cli.demo.run", experiment)
    return seen


def _setup(files: Path, setups: list[Setup], *args: str) -> Setup:
    assert main(["compare", "tiny.py:build", *args, "--out", str(files / "out"), "--no-progress"]) == 2
    assert len(setups) == 1
    return setups[0]


def test_a_text_file_is_the_schedule_both_halves_run(files: Path, setups: list[Setup]) -> None:
    setup = _setup(files, setups, "--schedule", "edited.txt")
    assert setup.schedule == EDITED and setup.schedule == read_schedule(files / "edited.txt")
    assert (setup.chunks, setup.checkpoint, setup.partitions, setup.devices) == (4, "always", 2, ("cpu", "cpu"))


def test_a_csv_file_takes_its_recomputes_from_checkpoint(files: Path, setups: list[Setup]) -> None:
    setup = _setup(files, setups, "--schedule", "zbv.csv", "--checkpoint", "except_last")
    assert setup.schedule == read_pipelining_csv(files / "zbv.csv", "except_last")
    assert isinstance(setup.schedule, Schedule) and setup.schedule.name == "zbv"
    assert (setup.chunks, setup.checkpoint, setup.partitions) == (4, "except_last", 4)
    assert setup.devices == ("cpu", "cpu") and setup.placement() == (0, 1, 1, 0)  # one device per schedule device


def test_agreeing_flags_are_accepted(files: Path, setups: list[Setup]) -> None:
    setup = _setup(files, setups, "--schedule", "edited.txt", "--chunks", "4", "--checkpoint", "always",
                   "--stages", "2", "--balance", "3,4", "--devices", "cpu,cpu")
    assert setup.schedule == EDITED and setup.balance == (3, 4)


def test_a_registered_name_keeps_its_defaults(files: Path, setups: list[Setup]) -> None:
    setup = _setup(files, setups, "--schedule", "1f1b")
    assert (setup.schedule, setup.chunks, setup.checkpoint) == ("1f1b", 4, "except_last")


@pytest.mark.parametrize(("args", "message"), [
    (["--schedule", "plan.json"], "--schedule 'plan.json' is neither a registered schedule (gpipe, 1f1b"),
    (["--schedule", "plan.json"], "nor a schedule file: FILE.txt (gpipe-sim's text form) or FILE.csv"),
    (["--schedule", "absent.txt"], "--schedule absent.txt: no such file"),
    (["--schedule", "bad.txt"], "--schedule bad.txt: line 3: the micro-batch count is a positive integer"),
    (["--schedule", "bad.csv"], "--schedule bad.csv: rank 0: not an action: 'nonsense'"),
    (["--schedule", "edited.txt", "--chunks", "2"],
     "--chunks 2, but the schedule in edited.txt has chunks 4: leave --chunks out (the file decides it) or give "
     "--chunks 4"),
    (["--schedule", "edited.txt", "--checkpoint", "never"], "--checkpoint never, but the schedule in edited.txt has "
                                                            "checkpoint always"),
    (["--schedule", "edited.txt", "--stages", "3"], "--stages 3, but the schedule in edited.txt has stages 2"),
    (["--schedule", "edited.txt", "--balance", "1,2,4"],
     "--balance has 3 partitions but the schedule in edited.txt has 2 stages"),
    (["--schedule", "edited.txt", "--devices", "cpu,cpu"], None),  # agreeing: reaches the experiment
    (["--schedule", "many.txt"], "the schedule in many.txt runs 16 micro-batches, more than the 8 samples of the "
                                 "mini-batch"),
])
def test_a_bad_file_or_a_disagreement_is_one_line_before_any_work(files: Path, setups: list[Setup],
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  args: list[str], message: str | None) -> None:
    (files / "bad.txt").write_text(schedule_text(EDITED).replace("microbatches: 4", "microbatches: four"))
    (files / "bad.csv").write_text("0F0,nonsense\n")
    write_schedule(one_f_one_b(16, 2), files / "many.txt")
    assert main(["compare", "tiny.py:build", *args, "--out", str(files / "out"), "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    if message is None:
        assert lines[0] == "gpipe-sim compare: error: stopped before the experiment" and len(setups) == 1
    else:
        assert lines[0].startswith("gpipe-sim compare: error: ") and message in lines[0], lines[0]
        assert not setups and not (files / "out").exists()


@pytest.mark.slow
def test_compare_runs_a_text_file_end_to_end(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = files / "cmp"
    assert main(["compare", "tiny.py:build", "--schedule", "edited.txt", "--steps", "1", "--out", str(out),
                 "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["schedule"], report["m"], report["n"], report["checkpoint"]) == ("edited", 4, 2, "always")
    assert report["order_agreement"] == 1.0
    assert report["comparison"]["only_predicted"] == [] and report["comparison"]["only_measured"] == []
    assert json.loads((out / "report.json").read_text())["schedule"] == "edited"


@pytest.mark.slow
def test_the_experiment_runs_exactly_the_given_schedule_on_both_halves(files: Path) -> None:
    """A schedule of 4 stages on 2 devices from torch's actions: the executor measured, and the simulator
    predicted, each device's list in the file's order."""
    schedule = from_pipelining(to_pipelining(zb_v(4, 4, placement=(0, 1, 1, 0))), "except_last", name="imported")
    model, batch = load("tiny.py:build")
    setup = Setup(chunks=4, checkpoint="except_last", schedule=schedule, balance=(2, 2, 2, 1), devices=("cpu", "cpu"),
                  steps=1, warmup_steps=1, pair_rounds=1)
    outcome = run(model, batch, setup)
    assert outcome.schedule is schedule
    for d in range(2):
        assert outcome.measured.task_order(d) == list(schedule.tasks[d])
        assert outcome.predicted.task_order(d) == list(schedule.tasks[d])


def test_processes_need_a_rank_per_schedule_device(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "tiny.py:build", "--schedule", "edited.txt", "--processes", "3", "--out",
                 str(files / "out"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == ("gpipe-sim compare: error: schedule 'edited' runs on 2 devices, a rank "
                                               "each: give --processes 2")


@pytest.mark.slow
def test_compare_runs_a_file_on_processes(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "tiny.py:build", "--schedule", "edited.txt", "--processes", "2", "--steps", "1",
                 "--out", str(files / "cmp"), "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["schedule"], report["m"], report["checkpoint"], report["processes"]) == ("edited", 4, "always", 2)
