"""Communication inside a task (Note [communication] in sim.core.cost): alone it adds to the task, in an overlapped
pair it hides behind the other task's compute; closed forms, the teaching example and the CLI flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpipe.schedule import SCHEDULES, Schedule, dualpipe_v, gpipe, one_f_one_b
from sim.calibration.host import Overheads, with_overheads
from sim.cli import main
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.sharing import COMPUTING, TALKING, pair_ends, phased_pair_ends, task_phases


def uniform(n: int, t: float, x: float, w: float | None = None) -> CostModel:
    """``n`` stages of ``t`` forward and input gradient, ``w`` (default ``t``) weight gradient, ``x`` communication."""
    return CostModel((StageCost(t, t, weight=t if w is None else w, communication=x),) * n)


def named(name: str, m: int, p: int) -> Schedule:
    return SCHEDULES[name](m, 2 * p, "never", devices=p)


# -- one pair ------------------------------------------------------------------------------------------------


def test_task_phases_are_dualpipe_s_order_collapsed() -> None:
    assert task_phases(2.0, 1.0, False) == ((COMPUTING, 2.0), (TALKING, 1.0))  # a forward computes, then sends
    assert task_phases(2.0, 1.0, True) == ((TALKING, 1.0), (COMPUTING, 2.0))  # a backward receives, then computes
    assert task_phases(2.0, 0.0, True) == ((COMPUTING, 2.0),) and task_phases(0.0, 0.0, False) == ()


@pytest.mark.parametrize(("a", "b"), [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0), (0.0, 2.0), (0.25, 0.75)])
def test_without_communication_a_pair_is_pair_ends_exactly(a: float, b: float) -> None:
    assert phased_pair_ends(10.0, task_phases(a, 0.0, False), task_phases(b, 0.0, True)) == pair_ends(10.0, a, b)


@pytest.mark.parametrize("c", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("x", [0.25, 0.5, 1.0, 3.0])
def test_a_forward_and_a_backward_alike_take_twice_the_larger_phase(c: float, x: float) -> None:
    """c >= x: the backward's communication runs under the forward's compute, then the forward's under the
    backward's, the compute shared in between: both end at 2c; x >= c alike on the link: 2x."""
    ends = phased_pair_ends(5.0, task_phases(c, x, False), task_phases(c, x, True))
    assert ends == pytest.approx((5.0 + 2 * max(c, x),) * 2, abs=1e-12)


def test_a_pair_by_hand() -> None:
    """F: compute 1 then link 3; B: link 1 then compute 2. Each alone on its resource for 1 s; then F on the link
    and B computing, again alone: B ends at 1 + 2, F at 1 + 3."""
    assert phased_pair_ends(0.0, task_phases(1.0, 3.0, False), task_phases(2.0, 1.0, True)) == (4.0, 3.0)
    # two backwards both start on the link: halves of it for 2 s, then each computes, sharing the device
    assert phased_pair_ends(0.0, task_phases(1.0, 1.0, True), task_phases(1.0, 1.0, True)) == (4.0, 4.0)


@pytest.mark.parametrize("works", [(1.0, 2.0, 0.5, 1.5), (3.0, 0.2, 1.0, 4.0), (0.1, 0.1, 5.0, 0.3)])
def test_a_pair_is_bounded_by_its_busier_resource_and_by_running_in_turn(works: tuple[float, ...]) -> None:
    ca, xa, cb, xb = works
    ends = phased_pair_ends(0.0, task_phases(ca, xa, False), task_phases(cb, xb, True))
    assert max(ca + cb, xa + xb) - 1e-12 <= max(ends) <= ca + xa + cb + xb + 1e-12
    assert ends[0] >= ca + xa - 1e-12 and ends[1] >= cb + xb - 1e-12  # nothing runs faster than alone


