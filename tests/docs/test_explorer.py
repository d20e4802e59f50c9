"""The explorer's packs (docs/explorer.py) hold the simulator's runs exactly, its refusals are the generators', its
searched schedules are valid and no slower than a named one in the same memory, its closed forms equal the
simulation wherever none of their assumptions is broken, and the lecture path's answers are its data's."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpipe.schedule import SCHEDULES, Schedule, parse_tasks
from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

ROOT = Path(__file__).resolve().parents[2]


def _sums(deltas: list[int]) -> list[int]:
    return list(itertools.accumulate(deltas))


def unpack(path: Path) -> dict:
    """A pack file as the page reads it: the base64 string, gunzipped, parsed."""
    text = path.read_text()
    return json.loads(gzip.decompress(base64.b64decode(text[text.index(' = "') + 4:text.rindex('"')])))


def _grid(monkeypatch: pytest.MonkeyPatch, **axes: tuple[Any, ...]) -> ModuleType:
    """The explorer module with some axes of its grid narrowed (SHAPE's or TIMES')."""
    ex = _load("explorer")
    for name, values in axes.items():
        monkeypatch.setitem(ex.SHAPE if name in ex.SHAPE else ex.TIMES, name, values)
    return ex


EQUAL = {"backward": 2.0, "weight": 0.5, "copy": 0.0, "ends": 1.0}  # a middle stage's F, B and W all 1 (v = 1)
NAMED_WITH_FORMS = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v")


@pytest.mark.parametrize(("m", "p"), [(1, 2), (8, 4), (16, 8)])
def test_gpipe_runs_are_its_closed_forms(m: int, p: int) -> None:
    ex = _load("explorer")
    schedule = ex.shape("gpipe", p, 1, m, "never")
    run = ex._encode(ex.run(schedule, 1, **EQUAL), [[]] * p)
    assert run["t"] == (m + p - 1) * 3 * ex.TICKS and run["b"] == round((p - 1) / (m + p - 1), 4)
    assert run["k"] == [m * ex.SAVED] * p and run["c"] == [[]] * p
    for d in range(p):  # device d's first forward starts after d forwards; each task lasts its cost
        ticks = _sums(run["s"][d])
        assert ticks[0] == d * ex.TICKS and len(ticks) == 4 * m
        assert [b - a for a, b in zip(ticks[::2], ticks[1::2], strict=True)] == [ex.TICKS] * m + [2 * ex.TICKS] * m


def test_a_pack_holds_the_simulators_timelines_and_the_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _grid(monkeypatch, p=(2, 3), v=(1, 2), m=(3,), checkpoint=("except_last",))
    pack = ex.pack("zb-h1")
    assert pack["shapes"]["2|2|3|except_last"] == ex.shape("zb-h1", 2, 2, 3, "except_last")
    assert "runs one stage per device" in pack["shapes"]["2|2|3|except_last"]  # the layout's own message
    assert len(pack["runs"]) == 2 * 27  # two shapes taken, 3 backward x 3 W shares x 3 copy times, ends 1 only
    shape = pack["shapes"]["3|1|3|except_last"]
    assert shape["split"] and shape["stages"] == 3 and len(shape["orders"]) == 1
    order = shape["orders"][0]
    tl = ex.run(ex.shape("zb-h1", 3, 1, 3, "except_last"), 1, backward=3.0, weight=0.25, copy=0.25, ends=1.0, comm=0.0)
    run = pack["runs"]["3|1|3|except_last|3.0|0.25|0.25|1.0|0.0"]
    for d in range(3):
        spans = [s for s in tl.spans if s.device == d and s.stream == "compute"]
        assert order["tasks"][d] == " ".join(str(s.task) for s in spans)
        assert _sums(run["s"][d]) == [round(t * ex.TICKS) for s in spans for t in (s.start, s.end)]
        copies = {str(s.task): (s.start, s.end) for s in tl.spans if s.device == d and s.stream == "copy"}
        assert sorted(order["copies"][d].split()) == sorted(copies) and len(copies) == 3 * (1 if d in (0, 2) else 2)
        assert _sums(run["c"][d]) == [round(t * ex.TICKS) for c in order["copies"][d].split() for t in copies[c]]
        assert list(zip(_sums(run["y"][d][0]), run["y"][d][1], strict=True)) == [(round(t * ex.TICKS), x)
                                                                                       for t, x in tl.memory_series(d)]
    assert run["t"] == round(tl.makespan * ex.TICKS) and run["b"] == round(tl.bubble_fraction(), 4)


def test_the_end_stages_cost_their_factor_and_run_where_the_grid_says(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _grid(monkeypatch, p=(4,), v=(1,), m=(4,), checkpoint=("never", "always"), copy=(0.0,))
    heavy = ex.stage_times(4, 1, True, backward=2.0, weight=0.5, ends=2.0)
    assert heavy == [(2, 2, 2), (1, 1, 1), (1, 1, 1), (2, 2, 2)]
    assert ex.stage_times(2, 2, False, backward=3.0, weight=0.5, ends=1.5) == [(0.75, 2.25, 0.0)] * 2
    tl = ex.run(ex.shape("1f1b", 4, 1, 4, "never"), 1, **{**EQUAL, "ends": 1.5})
    assert {(s.task.stage, s.task.op.value): s.end - s.start for s in tl.spans if s.stream == "compute"} == {
        (j, op): (1.5 if j in (0, 3) else 1.0) * (1 if op == "F" else 2) for j in range(4) for op in "FB"}
    keys = set(ex.pack("1f1b")["runs"])
    grid = itertools.product(("never", "always"), ("1.0", "2.0", "3.0"), ("1.0", "1.5", "2.0"))
    assert keys == {f"4|1|4|{c}|{b}|-|0.0|{e}|0.0" for c, b, e in grid if e == "1.0" or (c == "never" and b == "2.0")} \
        | {f"4|1|4|never|2.0|-|0.0|1.0|{x}" for x in ("0.5", "1.0")}  # communication at one slice (Note [grid])


def test_settings_outside_a_schedule_or_the_grid_say_why() -> None:
    ex = _load("explorer")
    assert not isinstance(ex.shape("interleaved-1f1b", 4, 2, 6, "never"), str)  # any m: a last partial round
    assert "n = 2p" in ex.shape("zb-v", 4, 3, 8, "never")
    assert "m >= n = 8" in ex.shape("dualpipe-v", 4, 2, 4, "never")
    bound = ex.shape("looped-bfs", 8, 4, 2, "never")
    assert f"up to {ex.MAX_STAGES} stages" in bound and "--devices 8 --stages 32 --chunks 2" in bound
    assert "checkpoint never" in ex.shape("searched", 4, 1, 8, "always")
    assert "gpipe-sim search --devices 4 --stages 12" in ex.shape("searched", 4, 3, 8, "never")
    assert ex.shape("searched-v", 4, 1, 8, "never").startswith("searched on the placement of zb-v: a V places")
    assert ex.shape("searched", 4, 2, 8, "never") == ex.shape("interleaved-1f1b", 4, 2, 8, "never")
    with pytest.raises(ValueError, match="whole number of 1/480 forwards"):
        ex._whole([[0.5, 1.0 / 7]])


def test_searched_runs_are_valid_and_no_slower_than_a_named_schedule_in_their_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each searched order is a valid schedule on its placement, holds no more than the limit, ends no earlier than
    the search's lower bound, and with free copies (the search's timing is then the simulator's) ends no later than
    any named schedule of its placement whose peak fits the limit; with copies, so in the search's own timing."""
    ex = _grid(monkeypatch, p=(2, 4), v=(1, 2), m=(3, 8), checkpoint=("never",), backward=(2.0,), weight=(0.5,))
    family = {("searched", 1): ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2"),
              ("searched", 2): ("interleaved-1f1b", "looped-bfs"), ("searched-v", 2): ("zb-v", "dualpipe-v")}
    packs = {name: ex.pack(name) for name in ex.NAMES}
    compared = 0
    for name, at in itertools.product(ex.SEARCHED, itertools.product(*ex.SHAPE.values())):
        p, v, m, _ = at
        shape = packs[name]["shapes"]["|".join(map(str, at))]
        if isinstance(shape, str):
            assert (name, v) not in family
            continue
        reference = ex.shape(ex.SEARCHED[name], *at)
        for times in ex._settings(name, True, "never"):
            key = "|".join(map(str, (*at, *times.values())))
            run = packs[name]["runs"][key]
            order = shape["orders"][run.get("o", 0)]
            tasks = [parse_tasks(t) for t in order["tasks"]]
            Schedule(m, p * v, "never", reference.placement, tuple(tasks)).validate()
            assert max(run["k"]) <= shape["limit"] * ex.SAVED + 1e-9 and run["l"] <= run["t"]
            found, limit = ex.searched(reference, v, **times)
            assert limit == pytest.approx(shape["limit"])
            assert all(found.makespan <= t + 1e-9 for t in found.named.values() if isinstance(t, float))
            for named in family[(name, v)]:
                other = packs[named]["shapes"]["|".join(map(str, at))]
                if isinstance(other, str) or times["copy"] > 0:
                    continue
                theirs = packs[named]["runs"][key if other["split"] else key.replace("|0.5|", "|-|")]
                if max(theirs["k"]) <= shape["limit"] * ex.SAVED + 1e-9:
                    assert run["t"] <= theirs["t"], (key, named)
                    compared += 1
    assert compared >= 40


