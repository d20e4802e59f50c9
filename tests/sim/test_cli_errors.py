"""The command line's edges: the output folder, overwriting, the user's own errors, pipes, ranges and JSON.

Every command here runs without the executor: ``demo`` and ``compare`` get a synthetic outcome in place
of :func:`sim.calibration.experiment.run`, and a check that must come before any work replaces that work with a
function that fails the test if it is called.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpipe.schedule import gpipe
from sim.calibration.compare import compare
from sim.calibration.experiment import Setup
from sim.calibration.host import Overheads, executor_costs, with_overheads
from sim.calibration.outcome import Outcome
from sim.cli import main
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import simulate

SIMULATE = ["simulate", "--stages", "2", "--chunks", "2", "--checkpoint", "never"]
PLAN = ["plan", "--model", "gpt:125m", "--batch", "8", "--gpus", "1", "--hardware", "h100-sxm"]


def _strict_json(text: str) -> Any:
    """Parse ``text`` as JSON proper: ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON output")

    return json.loads(text, parse_constant=refuse)


def _outcome(measured_peak: bool = True) -> Outcome:
    schedule = gpipe(4, 2, "except_last")
    cost = with_overheads(CostModel.uniform(2, 1e-3, 2e-3, saved_bytes=1000, checkpoint_bytes=100),
        Overheads(task=1e-5, handoff=2e-5, contention=0.1))
    predicted = simulate(schedule, cost)
    measured = predicted.shifted(5.0)
    if not measured_peak:  # a measurement without memory samples: the peak error is infinite
        measured = simulate(schedule, with_overheads(CostModel.uniform(2, 1e-3, 2e-3), executor_costs(cost).overheads))
    return Outcome(Setup(balance=(1, 2), devices=("cpu", "cpu"), steps=3), schedule, cost, SimConfig(), predicted,
                   measured, (0.2, 0.1, 0.3), 1, compare(predicted, measured), {"simulate": 0.01}, "a test model")


@pytest.fixture
def fake_experiment(monkeypatch: pytest.MonkeyPatch) -> list[Outcome]:
    """``demo`` and ``compare`` get a synthetic outcome at once; the list holds what the next run returns."""
    outcomes = [_outcome()]

    def run(*args: object, **kwargs: object) -> Outcome:
        return outcomes[0]

    monkeypatch.setattr("sim.cli.demo.run", run)
    return outcomes