# -- tasks alone ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("x", [0.0, 0.5, 1.25])
def test_alone_a_task_takes_its_compute_and_its_communication(x: float) -> None:
    """1F1B: (m + p - 1)(t_f + t_b + 2x), one communication per F and per B; W and a non-split backward's weight
    part add none. A recompute communicates as its forward did."""
    m, p, f, b, w = 8, 4, 1.0, 2.0, 0.5
    cost = CostModel((StageCost(f, b + w, communication=x),) * p)
    assert simulate(one_f_one_b(m, p, "never"), cost).makespan == pytest.approx((m + p - 1) * (f + b + w + 2 * x))
    always = simulate(one_f_one_b(m, p, "always"), cost).compute_spans()
    assert all(s.duration == pytest.approx(f + x) for s in always if s.task.op.value == "R")
    split = simulate(SCHEDULES["zb-h1"](m, p), CostModel((StageCost(f, b, weight=w, communication=x),) * p))
    assert all(s.duration == pytest.approx(w) for s in split.compute_spans() if s.task.op.value == "W")


def test_communication_scales_with_the_micro_batch() -> None:
    cost = CostModel((StageCost(1.0, 2.0, communication=0.5),), microbatch_scale=(1.0, 0.5))
    spans = {str(s.task): s.duration for s in simulate(gpipe(2, 1, "never"), cost).compute_spans()}
    assert spans == {"F0@0": 1.5, "F1@0": 0.75, "B0@0": 2.5, "B1@0": 1.25}


def test_shared_cores_do_not_stretch_communication() -> None:
    """Two stages, contention 0.5: F1@0 and F0@1 start together at 1 + x and share the cores for their whole
    span; each stretches only its compute second: (1 + x) + 0.5."""
    x = 0.75
    cost = with_overheads(CostModel((StageCost(1.0, 1.0, communication=x),) * 2), Overheads(contention=0.5))
    spans = {str(s.task): s for s in simulate(gpipe(2, 2), cost).compute_spans()}
    assert spans["F1@0"].start == spans["F0@1"].start == pytest.approx(1 + x)
    assert spans["F1@0"].duration == pytest.approx(1 + x + 0.5) == spans["F0@1"].duration


def test_zero_communication_is_today_s_simulation() -> None:
    """Every registered schedule, each policy: an explicit zero is the default, span for span."""
    for name, kind in SCHEDULES.items():
        v = 1 if kind.place is None else 2
        for policy in ("never", "always"):
            s = kind(8, 4 * v, policy, devices=4)
            plain = CostModel((StageCost(0.5, 0.75, weight=0.25 if s.splits_weight_gradient else 0.0),) * s.n)
            zero = CostModel(tuple(StageCost(0.5, 0.75, weight=st.weight, communication=0.0) for st in plain.stages))
            assert simulate(s, zero) == simulate(s, plain), name


# -- DualPipe-V against ZB-V ---------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [2, 3, 6])
@pytest.mark.parametrize("x", [0.0, 0.5, 1.0, 2.0, 3.0])
def test_dualpipe_v_on_one_device(m: int, x: float) -> None:
    """p = 1 never idles: 3 forwards and 3 backwards alone (c + x each), 2m - 3 pairs (2 max(c, x) each), 2m W."""
    c, w = 1.0, 0.75
    tl = simulate(dualpipe_v(m, 2), uniform(2, c, x, w))
    assert len(dualpipe_v(m, 2).pairs) == 2 * m - 3
    assert tl.makespan == pytest.approx(2 * m * w + 6 * (c + x) + (2 * m - 3) * 2 * max(c, x))


@pytest.mark.parametrize(("m", "p"), [(4, 2), (8, 4), (9, 4), (12, 3)])
@pytest.mark.parametrize("x", [0.25, 0.5, 1.5])
def test_dualpipe_v_keeps_each_device_busy_for_its_tasks_with_pairs_shorter(m: int, p: int, x: float) -> None:
    """Device d has 2(m - 2p + d + 1) + (p - d - 1) pairs (one fewer at the V's turn, d = p - 1); it is busy
    2m t_w, plus c + x for each forward and backward alone, plus 2 max(c, x) for each pair."""
    c, w, s = 1.0, 0.5, dualpipe_v(m, 2 * p)
    tl = simulate(s, uniform(2 * p, c, x, w))
    for d in range(p):
        pairs = sum(1 for a, _ in s.pairs if s.device_of(a.stage) == d)
        assert pairs == 2 * (m - 2 * p + d + 1) + (p - d - 1) - (d == p - 1)
        busy = 2 * m * w + 2 * (2 * m - pairs) * (c + x) + pairs * 2 * max(c, x)
        assert tl.busy(d) == pytest.approx(busy)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("x", [0.0, 0.25, 0.5, 1.0])
