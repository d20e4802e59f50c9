"""A task's communication as all-to-all spans on the timeline (Note [communication spans] in sim.core.overlap), and
how much of it no compute hides (sim.core.exposure): closed forms, the trace, the chart and the CLI."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from gpipe.schedule import SCHEDULES, Schedule, Task, dualpipe_v, gpipe, one_f_one_b
from gpipe.schedule.plot import drawn_kinds, plot_timeline
from gpipe.schedule.timeline import COLLECTIVE, COMPUTE, Span, Timeline, collective_label
from gpipe.schedule.trace import chrome_trace
from sim.calibration.host import Overheads, with_overheads
from sim.cli import main
from sim.core.collectives import Gather, StageCollectives, Unit
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.exposure import exposure, is_all_to_all
from sim.core.sharing import COMPUTING, TALKING, phased_pair, phased_pair_ends, task_phases

T = Task.parse


def uniform(n: int, c: float, x: float, w: float = 0.5, nbytes: int = 0) -> CostModel:
    """``n`` stages of ``c`` forward and input gradient, ``w`` weight gradient, ``x`` communication."""
    return CostModel((StageCost(c, c, weight=w, communication=x, communication_bytes=nbytes),) * n)


def talks(tl: Timeline, device: int | None = None) -> dict[str, tuple[float, float]]:
    """The all-to-all spans of ``tl`` (of ``device``), by task."""
    return {str(s.task): (s.start, s.end) for s in tl.collective_spans(device) if is_all_to_all(s)}


def pairs_on(s: Schedule, d: int) -> int:
    return sum(1 for a, _ in s.pairs if s.device_of(a.stage) == d)


# -- when the phases of a pair run ---------------------------------------------------------------------------


@pytest.mark.parametrize(("c", "x", "forward", "backward"), [
    # c >= x: B receives under F's compute, F sends under B's (phased_pair_ends' first table)
    (2.0, 1.0, ((COMPUTING, 0, 3), (TALKING, 3, 4)), ((TALKING, 0, 1), (COMPUTING, 1, 4))),
    # c < x: both on the link from c to 2x - c, where neither computes (its second table)
    (1.0, 3.0, ((COMPUTING, 0, 1), (TALKING, 1, 6)), ((TALKING, 0, 5), (COMPUTING, 5, 6))),
])
def test_a_pair_s_phases_as_the_tables_draw_them(c: float, x: float, forward: tuple, backward: tuple) -> None:
    assert phased_pair(0.0, task_phases(c, x, False), task_phases(c, x, True)) == (forward, backward)


@pytest.mark.parametrize("works", [(1.0, 2.0, 0.5, 1.5), (3.0, 0.2, 1.0, 4.0), (0.1, 0.1, 5.0, 0.3), (1, 0, 2, 0)])
def test_each_task_s_phases_follow_each_other_to_its_end(works: tuple[float, ...]) -> None:
    ca, xa, cb, xb = works
    a, b = task_phases(ca, xa, False), task_phases(cb, xb, True)
    ran = phased_pair(5.0, a, b)
    for phases, ran_phases in zip((a, b), ran, strict=True):
        assert [use for use, _ in phases] == [use for use, _, _ in ran_phases]
        assert ran_phases[0][1] == 5.0 and all(p[2] == q[1] for p, q in itertools.pairwise(ran_phases))
    assert tuple(r[-1][2] for r in ran) == pytest.approx(phased_pair_ends(5.0, a, b), abs=1e-12)


# -- the spans -----------------------------------------------------------------------------------------------


def test_alone_a_forward_communicates_last_and_a_backward_first() -> None:
    """1F1B on 2 stages, F 1 s and B 2 s of compute, 0.5 s of communication: a span per F, R and B, none per W."""
    tl = simulate(one_f_one_b(2, 2, "never"), CostModel((StageCost(1.0, 2.0, communication=0.5),) * 2))
    assert talks(tl, 1) == {"F0@1": (2.5, 3.0), "B0@1": (3.0, 3.5), "F1@1": (6.5, 7.0), "B1@1": (7.0, 7.5)}
    for s in tl.compute_spans():
        assert talks(tl)[str(s.task)] == ((s.end - 0.5, s.end) if s.task.op.value == "F" else (s.start, s.start + 0.5))
    split = simulate(SCHEDULES["zb-h1"](4, 2, "always"), uniform(2, 1.0, 0.25))
    ops = sorted({s.task.op.value for s in split.collective_spans()})
    assert ops == ["B", "F", "R"] and len(split.collective_spans()) == 3 * 4 * 2


def test_a_span_is_labelled_by_its_bytes_and_scales_with_the_micro_batch() -> None:
    cost = CostModel((StageCost(1.0, 2.0, communication=0.5, communication_bytes=2**20),), microbatch_scale=(1.0, 0.5))
    tl = simulate(gpipe(2, 1, "never"), cost)
    assert talks(tl) == {"F0@0": (1.0, 1.5), "F1@0": (2.0, 2.25), "B1@0": (2.25, 2.5), "B0@0": (3.5, 4.0)}
    labels = {str(s.task): s.label for s in tl.collective_spans()}
    assert labels["F0@0"] == collective_label("all-to-all", "dispatch and combine", 2**20) \
        == "all-to-all dispatch and combine (1 MiB)"
    assert labels["F1@0"] == "all-to-all dispatch and combine (512 KiB)"
    assert tl.collective_spans()[0].name == "all-to-all dispatch and combine (1 MiB) for F0@0"


def test_the_compute_spans_are_the_tasks_whole_time() -> None:
    """The all-to-alls are added beside the compute spans, which keep their times: every existing reader is
    unchanged."""
    s, cost = dualpipe_v(8, 8), uniform(8, 1.0, 1.5)
    tl = simulate(s, cost)
    assert len(tl.compute_spans()) == sum(map(len, s.tasks))
    assert len(tl.collective_spans()) == sum(1 for ts in s.tasks for t in ts if t.op.value != "W")
    for sp in tl.collective_spans():
        whole = tl.span_of(sp.task)
        assert whole.device == sp.device and whole.start <= sp.start < sp.end <= whole.end


def test_off_the_plain_path_the_phase_is_where_the_task_puts_it() -> None:
    """Shared cores stretch a task's compute, not its communication; an asynchronous device's forward sends as its
    kernels end (0.25 s of compute, 0.5 s on the link from 0.5), not when its host's second of work does."""
    stretched = with_overheads(CostModel((StageCost(1.0, 1.0, communication=0.75),) * 2), Overheads(contention=0.5))
    tl = simulate(gpipe(2, 2), stretched)
    for s in tl.compute_spans():
        expected = (s.start, s.start + 0.75) if s.task.op.value == "B" else (s.end - 0.75, s.end)  # F, R: last
        assert talks(tl)[str(s.task)] == expected
    slow_host = with_overheads(CostModel((StageCost(0.25, 0.25, communication=0.5),)), Overheads(task=1.0, launch=0.5))
    tl = simulate(gpipe(1, 1, "never"), slow_host, SimConfig(asynchronous=frozenset({0})))
    assert tl.span_of(T("F0@0")).end == 1.5 and talks(tl)["F0@0"] == (0.75, 1.25)
    in_turn = simulate(gpipe(2, 2), uniform(2, 1.0, 0.5), SimConfig(copy_streams=False))
    assert talks(in_turn) == talks(simulate(gpipe(2, 2), uniform(2, 1.0, 0.5)))