def _one_line(capsys: pytest.CaptureFixture[str], command: str, *needles: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"gpipe-sim {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


# -- the output folder is checked before any work --------------------------------------------------


def _bad_folders(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "a-file").write_text("not a folder")
    return {"a file": (str(tmp_path / "a-file"), "is a file, not a folder"),
            "under a file": (str(tmp_path / "a-file" / "out"), "is a file, not a folder"),
            "under /sys": ("/sys/gpipe-sim-out", "under /sys"),
            "under /proc": ("/proc/gpipe-sim-out", "under /proc")}


@pytest.mark.parametrize("case", ["a file", "under a file", "under /sys", "under /proc"])
@pytest.mark.parametrize("command", ["simulate", "demo", "compare", "plan"])
def test_a_bad_out_is_one_line_before_any_work(case: str, command: str, tmp_path: Path, no_experiment: None,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out, message = _bad_folders(tmp_path)[case]

    def count(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was counted")

    monkeypatch.setattr("sim.cli.plan.count_layers", count)
    argv = {"simulate": SIMULATE, "demo": ["demo"], "compare": ["compare", "nosuchmodule:build"],
            "plan": PLAN}[command]
    assert main([*argv, "--out", out]) == 2
    _one_line(capsys, command, "--out", message)


@pytest.mark.parametrize("command", ["simulate", "demo", "compare", "plan"])
def test_a_link_to_nothing_or_an_empty_out_is_one_line(command: str, tmp_path: Path, no_experiment: None,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dangling link once ended in a FileExistsError traceback, and ``--out ''`` wrote into the current folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sim.cli.plan.count_layers", lambda *a, **k: pytest.fail("the model was counted"))
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    argv = {"simulate": SIMULATE, "demo": ["demo"], "compare": ["compare", "nosuchmodule:build"],
            "plan": PLAN}[command]
    for out, needles in ((str(tmp_path / "dangling"), ("is a symbolic link to", "which does not exist")),
                         (str(tmp_path / "dangling" / "sub"), ("is a symbolic link to",)),
                         ("", ("--out '' names no folder",))):
        assert main([*argv, "--out", out]) == 2
        _one_line(capsys, command, *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling"]


def test_an_unwritable_out_is_refused(tmp_path: Path, no_experiment: None, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and real(path, mode, **kw))
    for target in (locked, locked / "new"):
        assert main(["demo", "--out", str(target)]) == 2
        _one_line(capsys, "demo", f"--out {target}", "is not writable")
    assert list(locked.iterdir()) == []


# -- no file is overwritten unless asked; no stale file is left ---------------------------------------


def test_simulate_refuses_to_overwrite_an_earlier_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main([*SIMULATE, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main([*SIMULATE, "--forward-time", "5", "--out", str(out)]) == 2
    _one_line(capsys, "simulate", "--force", "timeline.png", "trace.json", "timeline.json")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    assert main([*SIMULATE, "--forward-time", "5", "--out", str(out), "--force", "--json"]) == 0
    assert _strict_json(capsys.readouterr().out)["makespan"] == (2 + 2 - 1) * (5 + 2)  # (m + n - 1)(t_f + t_b)
    assert (out / "timeline.json").read_bytes() != before["timeline.json"]


def test_force_removes_the_stale_files_of_ours_and_nothing_else(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main([*SIMULATE, "--out", str(out)]) == 0  # a folder with only the user's files is fine
    assert (out / "timeline.png").exists()
    monkeypatch.setattr("sim.cli.simulate.PLOT_SPAN_LIMIT", 0)  # a "large" run: no picture
    assert main([*SIMULATE, "--out", str(out), "--force"]) == 0
    names = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    assert names == {"trace.json", "timeline.json", "notes.txt"}  # the earlier picture is gone, the notes stay
    assert (out / "notes.txt").read_text() == "mine"
    capsys.readouterr()


def test_a_file_of_the_users_with_one_of_our_names_is_not_overwritten(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "trace.json").write_text("my own trace")
    assert main([*SIMULATE, "--out", str(out)]) == 2
    _one_line(capsys, "simulate", "trace.json", "--force")
    assert (out / "trace.json").read_text() == "my own trace" and not (out / "timeline.json").exists()


def test_demo_and_compare_refuse_to_overwrite(tmp_path: Path, fake_experiment: list[Outcome],
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny.py").write_text("import torch\nfrom torch import nn\n\ndef build():\n"
                                      "    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(8, 4)\n")
    monkeypatch.chdir(tmp_path)
    for argv in (["demo"], ["compare", "tiny:build"]):
        out = tmp_path / argv[0]
        assert main([*argv, "--out", str(out), "--no-progress"]) == 0
        assert {p.name for p in out.iterdir() if not p.name.startswith(".")} == {"timeline.png", "trace.json",
                                                                                 "report.json"}
        capsys.readouterr()
        assert main([*argv, "--out", str(out), "--no-progress"]) == 2
        _one_line(capsys, argv[0], "--force", "report.json")
        assert main([*argv, "--out", str(out), "--no-progress", "--force"]) == 0


def test_the_default_folder_is_fresh_each_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [fresh folder]: no ``--out``: ``out``, then ``out-2``, the first run's files untouched."""
    monkeypatch.chdir(tmp_path)
    assert main(SIMULATE) == 0
    assert "wrote out/trace.json" in capsys.readouterr().out
    first = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert main([*SIMULATE, "--forward-time", "5"]) == 0
    assert "wrote out-2/trace.json" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == first
    assert set(first) == {p.name for p in (tmp_path / "out-2").iterdir()}
    assert (tmp_path / "out-2" / "timeline.json").read_bytes() != first["timeline.json"]
    assert main([*SIMULATE, "--out", "out"]) == 2  # a folder the user names is still refused
    _one_line(capsys, "simulate", "--out out", "--force")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == first
    assert main([*SIMULATE, "--force"]) == 0  # --force alone replaces in the default folder itself
    assert "wrote out/trace.json" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out-2"]


def test_a_fresh_folder_skips_taken_names_and_takes_an_empty_one(tmp_path: Path) -> None:
    from sim.files import OutputFolder, fresh_folder

    assert fresh_folder(tmp_path / "demo") == tmp_path / "demo"
    (tmp_path / "demo").mkdir()
    assert fresh_folder(tmp_path / "demo") == tmp_path / "demo"  # an empty folder is free
    (tmp_path / "demo" / "notes.txt").write_text("mine")
    (tmp_path / "demo-2").write_text("a file, not a folder")
    assert fresh_folder(tmp_path / "demo") == tmp_path / "demo-3"
    out = OutputFolder(tmp_path / "demo", ("a.txt",), fresh=True)
    (tmp_path / "demo-3").mkdir()
    (tmp_path / "demo-3" / "b.txt").write_text("another run's, written meanwhile")
    assert out.write_text("a.txt", "ours") == str(tmp_path / "demo-4" / "a.txt")


def test_plan_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "tiny.py"
    model.write_text("import torch\nfrom torch import nn\n\ndef build():\n"
                     "    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4)\n")
    argv = ["plan", "--model", f"{model}:build", "--batch", "4", "--gpus", "1", "--hardware", "h100-sxm",
            "--chunks", "1", "--checkpoint", "never", "--schedule", "gpipe", "--out", str(tmp_path / "plan")]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    _one_line(capsys, "plan", "plan.json", "--force")
    assert main([*argv, "--force"]) == 0


# -- the user's own errors ----------------------------------------------------------------------------

USER_CODE = '''
import torch
from torch import nn


class Picky(nn.Module):
    def forward(self, x):
        raise ValueError("Picky refuses every input")


def broken():
    layers = {}
    return layers["encoder"], torch.randn(8, 4)


def picky():
    return nn.Sequential(nn.Linear(4, 4), Picky()), torch.randn(8, 4)


def mismatched():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(16, 2)), torch.randn(8, 4)
'''


@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "usercode.py").write_text(USER_CODE)
    (tmp_path / "fails_on_import.py").write_text("import torch\n\nSIZE = 4\nWIDTH = SIZE * HEIGHT\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _users_traceback(capsys: pytest.CaptureFixture[str], command: str, target: str, *needles: str) -> str:
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith(f"gpipe-sim {command}: error in your code ({target})"), err
    assert "Traceback (most recent call last):" in err
    for needle in needles:
        assert needle in err, err
    assert f"sim{os.sep}cli" not in err  # the traceback starts in the user's code, not ours
    return err


@pytest.mark.parametrize(("target", "needles"), [
    ("usercode:broken", ('usercode.py", line 13, in broken', "KeyError: 'encoder'")),
    ("fails_on_import:build", ('fails_on_import.py", line 4', "NameError: name 'HEIGHT' is not defined")),
    ("usercode:picky", ('usercode.py", line 8, in forward', "ValueError: Picky refuses every input")),
])
def test_compare_shows_the_users_traceback(user_code: Path, target: str, needles: tuple[str, ...],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", target, "--balance", "1,1", "--devices", "cpu,cpu", "--steps", "1", "--no-progress",
            "--out", str(user_code / "out")]
    assert main(argv) == 1
    _users_traceback(capsys, "compare", target, *needles)


def test_plan_shows_the_users_traceback(user_code: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "usercode:broken", "--batch", "8", "--gpus", "1", "--hardware", "h100-sxm"]) == 1
    _users_traceback(capsys, "plan", "usercode:broken", "KeyError: 'encoder'")


@pytest.mark.parametrize("command", ["compare", "plan"])
def test_a_model_whose_shapes_do_not_chain_is_one_line_naming_the_layer(
        command: str, user_code: Path, no_experiment: None, capsys: pytest.CaptureFixture[str]) -> None:
    """torch raises the error inside its own Linear, so no frame is the user's: once 82 lines of our traceback
    (plan) and 43 (compare); now the layer and the error, exit status 2, before any work."""
    argv = {"compare": ["compare", "usercode:mismatched", "--no-progress"],
            "plan": ["plan", "--model", "usercode:mismatched", "--batch", "8", "--gpus", "1",
                     "--hardware", "h100-sxm"]}[command]
    assert main([*argv, "--out", str(user_code / "out")]) == 2
    line = _one_line(capsys, command, "usercode:mismatched: layer 2 of your model, Linear(in_features=16, "
                     "out_features=2, bias=True), fails on the output of the layers before it: RuntimeError: ")
    assert "Traceback" not in line and not (user_code / "out").exists()


def test_plan_refuses_a_sweep_too_large_for_this_machine_before_its_first_simulation(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``plan --chunks 1000000000`` once ran until the kernel killed it (sim.core.size)."""
    assert main([*PLAN[:4], "1000000000", *PLAN[5:], "--chunks", "1000000000", "--no-progress"]) == 2
    _one_line(capsys, "plan", "--chunks 1000000000 micro-batches on up to 4 stages: the simulation "
              "(4,000,000,000 micro-batch-stage pairs) needs about", "lower --chunks or --gpus")


# -- hardware --calibrate-cpu --out: one file, by the same rules -------------------------------------------


@pytest.fixture
def calibration(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``hardware --calibrate-cpu`` gets a catalog device at once; the list counts the calibrations."""
    from types import SimpleNamespace

    from sim.planning.hardware.catalog import DEVICES

    calls: list[int] = []

    def calibrate_cpu(threads: int = 1) -> SimpleNamespace:
        calls.append(threads)
        return SimpleNamespace(device=next(iter(DEVICES.values())), measurements=[])

    monkeypatch.setattr("sim.planning.costs.calibrate_device.calibrate_cpu", calibrate_cpu)
    return calls


def test_hardware_out_is_checked_before_calibrating_and_never_overwritten_unasked(
        tmp_path: Path, calibration: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    """It once overwrote a file, wrote through a link, and calibrated before an IsADirectoryError traceback."""
    mine = tmp_path / "mine.json"
    mine.write_text("my notes")
    link = tmp_path / "link.json"
    link.symlink_to(mine)
    cases = [(mine, (), f"--out {mine} exists; choose another name, or add --force to replace it"),
             (link, (), "is a symbolic link"), (link, ("--force",), "does not write through links"),
             (tmp_path, (), f"--out {tmp_path} is a folder; name a file such as {tmp_path / 'cpu.json'}"),
             (tmp_path / "no" / "cpu.json", (), f"folder {tmp_path / 'no'} does not exist"),
             (tmp_path / "dangling", (), "is a symbolic link")]
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out, extra, message in cases:
        assert main(["hardware", "--calibrate-cpu", "--json", "--out", str(out), *extra]) == 2
        _one_line(capsys, "hardware", message)
    assert main(["hardware", "--calibrate-cpu", "--json", "--out", ""]) == 2
    _one_line(capsys, "hardware", "--out '' names no file")
    assert calibration == [] and mine.read_text() == "my notes"  # refused before any work, nothing touched
    assert main(["hardware", "--calibrate-cpu", "--json", "--out", str(mine), "--force"]) == 0
    assert json.loads(mine.read_text()) == json.loads(capsys.readouterr().out) and link.is_symlink()
    new = tmp_path / "cpu.json"
    assert main(["hardware", "--calibrate-cpu", "--json", "--out", str(new)]) == 0
    assert json.loads(new.read_text())["name"] and calibration == [1, 1]
    assert main(["hardware", "--out", str(new)]) == 2
    _one_line(capsys, "hardware", "--out saves a calibration; add --calibrate-cpu")


def test_an_export_file_is_never_a_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine.csv"
    mine.write_text("my notes")
    (tmp_path / "link.csv").symlink_to(mine)
    assert main([*SIMULATE, "--export-schedule", str(tmp_path / "link.csv"), "--force",
                 "--out", str(tmp_path / "out")]) == 2
    _one_line(capsys, "simulate", "does not write through links")
    assert mine.read_text() == "my notes" and not (tmp_path / "out").exists()


# -- pipes, ranges and numbers ------------------------------------------------------------------------


def test_a_closed_pipe_ends_quietly(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpipe-sim hardware | head -1``: the reader has gone; no traceback, the status of a closed pipe."""
    read, write = os.pipe()
    os.close(read)
    stream = open(write, "w")  # noqa: SIM115 (closed below, after main has redirected it)
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        assert main(["hardware"]) == 141
    finally:
        stream.close()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("argv", "flag"), [
    (["demo", "--seed", str(2**64)], "--seed"),
    (["compare", "m:f", "--seed", str(-2**63 - 1)], "--seed"),
    (["demo", "--steps", str(2**63)], "--steps"),
    ([*SIMULATE, "--chunks", str(2**63)], "--chunks"),
    ([*SIMULATE, "--devices", str(2**63)], "--devices"),
    ([*SIMULATE, "--activation-bytes", str(2**64)], "--activation-bytes"),
    ([*PLAN, "--gpus", f"1,{2**64}"], "--gpus"),
    ([*PLAN, "--batch", str(2**63)], "--batch"),
])
def test_an_out_of_range_integer_names_its_flag(argv: list[str], flag: str, tmp_path: Path, no_experiment: None,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started")

    monkeypatch.setattr("sim.cli.simulate.schedule_kind", work)
    monkeypatch.setattr("sim.cli.plan.count_layers", work)
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    _one_line(capsys, argv[0], flag, "out of range")


@pytest.mark.parametrize(("argv", "flag"), [
    ([*SIMULATE, "--forward-time", "1e308"], "--forward-time"),
    ([*SIMULATE, "--latency", "1e308", "--bandwidth", "1"], "--latency"),
    ([*SIMULATE, "--activation-bytes", str(2**62), "--bandwidth", "1e-300"], "--bandwidth"),
    ([*PLAN, "--price", "nan"], "--price"),
    ([*PLAN, "--price", "inf"], "--price"),
    ([*PLAN, "--price", "1e308"], "--price"),
])
def test_non_finite_inputs_are_refused(argv: list[str], flag: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--json", "--out", str(tmp_path / "out")]) == 2
    _one_line(capsys, argv[0], flag)
    assert not (tmp_path / "out").exists()


def test_no_json_output_holds_infinity_or_nan(tmp_path: Path, fake_experiment: list[Outcome],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A measured peak of 0 bytes against a predicted one: the relative error has no finite value."""
    fake_experiment[0] = _outcome(measured_peak=False)
    assert fake_experiment[0].comparison.devices[0].peak_bytes_error == float("inf")
    assert main(["demo", "--json", "--no-progress", "--out", str(tmp_path / "demo")]) == 0
    printed = _strict_json(capsys.readouterr().out)
    written = _strict_json((tmp_path / "demo" / "report.json").read_text())
    assert printed["comparison"]["devices"][0]["peak_bytes_error"] is None
    assert written["comparison"]["devices"][0]["peak_bytes_error"] is None


def test_the_json_writer_refuses_what_json_cannot_hold() -> None:
    from sim.files import json_text

    assert json_text({"a": [1.5, None]}) == '{"a": [1.5, null]}'
    with pytest.raises(ValueError, match=r"rows\[1\]\.cost is nan"):
        json_text({"rows": [{"cost": 1.0}, {"cost": float("nan")}]})
    with pytest.raises(ValueError, match="makespan is inf"):
        json_text({"makespan": float("inf")})


def test_compare_refuses_a_run_too_large_for_this_machine_before_any_work(
        tmp_path: Path, no_experiment: None, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wide.py").write_text("import torch\nfrom torch import nn\n\n\ndef build():\n    return "
                                      "nn.Sequential(*[nn.Identity() for _ in range(64)]), torch.zeros(4096, 1)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gpipe.schedule.size.available_bytes", lambda: 64 * 2**20)
    assert main(["compare", "wide:build", "--chunks", "4096", "--stages", "64", "--out", str(tmp_path / "out")]) == 2
    _one_line(capsys, "compare", "--chunks 4096 on 64 stages: the simulation (262,144 micro-batch-stage pairs)",
              "lower --chunks or --stages")
