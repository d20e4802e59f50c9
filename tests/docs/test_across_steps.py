"""Steps back to back without the optimizer's barrier (Note [across steps] in docs/teaching_numbers.py): the closed
forms the "Beyond 1F1B" page and notebook 08 teach, checked against the simulator over one, two and three steps."""

from __future__ import annotations

import pytest

from gpipe.schedule import SCHEDULES, Schedule
from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them


def _schedule(name: str, p: int = 4, m: int = 8) -> Schedule:
    """The page's ``name`` on ``p`` devices, ``m`` micro-batches, two stages per device where it places several."""
    kind = SCHEDULES[name]
    return kind(m, p * (1 if kind.place is None else 2), "never", devices=p)


def test_one_step_back_to_back_is_the_schedule() -> None:
    tn = _load("teaching_numbers")
    s = _schedule("dualpipe-v")
    once = tn.consecutive_steps(s, 1)
    assert once.tasks == s.tasks and once.pairs == s.pairs and once.m == s.m
    two = tn.consecutive_steps(s, 2)
    assert [len(d) for d in two.tasks] == [2 * len(d) for d in s.tasks] and len(two.pairs) == 2 * len(s.pairs)
    with pytest.raises(ValueError, match="at least 1"):
        tn.consecutive_steps(s, 0)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_steps_without_a_barrier_are_the_closed_forms(steps: int) -> None:
    """With t_f = t_b = t_w (1 ms per device's share), p = 4, m = 8: ZB-H1's K steps are K times one, its first device
    ending last; ZB-H2's K·m(t_f + t_b + t_w) + (p - 1)t_f and ZB-V's the same with half a device's t_f."""
    common, tn = _load("figures.common"), _load("teaching_numbers")
    p, m, work = 4, 8, 3e-3  # work: t_f + t_b + t_w of one device's share, per micro-batch
    expected = {"zb-h1": steps * (m * work + (p - 1) * 1e-3), "zb-h2": steps * m * work + (p - 1) * 1e-3,
                "zb-v": steps * m * work + (p - 1) * 0.5e-3, "1f1b": steps * (m + p - 1) * work}
    for name, span in expected.items():
        s = _schedule(name)
        got = common.simulate(tn.consecutive_steps(s, steps), tn.beyond_cost(s)).makespan
        assert got == pytest.approx(span, abs=1e-12), (name, steps, got)


def test_the_page_s_table_and_figure_are_the_simulator_s() -> None:
    common, tn = _load("figures.common"), _load("teaching_numbers")
    runs = {name: (one, two) for name, one, two in tn.across_steps(common.simulate)}
    assert list(runs) == list(tn.ACROSS)
    table = tn._beyond(common.simulate, common.md_table)["across_steps_table"]
    for name, (one, two) in runs.items():
        cells = [one.makespan, 2 * one.makespan, two.makespan, two.makespan - one.makespan]
        row = f"| `{name}` | " + " | ".join(f"{x * 1e3:.1f} ms" for x in cells) + " |"
        assert row in table, (row, table)
    numbers = tn.beyond_numbers(common.simulate)
    assert (numbers["zb-h1 first device ends"], numbers["zb-h2 first device ends"]) == ("27 ms", "24 ms")
    assert numbers["zb-h2 per step"] == "24 ms" and numbers["zb-h2 two"] == "51 ms"