def test_beside_gathers_the_communication_ends_its_forward() -> None:
    """A stage that gathers its parameters (sim.core.collectives) computes behind its gathers: the forward's
    all-to-all is still its last seconds, beside the all-gathers on the same stream."""
    gathering = StageCollectives((Unit(0.5, gather=0.25), Unit(0.5, gather=0.25)), Gather.EACH_TASK)
    tl = simulate(gpipe(1, 1, "never"), CostModel((StageCost(1.0, 2.0, communication=0.5, collectives=gathering),)))
    kinds = [s.label.split(" ")[0] for s in tl.collective_spans()]
    assert kinds.count("all-gather") == 2 and kinds.count("all-to-all") == 2
    assert talks(tl)["F0@0"] == (tl.span_of(T("F0@0")).end - 0.5, tl.span_of(T("F0@0")).end)


def test_without_communication_there_are_no_spans_to_add() -> None:
    assert simulate(dualpipe_v(4, 4), uniform(4, 1.0, 0.0)).collective_spans() == []


# -- exposure ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("x", [0.25, 1.0, 2.5])
def test_alone_all_communication_is_exposed(x: float) -> None:
    """1F1B, no pairs: every F and B exposes its x; 2m of them per device."""
    m, p = 6, 3
    e = exposure(simulate(one_f_one_b(m, p, "never"), uniform(p, 1.0, x)))
    assert e.communication == pytest.approx((2 * m * x,) * p) and e.exposed == pytest.approx(e.communication)
    assert e.hidden == pytest.approx((0.0,) * p) and e.total_exposed == pytest.approx(2 * m * x * p)