def test_zb_v_closed_form_with_communication(p: int, x: float) -> None:
    """ZB-V, t_f = t_b = t_w = t: 2m(t_f + t_b + t_w + 2x) + (p - 1)(t_f + x) while x <= t (m >= 2p - 1)."""
    for m in (2 * p - 1, 2 * p, 2 * p + 3):
        tl = simulate(named("zb-v", m, p), uniform(2 * p, 1.0, x))
        assert tl.makespan == pytest.approx(2 * m * (3 + 2 * x) + (p - 1) * (1 + x))


#: The teaching example (docs/figures/beyond_1f1b.py's beyond_schedules: p 4, m 8, a device's share 1 ms of each of F, B
#: and W, so 0.5 ms per stage): communication per F and B of a stage -> (ZB-V, DualPipe-V) makespans in ms.
TEACHING = {0.0: (25.5, 25.5), 0.25: (34.25, 31.5), 0.5: (43.0, 37.5), 1.0: (62.0, 56.5)}


@pytest.mark.parametrize("x", sorted(TEACHING))
def test_the_teaching_example(x: float) -> None:
    spans = tuple(simulate(named(name, 8, 4), uniform(8, 0.5e-3, x * 1e-3)).makespan * 1e3
                  for name in ("zb-v", "dualpipe-v"))
    assert spans == pytest.approx(TEACHING[x], abs=1e-9)


@pytest.mark.parametrize(("m", "p"), [(8, 4), (12, 3), (16, 4)])
def test_dualpipe_v_is_ahead_of_zb_v_exactly_when_there_is_communication(m: int, p: int) -> None:
    for x in (0.0, 0.05, 0.25, 0.5, 1.0, 2.0):
        zbv, dpv = (simulate(named(name, m, p), uniform(2 * p, 1.0, x)).makespan for name in ("zb-v", "dualpipe-v"))
        assert (dpv == pytest.approx(zbv)) if x == 0 else (dpv < zbv - 1e-9), (x, zbv, dpv)


def test_pairs_in_turn_lose_what_overlap_wins() -> None:
    """SimConfig(overlap_pairs=False): each pair's tasks one after the other, so every F and B costs c + x."""
    s, cost = named("dualpipe-v", 8, 4), uniform(8, 0.5, 0.5)
    in_turn = simulate(s, cost, SimConfig(overlap_pairs=False))
    assert all(sp.duration == pytest.approx(1.0) for sp in in_turn.compute_spans() if sp.task.op.value in "FB")
    assert in_turn.makespan > simulate(s, cost).makespan


# -- the CLI -------------------------------------------------------------------------------------------------


def _makespan(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> float:
    argv = ["simulate", "--stages", "8", "--devices", "4", "--chunks", "8", "--forward-time", "0.5",
            "--backward-time", "0.5", "--weight-time", "0.5", "--out", str(out), "--json", *args]
    assert main(argv) == 0
    return float(json.loads(capsys.readouterr().out)["makespan"])


def test_the_cli_takes_a_communication_time(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _makespan(capsys, tmp_path / "a", "--schedule", "zb-v", "--communication-time", "0.5") == 43.0
    assert _makespan(capsys, tmp_path / "b", "--schedule", "dualpipe-v", "--communication-time", "0.5") == 37.5
    assert _makespan(capsys, tmp_path / "c", "--schedule", "dualpipe-v") == 25.5
    per_stage = _makespan(capsys, tmp_path / "d", "--schedule", "zb-v", "--communication-time", "0.5,0,0,0,0,0,0,0")
    assert 25.5 < per_stage < 43.0


@pytest.mark.parametrize(("value", "message"), [
    ("-1", "--communication-time must be a finite number of seconds >= 0"),
    ("1,2", "--communication-time takes one value or 4 (one per stage), got 2"),
])
def test_the_cli_refuses_a_bad_communication_time(capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str,
                                                  message: str) -> None:
    assert main(["simulate", "--communication-time", value, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
