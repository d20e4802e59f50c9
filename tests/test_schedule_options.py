"""Schedule options (Note [schedule options] in gpipe.schedule.registry): ``NAME:key=value`` binds a declared keyword
of the generator, names the kind and its schedules in one canonical spelling, and bad options name those it takes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from gpipe.schedule import (
    SCHEDULES,
    Checkpoint,
    Schedule,
    gpipe,
    interleaved_one_f_one_b,
    looped,
    register,
    schedule_kind,
    unregister,
)
from sim.cli import main
from sim.planning.counting.flops import count_layers
from sim.planning.hardware.catalog import get_device, get_link
from sim.planning.plan import PlanRequest, plan

ROUND = "schedule 'interleaved-1f1b' takes the option round=N \\(N a positive integer; e.g. interleaved-1f1b:round=4\\)"


def test_a_name_with_an_option_binds_the_generators_keyword() -> None:
    kind = schedule_kind("interleaved-1f1b:round=4")
    assert kind.name == "interleaved-1f1b:round=4" and kind.values == (("round", 4),)
    assert kind.options == (("round", "round_size"),) == SCHEDULES["interleaved-1f1b"].options
    assert kind.place is looped and kind.description == SCHEDULES["interleaved-1f1b"].description
    schedule = kind(8, 8, devices=2)
    assert schedule.tasks == interleaved_one_f_one_b(8, 8, placement=looped(8, 2), round_size=4).tasks
    assert schedule.name == "interleaved-1f1b:round=4" and schedule.placement == looped(8, 2)
    assert kind(8, 8, "always", devices=2).checkpoint == "always"
    assert list(SCHEDULES) == [k for k in SCHEDULES if ":" not in k]  # SCHEDULES keeps the bare names


def test_the_bare_name_runs_the_default_and_is_unchanged() -> None:
    assert schedule_kind("interleaved-1f1b") is SCHEDULES["interleaved-1f1b"]
    assert SCHEDULES["interleaved-1f1b"].values == () and SCHEDULES["zb-h1"].options == ()
    default = schedule_kind("interleaved-1f1b")(8, 8, devices=4)
    assert default.name == "interleaved-1f1b"
    assert schedule_kind("interleaved-1f1b:round=4")(8, 8, devices=4).tasks == default.tasks  # round p: the default


def test_the_name_is_spelt_canonically() -> None:
    assert schedule_kind("interleaved-1f1b: round = 08 ").name == "interleaved-1f1b:round=8"


@pytest.mark.parametrize(("name", "problem"), [
    ("interleaved-1f1b:rounds=4", "unknown option 'rounds'"),
    ("interleaved-1f1b:round=0", "round=0 is not a positive integer"),
    ("interleaved-1f1b:round=-2", "round=-2 is not a positive integer"),
    ("interleaved-1f1b:round=1.5", "round=1.5 is not a positive integer"),
    ("interleaved-1f1b:round=four", "round=four is not a positive integer"),
    ("interleaved-1f1b:round=4,round=8", "option 'round' given twice"),
    ("interleaved-1f1b:round", "'round' is not key=value"),
    ("interleaved-1f1b:", "'' is not key=value"),
])
def test_a_bad_option_names_the_options_the_schedule_takes(name: str, problem: str) -> None:
    with pytest.raises(ValueError, match=f"^{ROUND}: {problem} in {name}$"):
        schedule_kind(name)


def test_a_schedule_without_options_says_so_and_an_unknown_one_lists_the_registered() -> None:
    with pytest.raises(ValueError, match="^schedule 'zb-h1' takes no options; use its name alone, 'zb-h1'$"):
        schedule_kind("zb-h1:round=4")
    with pytest.raises(ValueError, match="^unknown schedule 'zigzag'; registered: gpipe, 1f1b, "):
        schedule_kind("zigzag:round=4")
    with pytest.raises(ValueError, match="has its options already"):
        schedule_kind("interleaved-1f1b:round=4").with_options("round=8")
    with pytest.raises(ValueError, match="unregister takes a registered name, without options: 'interleaved-1f1b'"):
        unregister("interleaved-1f1b:round=4")
    assert "interleaved-1f1b" in SCHEDULES


def _striped(m: int, n: int, checkpoint: Checkpoint = "never", placement: None = None, *, width: int = 1,
             shift: int = 0) -> Schedule:
    """GPipe's schedule, named after its two knobs, for the registration tests."""
    return dataclasses.replace(gpipe(m, n, checkpoint), name=f"striped {width} {shift}")