@pytest.mark.parametrize("m", [2, 3, 6])
@pytest.mark.parametrize(("c", "x"), [(1.0, 0.5), (1.0, 1.0), (1.0, 1.5), (0.5, 3.0)])
def test_dualpipe_v_on_one_device_hides_all_but_2_max_0_x_minus_c_per_pair(m: int, c: float, x: float) -> None:
    """p = 1: 3 forwards and 3 backwards alone expose x each; each of the 2m - 3 pairs 2 max(0, x - c) (both on
    the link from c to 2x - c, nobody computing). Every task's x is on the network, and the device, never idle,
    is busy for its compute plus what is exposed."""
    w, s = 0.75, dualpipe_v(m, 2)
    tl = simulate(s, uniform(2, c, x, w))
    e = exposure(tl)
    assert e.exposed == pytest.approx((6 * x + (2 * m - 3) * 2 * max(0.0, x - c),))
    assert e.communication == pytest.approx((4 * m * x,))
    assert tl.busy(0) == pytest.approx(2 * m * w + 4 * m * c + e.exposed[0])


@pytest.mark.parametrize(("m", "p"), [(8, 4), (9, 4), (12, 3)])
@pytest.mark.parametrize("x", [0.25, 1.0, 1.5])
def test_dualpipe_v_exposes_per_device_its_lone_tasks_and_its_pairs_excess(m: int, p: int, x: float) -> None:
    c, s = 1.0, dualpipe_v(m, 2 * p)
    e = exposure(simulate(s, uniform(2 * p, c, x)))
    for d in range(p):
        pairs = pairs_on(s, d)
        assert e.exposed[d] == pytest.approx((4 * m - 2 * pairs) * x + pairs * 2 * max(0.0, x - c))
        assert e.hidden[d] == pytest.approx(pairs * 2 * min(x, c))


def test_the_same_model_exposes_less_under_dualpipe_v_than_zb_v_or_its_pairs_in_turn() -> None:
    cost = uniform(8, 0.5, 0.75)
    zbv, dpv = (exposure(simulate(SCHEDULES[name](8, 8, "never", devices=4), cost)) for name in ("zb-v", "dualpipe-v"))
    in_turn = exposure(simulate(dualpipe_v(8, 8), cost, SimConfig(overlap_pairs=False)))
    assert zbv.total_communication == dpv.total_communication == pytest.approx(4 * 8 * 4 * 0.75)
    assert zbv.total_exposed == pytest.approx(zbv.total_communication) and dpv.total_exposed < zbv.total_exposed
    assert in_turn.exposed == pytest.approx(in_turn.communication) and in_turn.communication == dpv.communication