def test_closed_forms_equal_the_simulation_where_none_of_their_assumptions_is_broken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _grid(monkeypatch, p=(2, 3, 4), v=(1, 2), m=(1, 2, 3, 4, 6, 8), checkpoint=("never", "always"),
               backward=(2.0, 3.0), weight=(0.25, 0.5), copy=(0.0, 0.25), ends=(1.0, 2.0))
    exact: dict[str, int] = {}
    broken: set[str] = set()
    for name in NAMED_WITH_FORMS:
        for key, run in ex.pack(name)["runs"].items():
            f = run["f"]
            same = f["t"] == run["t"] and abs(f["b"] - run["b"]) <= 1e-4 and f["k"] == run["k"]
            assert set(run["x"]) <= set(ex.REASONS)
            if not run["x"]:
                assert same, (name, key, run["t"], run["b"], run["k"], f)
                exact[name] = exact.get(name, 0) + 1
            elif not same:
                broken.update(run["x"])
    assert set(exact) == set(NAMED_WITH_FORMS) and min(exact.values()) >= 4, exact
    assert broken == set(ex.REASONS)  # every assumption, broken, moves some number off its form
    assert "f" not in next(iter(ex.pack("dualpipe-v")["runs"].values()))


def test_a_new_cost_axis_is_one_more_entry_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [run keys]: a run's key grows by the new axis's value, and the index tells the page its place."""
    ex = _grid(monkeypatch, p=(2,), v=(1,), m=(2,), checkpoint=("never",), backward=(2.0,), copy=(0.0,), ends=(1.0,),
               comm=(0.0,))
    monkeypatch.setitem(ex.TIMES, "hop", (0.0,))
    monkeypatch.setitem(ex.LABELS, "hop", "a hop")
    assert set(ex.pack("gpipe")["runs"]) == {"2|1|2|never|2.0|-|0.0|1.0|0.0|0.0"}
    index = ex.index()
    assert index["costs"] == ["backward", "weight", "copy", "ends", "comm", "hop"] and index["axes"]["hop"] == ["0.0"]


def test_write_keeps_an_index_and_a_pack_per_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _grid(monkeypatch, p=(2,), v=(1, 2), m=(2,), checkpoint=("never",), backward=(2.0,), copy=(0.0,))
    paths = ex.write(tmp_path, "s1")
    assert [p.name for p in paths] == ["explorer-data.js"] + [f"explorer-{name}.js" for name in ex.NAMES]
    assert ex.NAMES == (*SCHEDULES, "searched", "searched-v")
    index = json.loads(paths[0].read_text().split(" = ", 1)[1].rstrip(";\n"))
    assert index["axes"]["v"] == ["1", "2"] and index["schedules"]["zb-v"]["layout"]
    assert index["shape"] == ["p", "v", "m", "checkpoint"]
    assert index["costs"] == ["backward", "weight", "copy", "ends", "comm"]
    assert set(index["labels"]) == set(index["start"]) == set(index["axes"])
    assert index["schedules"]["searched"]["searched"] and index["schedules"]["gpipe"]["form"]["makespan"]
    assert unpack(paths[1]) == ex.pack("gpipe")
    before = [p.stat().st_mtime_ns for p in paths]
    assert ex.write(tmp_path, "s1") == paths and [p.stat().st_mtime_ns for p in paths] == before  # same stamp


def _answers() -> str:
    """The collapsed answers of the lecture path's explorer exercises."""
    text = (ROOT / "docs" / "lecture-path.md").read_text(encoding="utf-8")
    return " ".join(text[text.index("## Exercises in the explorer"):].split())


