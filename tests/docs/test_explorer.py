"""The explorer's packs (docs/explorer.py) hold the simulator's runs exactly, and its refusals are the generators'."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
from pathlib import Path

import pytest

from gpipe.schedule import SCHEDULES
from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them


def _sums(deltas: list[int]) -> list[int]:
    return list(itertools.accumulate(deltas))


def unpack(path: Path) -> dict:
    """A pack file as the page reads it: the base64 string, gunzipped, parsed."""
    text = path.read_text()
    return json.loads(gzip.decompress(base64.b64decode(text[text.index(' = "') + 4:text.rindex('"')])))


@pytest.mark.parametrize(("m", "p"), [(1, 2), (8, 4), (16, 8)])
def test_gpipe_runs_are_its_closed_forms(m: int, p: int) -> None:
    ex = _load("explorer")
    schedule = ex.shape("gpipe", p, 1, m, "never")
    run = ex._encode(ex.run(schedule, 1, 2.0, 0.5, 0.0), [[]] * p)
    assert run["t"] == (m + p - 1) * 3 * ex.TICKS and run["b"] == round((p - 1) / (m + p - 1), 4)
    assert run["k"] == [m * ex.SAVED] * p and run["c"] == [[]] * p
    for d in range(p):  # device d's first forward starts after d forwards; each task lasts its cost
        ticks = _sums(run["s"][d])
        assert ticks[0] == d * ex.TICKS and len(ticks) == 4 * m
        assert [b - a for a, b in zip(ticks[::2], ticks[1::2], strict=True)] == [ex.TICKS] * m + [2 * ex.TICKS] * m


def test_a_pack_holds_the_simulators_timelines_and_the_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _load("explorer")
    for name, values in {"p": (2, 3), "v": (1, 2), "m": (3,), "checkpoint": ("except_last",)}.items():
        monkeypatch.setitem(ex.SHAPE, name, values)
    pack = ex.pack("zb-h1")
    assert pack["shapes"]["2|2|3|except_last"] == ex.shape("zb-h1", 2, 2, 3, "except_last")
    assert "runs one stage per device" in pack["shapes"]["2|2|3|except_last"]  # the layout's own message
    assert len(pack["runs"]) == 2 * 27  # two shapes taken, 3 backward x 3 W shares x 3 copy times each
    shape = pack["shapes"]["3|1|3|except_last"]
    assert shape["split"] and shape["stages"] == 3
    tl = ex.run(ex.shape("zb-h1", 3, 1, 3, "except_last"), 1, 3.0, 0.25, 0.25)
    run = pack["runs"]["3|1|3|except_last|3.0|0.25|0.25"]
    for d in range(3):
        spans = [s for s in tl.spans if s.device == d and s.stream == "compute"]
        assert shape["tasks"][d] == " ".join(str(s.task) for s in spans)
        assert _sums(run["s"][d]) == [round(t * ex.TICKS) for s in spans for t in (s.start, s.end)]
        copies = {str(s.task): (s.start, s.end) for s in tl.spans if s.device == d and s.stream == "copy"}
        assert sorted(shape["copies"][d].split()) == sorted(copies) and len(copies) == 3 * (1 if d in (0, 2) else 2)
        assert _sums(run["c"][d]) == [round(t * ex.TICKS) for c in shape["copies"][d].split() for t in copies[c]]
        assert list(zip(_sums(run["y"][d][0]), run["y"][d][1], strict=True)) == [(round(t * ex.TICKS), x)
                                                                                       for t, x in tl.memory_series(d)]
    assert run["t"] == round(tl.makespan * ex.TICKS) and run["b"] == round(tl.bubble_fraction(), 4)


def test_settings_outside_a_schedule_or_the_grid_say_why() -> None:
    ex = _load("explorer")
    assert not isinstance(ex.shape("interleaved-1f1b", 4, 2, 6, "never"), str)  # any m: a last partial round
    assert "n = 2p" in ex.shape("zb-v", 4, 3, 8, "never")
    assert "m >= n = 8" in ex.shape("dualpipe-v", 4, 2, 4, "never")
    bound = ex.shape("looped-bfs", 8, 4, 2, "never")
    assert f"up to {ex.MAX_STAGES} stages" in bound and "--devices 8 --stages 32 --chunks 2" in bound
    with pytest.raises(ValueError, match="whole number of 1/480 forwards"):
        ex._whole([[0.5, 1.0 / 7]])


def test_write_keeps_an_index_and_a_pack_per_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _load("explorer")
    for name, values in {"p": (2,), "v": (1, 2), "m": (2,), "checkpoint": ("never",)}.items():
        monkeypatch.setitem(ex.SHAPE, name, values)
    paths = ex.write(tmp_path, "s1")
    assert [p.name for p in paths] == ["explorer-data.js"] + [f"explorer-{name}.js" for name in SCHEDULES]
    index = json.loads(paths[0].read_text().split(" = ", 1)[1].rstrip(";\n"))
    assert index["axes"]["v"] == ["1", "2"] and index["schedules"]["zb-v"]["layout"]
    assert unpack(paths[1]) == ex.pack("gpipe")
    before = [p.stat().st_mtime_ns for p in paths]
    assert ex.write(tmp_path, "s1") == paths and [p.stat().st_mtime_ns for p in paths] == before  # same stamp