def test_exposure_by_hand() -> None:
    """Device 0: F computes 0..2 then sends 2..3; B receives 1..2 then computes 2..4. Device 1: a task alone
    receives 0..1, and an all-reduce (not an all-to-all) runs with nothing beside it. The all-to-alls of device 0
    cover 1..3, all under compute (F's before 2, B's after); F's own span does not hide F's own all-to-all."""
    label = collective_label("all-to-all", "dispatch and combine", 8)
    spans = (
        Span(0, COMPUTE, T("F0@0"), 0.0, 3.0), Span(0, COLLECTIVE, T("F0@0"), 2.0, 3.0, label),
        Span(0, COMPUTE, T("B1@0"), 1.0, 4.0), Span(0, COLLECTIVE, T("B1@0"), 1.0, 2.0, label),
        Span(1, COMPUTE, T("B0@1"), 0.0, 2.0), Span(1, COLLECTIVE, T("B0@1"), 0.0, 1.0, label),
        Span(1, COLLECTIVE, T("B0@1"), 2.0, 5.0, collective_label("all-reduce", 0, 8)),
    )
    e = exposure(Timeline(spans, num_devices=3))
    assert e.communication == (2.0, 1.0, 0.0) and e.exposed == (0.0, 1.0, 0.0) and e.hidden == (2.0, 0.0, 0.0)
    alone = exposure(Timeline((Span(0, COMPUTE, T("F0@0"), 0.0, 3.0), Span(0, COLLECTIVE, T("F0@0"), 2.0, 3.0, label))))
    assert alone.exposed == (1.0,)


# -- the pictures and the CLI --------------------------------------------------------------------------------


def test_the_trace_shows_each_all_to_all_and_overlapping_spans_in_lanes() -> None:
    """c < x: a pair's two all-to-alls share the link from c to 2x - c, and its two tasks start together; each
    overlapping span gets a thread of its own, so no thread holds two spans at once."""
    tl = simulate(dualpipe_v(4, 2), uniform(2, 1.0, 1.5))
    events = chrome_trace(tl)["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(tl.spans)
    a2a = [e for e in xs if e["name"].startswith("all-to-all")]
    assert len(a2a) == 16 and {e["cat"] for e in a2a} == {"collective"}
    assert {e["name"] for e in a2a} >= {"all-to-all dispatch and combine (0 B) for F1@1"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert set(threads.values()) == {"compute", "compute 2", "collective", "collective 2"}
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in xs:
        assert (e["pid"], e["tid"]) in threads
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans))
    alone = chrome_trace(simulate(one_f_one_b(4, 2, "never"), uniform(2, 1.0, 0.5)))["traceEvents"]
    assert {e["args"]["name"] for e in alone if e["name"] == "thread_name"} == {"compute", "collective"}


def test_the_chart_draws_the_all_to_alls_in_their_own_colour(tmp_path: Path) -> None:
    tl = simulate(dualpipe_v(4, 2), uniform(2, 1.0, 0.5))
    assert drawn_kinds([tl]) == ["F", "B", "W", "all-to-all"]
    fig = plot_timeline(tl)
    assert [label.get_text() for label in fig.axes[0].get_yticklabels()] == ["dev 0", "dev 0 collective"]
    plot_timeline(tl, tmp_path / "pair.png")
    assert (tmp_path / "pair.png").stat().st_size > 0


def test_the_cli_reports_the_exposed_all_to_all(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The teaching example (p 4, m 8, 0.5 s per stage): ZB-V exposes every task's 0.75 s, DualPipe-V hides one
    second under each of its 25 pairs (c = 0.5 < x: 2 min(c, x) each)."""
    base = ["simulate", "--stages", "8", "--devices", "4", "--chunks", "8", "--forward-time", "0.5",
            "--backward-time", "0.5", "--weight-time", "0.5", "--communication-time", "0.75"]
    exposed = {}
    for name in ("zb-v", "dualpipe-v"):
        assert main([*base, "--schedule", name, "--out", str(tmp_path / name), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["all_to_all"]["seconds"] == pytest.approx(96.0)
        assert sum(row["all_to_all_exposed"] for row in doc["devices"]) == pytest.approx(doc["all_to_all"]["exposed"])
        exposed[name] = doc["all_to_all"]["exposed"]
    assert exposed == pytest.approx({"zb-v": 96.0, "dualpipe-v": 96.0 - 25})
    assert main([*base, "--schedule", "dualpipe-v", "--out", str(tmp_path / "text")]) == 0
    out = capsys.readouterr().out
    assert "all-to-all 96 s on the network: 71 s exposed (no task computing), 25 s hidden under another task's " \
           "compute" in out
    assert "a2a exposed (s)" in out
    assert main([*base[:-2], "--schedule", "zb-v", "--out", str(tmp_path / "none")]) == 0
    assert "all-to-all" not in capsys.readouterr().out
