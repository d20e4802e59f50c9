"""``gpipe-sim demo`` and ``gpipe-sim compare``: options, one-line errors, the report and the files.

Everything here runs without the executor: bad input is rejected before anything runs, and the
report is written from a synthetic outcome. The end-to-end runs are in ``tests/integration``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpipe.profiling.profile import RecordedSeconds
from gpipe.schedule import SCHEDULES, gpipe, looped, one_f_one_b, register, unregister
from sim.calibration.compare import compare
from sim.calibration.experiment import Setup, progress_labels
from sim.calibration.host import Overheads, executor_costs, with_overheads
from sim.calibration.outcome import Outcome, halves, interleaved_cost, write_outputs
from sim.cli import build_parser, main
from sim.cli.demo import print_outcome
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import simulate

MODELS = '''
import torch
from torch import nn

def good():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(8, 4)

def not_a_pair():
    return nn.Sequential(nn.Linear(4, 2))

def not_sequential():
    return nn.Linear(4, 2), torch.randn(8, 4)

def bad_batch():
    return nn.Sequential(nn.Linear(4, 2)), [1, 2, 3]

def scalar_batch():
    return nn.Sequential(nn.Linear(4, 2)), torch.tensor(1.0)

not_callable = 3
'''


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "usermodels.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_both_commands_are_registered_with_their_options() -> None:
    parser = build_parser()
    args = parser.parse_args(["demo"])
    assert (args.chunks, args.checkpoint, args.steps, args.out, args.json, args.seed) == (4, "except_last", 15,
                                                                                         None, False, 0)
    assert args.out_default == "demo"  # left out, --out is a fresh folder named after it (sim.files)
    assert args.schedule == "gpipe" and parser.parse_args(["demo", "--schedule", "1f1b"]).schedule == "1f1b"
    args = parser.parse_args(["compare", "m:f", "--balance", "1,2", "--devices", "cpu,cpu", "--chunks", "8",
                              "--checkpoint", "always", "--steps", "2", "--out", "x", "--json"])
    assert (args.target, args.balance, args.devices, args.chunks, args.checkpoint, args.steps, args.out, args.json) \
        == ("m:f", "1,2", "cpu,cpu", 8, "always", 2, "x", True)


@pytest.mark.parametrize(("argv", "message"), [
    (["compare", "usermodels"], "expected MODULE:FUNCTION"),
    (["compare", "nosuchmodule:build"], "no module named 'nosuchmodule'"),
    (["compare", "usermodels:missing"], "module 'usermodels' has no function 'missing'"),
    (["compare", "usermodels:not_callable"], "is a int, not a function"),
    (["compare", "usermodels:not_a_pair"], "must return (nn.Sequential, sample mini-batch), got Sequential"),
    (["compare", "usermodels:not_sequential"], "must return an nn.Sequential first, got Linear"),
    (["compare", "usermodels:bad_batch"], "as the mini-batch, got a tuple of 3"),
    (["compare", "usermodels:scalar_batch"], "needs a batch dimension"),
    (["compare", "nofile.py:build"], "no Python file 'nofile.py'"),
    (["compare", "usermodels:good", "--balance", "1,x"], "--balance takes comma-separated positive integers"),
    (["compare", "usermodels:good", "--balance", "0,3"], "--balance takes comma-separated positive integers"),
    (["compare", "usermodels:good", "--balance", "1,1"], "sums to 2, but the model has 3 layers"),
    (["compare", "usermodels:good", "--balance", "1,2", "--devices", "cpu"], "as many devices as stages (2, not 1)"),
    (["compare", "usermodels:good", "--balance", "1,2", "--devices", "cpu,cpu,cpu"], "at most one device"),
    (["compare", "usermodels:good", "--balance", "1,2", "--stages", "3"], "--stages is 3: give one of them"),
    (["demo", "--stages", "4", "--devices", "2"], "as many devices as stages (4, not 2)"),
    (["demo", "--stages", "21"], "--stages 21 is more than the 20 layers"),
    (["demo", "--devices", "0"], "--devices must be >= 1"),
    (["compare", "usermodels:good", "--devices", "tpu,cpu"], "'tpu'"),
    (["compare", "usermodels:good", "--devices", "cpu,cpu,cpu,cpu"], "4 partitions for a model of 3 layers"),
    (["compare", "usermodels:good", "--chunks", "0"], "--chunks must be >= 1"),
    (["demo", "--steps", "0"], "--steps 0 is out of range: it takes integers from 1 to 1000"),
    (["demo", "--chunks", "65"], "--chunks 65 is more than the 64 samples"),
    (["compare", "usermodels:good", "--chunks", "9"], "--chunks 9 is more than the 8 samples"),
])
def test_bad_input_is_one_line_and_exit_2(models: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                          message: str) -> None:
    assert main([*argv, "--out", str(models / "out"), "--no-progress"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"gpipe-sim {argv[0]}: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (models / "out").exists()  # nothing ran


@pytest.mark.parametrize("argv", [["demo"], ["compare", "usermodels:good"]])
def test_an_unknown_schedule_is_refused_with_the_registered_ones(models: Path, capsys: pytest.CaptureFixture[str],
                                                                 argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--schedule", "zigzag", "--out", str(models / "out"), "--no-progress"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (f"gpipe-sim {argv[0]}: error: argument --schedule: invalid choice: 'zigzag' (choose from "
                     + ", ".join(repr(name) for name in SCHEDULES) + ")")
    assert not (models / "out").exists()


def test_a_file_path_target_loads(models: Path) -> None:
    from sim.cli.compare import load

    model, batch = load(str(models / "usermodels.py") + ":good")
    assert len(model) == 3 and batch.shape == (8, 4)


def test_progress_labels_count_every_unit() -> None:
    labels = list(progress_labels(Setup(steps=3, warmup_steps=1)))
    assert labels == ["balance", "calibrate", "overheads", "warm-up step 1", "step 1", "step 2", "step 3",
                      "simulate", "compare"]
    assert progress_labels(Setup(balance=(1, 2), steps=1, warmup_steps=0))[0] == "calibrate"


def test_setup_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="chunks"):
        Setup(chunks=0)
    with pytest.raises(ValueError, match="checkpoint"):
        Setup(checkpoint="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="3 devices for 2 partitions: give at most one device per partition"):
        Setup(balance=(1, 2), devices=("cpu",) * 3)
    with pytest.raises(ValueError, match="runs one stage per device: give as many devices as stages"):
        Setup(balance=(1, 2), devices=("cpu",))
    with pytest.raises(ValueError, match="balance has 2 partitions but stages=3"):
        Setup(balance=(1, 2), stages=3)
    with pytest.raises(ValueError, match="stages must be an integer >= 1"):
        Setup(stages=0)
    with pytest.raises(ValueError, match="devices is empty"):
        Setup(devices=())
    with pytest.raises(ValueError, match="pass_repeats"):
        Setup(pass_repeats=0)
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'; registered: gpipe, 1f1b"):
        Setup(schedule="zigzag")


def test_setup_of_a_given_schedule_is_checked_as_the_executor_checks_it() -> None:
    """Note [devices and stages]: a given schedule's stages are the partitions (gpipe.frontend.given_schedule's rule
    and message); chunks and checkpoint, which have defaults here, must be its m and policy."""
    with pytest.raises(ValueError, match="schedule '1f1b' has 4 stages, but the balance makes 2 partitions"):
        Setup(schedule=one_f_one_b(4, 4), balance=(1, 1))
    with pytest.raises(ValueError, match=r"^chunks=4, checkpoint='except_last', but schedule '1f1b' runs m=8 "
                                         r"micro-batches with checkpoint='never': give chunks=8, checkpoint='never'$"):
        Setup(schedule=one_f_one_b(8, 2, "never"))
    setup = Setup(schedule=one_f_one_b(8, 2, "never"), chunks=8, checkpoint="never", devices=("cpu",) * 2)
    assert (setup.partitions, setup.placement()) == (2, (0, 1))


def test_setup_places_stages_on_fewer_devices_by_the_schedules_layout() -> None:
    """Note [devices and stages]: the partitions are the balance's, else ``stages``, else one per device; fewer
    devices than partitions only for a schedule that places several stages on one device."""
    assert (Setup().partitions, Setup().placement()) == (2, (0, 1))
    assert Setup(devices=("cpu",) * 3).placement() == (0, 1, 2)
    assert Setup(stages=3).placement() == (0, 1, 2)
    register("looped-setup-test", "GPipe's fill-drain, looped", layout=looped)(gpipe)
    try:
        setup = Setup(schedule="looped-setup-test", stages=6, devices=("cpu",) * 2)
        assert (setup.partitions, setup.placement()) == (6, (0, 1, 0, 1, 0, 1))
        assert Setup(schedule="looped-setup-test", balance=(1,) * 4, devices=("cpu",) * 3).placement() == (0, 1, 2, 0)
        assert Setup(schedule="looped-setup-test", stages=4).placement() == (0, 1, 2, 3)  # a device per stage
    finally:
        unregister("looped-setup-test")


def test_a_pass_times_about_as_many_runs_as_a_step_has_micro_batches() -> None:
    """Note [pass repeats]: chunks // 2 timed runs a pass, at least one, unless asked otherwise."""
    assert [Setup(chunks=c).repeats_per_pass for c in (1, 2, 3, 8, 16)] == [1, 1, 1, 4, 8]
    assert Setup(chunks=16, pass_repeats=2).repeats_per_pass == 2