@pytest.fixture
def striped() -> Iterator[str]:
    register("striped", "GPipe with two knobs", options={"width": "width", "shift": "shift"})(_striped)
    try:
        yield "striped"
    finally:
        unregister("striped")


def test_options_go_in_their_declared_order(striped: str) -> None:
    kind = schedule_kind("striped:shift=3,width=2")
    assert kind.name == "striped:width=2,shift=3" and kind.values == (("width", 2), ("shift", 3))
    assert kind(2, 2).name == "striped:width=2,shift=3"  # the kind names its schedules
    assert kind.generator(2, 2).name == "striped 2 3"  # the generator got both keywords
    assert schedule_kind("striped:shift=3").generator(2, 2).name == "striped 1 3"
    with pytest.raises(ValueError, match=r"^schedule 'striped' takes the options width=N, shift=N \(N a positive "
                                         r"integer; e.g. striped:width=4,shift=4\): unknown option 'depth'"):
        schedule_kind("striped:depth=1")


@pytest.mark.parametrize(("options", "message"), [
    ({"Width": "width"}, "an option's key is a lower-case word"),
    ({"width": "breadth"}, "option 'width' sets the parameter 'breadth', which _striped lacks or has without a "
                           "default"),
    ({"m": "m"}, "option 'm' sets the parameter 'm', which _striped lacks or has without a default"),
])
def test_register_refuses_an_option_without_a_keyword_with_a_default(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        register("striped", "GPipe with two knobs", options=options)(_striped)
    assert "striped" not in SCHEDULES


def test_simulate_takes_a_name_with_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``gpipe-sim simulate --schedule interleaved-1f1b:round=8``: 8 stages on 4 devices, m=8 in one round (N = m,
    breadth-first), still (m·v + p − 1)(t_f + t_b) = 57 with free copies; a bad option is one line, exit 2."""
    argv = ["simulate", "--stages", "8", "--devices", "4", "--chunks", "8", "--checkpoint", "never",
            "--forward-time", "1", "--backward-time", "2", "--out", str(tmp_path)]
    assert main([*argv, "--schedule", "interleaved-1f1b:round=8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schedule"] == "interleaved-1f1b:round=8" and doc["makespan"] == 57.0
    assert main([*argv, "--schedule", "interleaved-1f1b:round=x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gpipe-sim simulate: error: schedule 'interleaved-1f1b' takes the option round=N (N a positive integer; e.g. "
        "interleaved-1f1b:round=4): round=x is not a positive integer in interleaved-1f1b:round=x")


def test_the_planner_takes_a_name_with_options() -> None:
    """A plan's rows carry the name as given (canonical), and a bigger round hides the copies' time better."""
    torch.manual_seed(0)
    profile = count_layers(nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)]), torch.randn(2, 64))
    result = plan(PlanRequest(profile=profile, batch=64, device=get_device("a100-40gb"), gpus=[4],
                              link=get_link("pcie4-x16"), training="fp32-adam", chunks=[8], checkpoints=["never"],
                              schedules=["interleaved-1f1b", "interleaved-1f1b:round=8"], stages=[4]))
    rows = {(r.schedule, r.virtual): r for r in result.rows}
    assert set(rows) == {(name, v) for name in ("interleaved-1f1b", "interleaved-1f1b:round=8") for v in (1, 2)}
    assert rows[("interleaved-1f1b:round=8", 2)].step_seconds < rows[("interleaved-1f1b", 2)].step_seconds


@pytest.mark.parametrize("command", [["demo"], ["plan", "--model", "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64",
                                                "--batch", "2", "--gpus", "2", "--hardware", "a100-80gb"]])
def test_the_commands_take_options_and_name_what_a_schedule_takes(command: list[str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    try:  # argparse's choices exit; a command's own check returns 2
        status = main([*command, "--schedule", "interleaved-1f1b:rounds=2", "--out", str(tmp_path / "out")])
    except SystemExit as stop:
        status = stop.code  # type: ignore[assignment]
    assert status == 2 and not (tmp_path / "out").exists()
    assert "interleaved-1f1b" in capsys.readouterr().err
    if command[0] == "plan":
        assert main([*command, "--schedule", "interleaved-1f1b:round=2", "--out", str(tmp_path / "ok"), "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert {r["schedule"] for r in rows} == {"interleaved-1f1b:round=2"}
