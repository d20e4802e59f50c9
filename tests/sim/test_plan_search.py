"""The planner offers a searched schedule (Note [search in a plan] in sim.planning.search_plan): the best
configurations searched for their own stage costs, run through the sweep like a named schedule, and what each
gained reported."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpipe.schedule import SCHEDULES
from sim.cli.plan import load_model
from sim.planning.counting.flops import count_layers
from sim.planning.parallel.configurations import Configuration, make_schedule
from sim.planning.plan import PlanRequest, plan

_, MODEL, SAMPLE = load_model("gpt:layers=6,hidden=256,heads=4,seq=128,vocab=50000")
PROFILE = count_layers(MODEL, SAMPLE)
ARGS = dict(training="fp32-adam", stages=[4])
# the schedules the search can stand in for: one copy of the stages (not DualPipe's two; search_plan._why_not)
ONE_COPY = [s for s, kind in SCHEDULES.items() if kind.copies == 1]


def test_the_best_configurations_are_searched_and_their_gain_reported() -> None:
    result = plan(PlanRequest(profile=PROFILE, batch=32, device="a100-80gb", gpus=[4], link="pcie4-x16",
                              checkpoints=["never"], search=3, schedules=ONE_COPY, **ARGS), workers=1)
    assert len(result.searches) == 3
    named = {(r.chunks, r.virtual, r.schedule): r for r in result.rows}
    for gain in result.searches:
        c = gain.configuration
        row = named[(c["chunks"], c["virtual"], gain.named)]
        assert gain.named_step == row.step_seconds and gain.method
        assert gain.searched_step is not None and gain.gain == pytest.approx(gain.named_step / gain.searched_step - 1)
    for row in (r for r in result.rows if r.schedule == "searched"):  # only where the search beat the named row
        beaten = [g for g in result.searches if g.configuration["chunks"] == row.chunks
                  and g.configuration["virtual"] == row.virtual]
        assert beaten and row.step_seconds < beaten[0].named_step and row.fits
    doc = json.loads(json.dumps(result.to_dict()))
    assert [g["gain"] for g in doc["searches"]] == [g.gain for g in result.searches]


def test_a_searched_schedule_runs_through_the_sweep_as_a_named_one_does() -> None:
    """The same tasks given as a schedule object give the named row's numbers, under another name."""
    from sim.planning.sweep import Sweep

    sweep = Sweep(PlanRequest(profile=PROFILE, batch=32, device="a100-80gb", gpus=[4], link="pcie4-x16",
                              training="fp32-adam"))
    p = Configuration(4, 4, 1, 8, "never", "zb-h1")
    named = sweep.evaluate(p)
    given = sweep.evaluate(replace(p, schedule="searched"), given=make_schedule(p))
    assert named is not None and given is not None and given.schedule == "searched"
    assert given.step_seconds == named.step_seconds and given.memory_bytes == named.memory_bytes


def test_recomputing_configurations_are_not_searched_and_bad_counts_refused() -> None:
    result = plan(PlanRequest(profile=PROFILE, batch=32, device="a100-80gb", gpus=[4], link="pcie4-x16",
                              checkpoints=["always"], schedules=["1f1b"], search=1, **ARGS), workers=1)
    assert result.searches[0].searched_step is None
    assert "checkpoint always recomputes whole stages" in result.searches[0].method
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="number of configurations to search, an integer >= 0"):
            PlanRequest(profile=PROFILE, batch=32, device="a100-80gb", gpus=[4], link="pcie4-x16", search=bad,
                        **ARGS)  # type: ignore[arg-type]
    assert plan(PlanRequest(profile=PROFILE, batch=32, device="a100-80gb", gpus=[4], link="pcie4-x16",
                            checkpoints=["never"], schedules=["1f1b"], **ARGS), workers=1).searches == ()


def test_the_command_prints_what_the_search_gained(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from sim.cli import main

    args = ["plan", "--model", "gpt:layers=6,hidden=256,heads=4,seq=128,vocab=50000", "--batch", "32", "--gpus", "4",
            "--hardware", "a100-80gb", "--link", "pcie4-x16", "--training", "fp32-adam", "--checkpoint", "never",
            "--stages", "4", "--search", "1", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("search, "))
    assert "4 stages x 1 replicas" in line and "s/step" in line
    assert main([*args, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["searches"]) == 1