def test_the_lecture_paths_answers_are_the_explorers_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = _answers()
    ex = _grid(monkeypatch, p=(4, 8), v=(1, 2), checkpoint=("never",), backward=(2.0,), weight=(0.25, 0.5), copy=(0.0,),
               comm=(0.0,))
    packs = {name: ex.pack(name) for name in ("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v")}
    ms = ex.SHAPE["m"]
    monkeypatch.setitem(ex.SHAPE, "p", (4,))  # the searched runs the answers read, the search costing most
    monkeypatch.setitem(ex.SHAPE, "m", (8,))
    packs.update({name: ex.pack(name) for name in ex.SEARCHED})

    def run(name: str, p: int, v: int, m: int, weight: str, ends: str = "1.0") -> dict[str, Any]:
        split = packs[name]["shapes"][f"{p}|{v}|{m}|never"]["split"]
        return packs[name]["runs"][f"{p}|{v}|{m}|never|2.0|{weight if split else '-'}|0.0|{ends}|0.0"]

    def t(name: str, p: int, v: int, m: int, weight: str, ends: str = "1.0") -> float:
        return run(name, p, v, m, weight, ends)["t"] / ex.TICKS

    # 1: interleaving (v = 2) against ZB-H1 at p = 8, a quarter of the backward in W
    ahead = [m for m in ms if t("interleaved-1f1b", 8, 2, m, "0.25") < t("zb-h1", 8, 1, m, "0.25")]
    first, behind = ahead[0], [m for m in ms if m > ahead[0] and m not in ahead]
    assert f"From `m = {first}` on" in answers and behind and f"at `m = {behind[0]}`" in answers
    for m in (first, behind[0]):
        assert f"{t('interleaved-1f1b', 8, 2, m, '0.25'):g} against {t('zb-h1', 8, 1, m, '0.25'):g}" in answers
    assert "range" in run("interleaved-1f1b", 8, 2, behind[0], "0.25")["x"] and max(ms) in ahead
    assert all(t("interleaved-1f1b", 8, 2, m, "0.5") >= t("zb-h1", 8, 1, m, "0.5") for m in ms)
    # 2: the end stages at twice a middle one's cost, p = 4, m = 8
    grow = {name: t(name, 4, 1, 8, "0.5", "2.0") / t(name, 4, 1, 8, "0.5") for name in ("1f1b", "zb-h1", "zb-h2")}
    assert grow["zb-h1"] == grow["zb-h2"] > grow["1f1b"] and t("zb-h1", 4, 1, 8, "0.5") == t("zb-h2", 4, 1, 8, "0.5")
    for name, v in (("1f1b", 1), ("zb-h1", 1), ("zb-v", 2)):
        assert f"{t(name, 4, v, 8, '0.5'):g} to {t(name, 4, v, 8, '0.5', '2.0'):g} ms" in answers
    found = run("searched", 4, 1, 8, "0.5", "2.0")
    assert found["t"] == found["l"] == t("zb-h1", 4, 1, 8, "0.5", "2.0") * ex.TICKS
    assert f"takes {found['t'] / ex.TICKS:g} ms and its lower bound {found['l'] / ex.TICKS:g}" in answers
    looped, interleaved = run("searched", 4, 2, 8, "0.5", "2.0"), t("interleaved-1f1b", 4, 2, 8, "0.5", "2.0")
    gain = round(100 * (1 - looped["t"] / ex.TICKS / interleaved))
    assert f"{looped['t'] / ex.TICKS:g} against {interleaved:g} ms ({gain}% faster; lower bound " \
           f"{looped['l'] / ex.TICKS:g})" in answers
    v_shaped = run("searched-v", 4, 2, 8, "0.5", "2.0")
    assert v_shaped["t"] == v_shaped["l"] == t("zb-v", 4, 2, 8, "0.5", "2.0") * ex.TICKS


def test_dualpipe_v_pulls_ahead_of_zb_v_only_when_tasks_communicate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The communication slider (Note [communication] in sim.core.cost): equal without it, DualPipe-V's pairs hide
    it, and the closed form names it as what it leaves out."""
    ex = _grid(monkeypatch, p=(4,), v=(2,), m=(8,), checkpoint=("never",))
    packs = {name: ex.pack(name)["runs"] for name in ("zb-v", "dualpipe-v")}
    key = "4|2|8|never|2.0|0.5|0.0|1.0|{}"
    assert packs["zb-v"][key.format("0.0")]["t"] == packs["dualpipe-v"][key.format("0.0")]["t"]
    for x in ("0.5", "1.0"):
        assert packs["dualpipe-v"][key.format(x)]["t"] < packs["zb-v"][key.format(x)]["t"]
        assert "comm" in packs["zb-v"][key.format(x)]["x"]
    assert key.format("0.5").replace("|0.0|1.0|", "|0.25|1.0|") not in packs["zb-v"]  # one slice only (Note [grid])