def _outcome() -> Outcome:
    schedule = gpipe(4, 2, "except_last")
    cost = with_overheads(CostModel.uniform(2, 1e-3, 2e-3, saved_bytes=1000, checkpoint_bytes=100),
        Overheads(task=1e-5, handoff=2e-5, contention=0.1))
    predicted = simulate(schedule, cost)
    measured = predicted.shifted(5.0)
    return Outcome(Setup(balance=(1, 2), devices=("cpu", "cpu"), steps=3), schedule, cost, SimConfig(), predicted,
                   measured, (0.2, 0.1, 0.3), 1, compare(predicted, measured), {"simulate": 0.01}, "a test model")


def test_report_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = _outcome()
    files = write_outputs(outcome, tmp_path / "out")
    assert set(files) == {"plot", "trace", "report"}
    assert Path(files["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads(Path(files["trace"]).read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert {"predicted: device 0", "measured: device 1"} <= names
    report = json.loads(Path(files["report"]).read_text())
    assert report["predicted_makespan"] == pytest.approx(report["measured_makespan"]) and report["m"] == 4
    assert report["makespan_error"] == pytest.approx(0.0, abs=1e-9) and report["order_agreement"] == 1.0
    assert report["balance"] == [1, 2] and report["chosen_step"] == 1
    assert report["comparison"]["devices"][0]["predicted_peak_bytes"] == report["comparison"]["devices"][0][
        "measured_peak_bytes"]
    assert {o["op"] for o in report["comparison"]["ops"]} == {"F", "R", "B"}
    assert report["cost_model"]["overheads"]["handoff"] == 2e-5
    print_outcome(outcome, files, verbose=True)
    text = capsys.readouterr().out
    assert "makespan (ms)" in text and "a test model" in text and "step 2 of 3" in text
    assert "hand-off 20.0 us" in text

    # steps of 0.2, 0.1, 0.3 s: the last half (0.3) against the first (0.2), over the median (0.2)
    assert report["drift"] == pytest.approx(0.5)
    assert "changed speed by +50%" in text
    print_outcome(dataclasses.replace(outcome, step_makespans=(0.2, 0.2, 0.2)), files)
    assert "changed speed" not in capsys.readouterr().out


def test_halves_is_a_sample_against_itself() -> None:
    """Note [drift]: the median of the last half against that of the first, over the median of all."""
    assert halves((10.0,) * 6) == 0.0
    assert halves((10.0, 10.0, 10.0, 12.0, 12.0, 12.0)) == pytest.approx(2.0 / 11.0)
    assert halves((12.0, 12.0, 10.0, 10.0)) == pytest.approx(-2.0 / 11.0)
    assert halves((10.0, 99.0, 10.0)) == 0.0  # an odd middle step belongs to neither half
    assert halves((10.0,)) == 0.0 and halves(()) == 0.0 and halves((0.0, 0.0)) == 0.0


def test_stage_seconds_are_the_medians_of_the_passes() -> None:
    """Note [median pass]: a pass that a slow stretch of the machine made slow moves no stage's seconds, as the
    median step leaves such a step out; the plain seconds stay those of the first calibration."""
    cost = CostModel.uniform(2, 1.0, 2.0)
    runs = [RecordedSeconds(1.0, 2.0, 0.5), RecordedSeconds(1.5, 2.5, 0.75), RecordedSeconds(40.0, 50.0, 20.0)]
    medians = interleaved_cost(cost, [[r, r] for r in runs], [])
    stages, extras = medians.stages, executor_costs(medians).stages
    assert [(e.forward_recorded, e.backward_recorded, s.forward_checkpointed)
            for s, e in zip(stages, extras, strict=True)] == [(1.5, 2.5, 0.75)] * 2
    assert [(s.forward, s.backward) for s in stages] == [(1.0, 2.0)] * 2


#: What ``--verbose`` adds: the calibrated internals.
INTERNALS = ("calibrated overheads: launch", "hand-off 20.0 us", "each stage's worker threads",
             "contention of pairs running together", "B@0|F@1 1.30x")


def test_the_default_output_is_short_and_verbose_adds_the_internals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21: by default the configuration, one line on calibration, the table and the files, in at most 25
    lines, even with both notes (drift, a busy machine); ``--verbose`` prints the internals as well."""
    outcome = _outcome()
    overheads = dataclasses.replace(executor_costs(outcome.cost).overheads,
                                    pairs=(("B", 0, "F", 1, 0.3), ("F", 1, "B", 0, 0.2)))
    outcome = dataclasses.replace(outcome, cost=with_overheads(outcome.cost, overheads), background_cores=1.5)
    monkeypatch.setattr("sim.cli.demo.run", lambda *args, **kwargs: outcome)
    monkeypatch.chdir(tmp_path)

    assert main(["demo", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 25, "\n".join(lines)
    text = "\n".join(lines)
    assert outcome.comparison.table() in text
    assert lines[-1] == "wrote demo/timeline.png, demo/trace.json, demo/report.json"
    assert [line for line in lines if line.startswith("calibration: ")] == [lines[3]]
    assert "changed speed by +50%" in text and "1.5 cores busy" in text
    assert not [needle for needle in INTERNALS if needle in text]

    assert main(["demo", "--no-progress", "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert [needle for needle in INTERNALS if needle not in verbose] == []
    assert outcome.comparison.table() in verbose and "wrote demo-2/timeline.png" in verbose
    assert set(lines[:3] + lines[4:-1]) <= set(verbose.splitlines())  # the rest as by default


def test_the_demo_says_how_many_layers_its_model_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """It once said "19-layer" of its 20 layers; the description is now read off the model it builds."""
    from sim.calibration.experiment import demo_model

    seen: list[str] = []

    def run(*args: object, description: str = "", **kwargs: object) -> Outcome:
        seen.append(description)
        return _outcome()

    monkeypatch.setattr("sim.cli.demo.run", run)
    assert main(["demo", "--no-progress", "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    model, batch = demo_model()
    assert seen == [f"demo: {len(model)}-layer convolutional classifier, batch 64 of 3x32x32"] and len(model) == 20
