"""The numbers that memory.md, checkpointing.md, copy-streams.md, parallelism-traffic.md and the cheat-sheet quote
(issue 38), computed by the simulator, the generators and the planner, and found on the pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpipe.schedule import SCHEDULES, gpipe, one_f_one_b
from gpipe.schedule.task import Checkpoint
from sim.core.collectives import StageCollectives, Unit
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.core.rings import allreduce_seconds
from sim.planning.parallel.replicas import step_seconds
from tests.docs.test_figures import _load

DOCS = Path(__file__).resolve().parents[2] / "docs"
MiB = 2**20


def _page(name: str) -> str:
    return " ".join((DOCS / name).read_text(encoding="utf-8").split())  # one line: phrases may wrap anywhere


def _peaks(name: str, policy: Checkpoint, p: int = 4, m: int = 8) -> list[int]:
    """Peak bytes per device in checkpointing.md's units: F 1 ms, B 2 ms (B and W 1 ms each where split),
    64 MiB saved, 8 MiB stage input."""
    schedule = SCHEDULES[name](m, p, policy).validate()
    split = schedule.splits_weight_gradient
    stage = StageCost(forward=1e-3, backward=1e-3 if split else 2e-3, weight=1e-3 if split else 0.0,
                      saved_bytes=64 * MiB, checkpoint_bytes=8 * MiB)
    tl = simulate(schedule, CostModel((stage,) * p))
    return [tl.peak_memory(d) // MiB for d in range(p)]


def test_except_last_is_free_only_under_gpipe() -> None:
    page = _page("concepts/checkpointing.md")
    assert _peaks("gpipe", "except_last")[0] <= _peaks("gpipe", "always")[0]  # 120 <= 128 MiB
    always, except_last = _peaks("1f1b", "always")[0], _peaks("1f1b", "except_last")[0]
    assert (always, except_last) == (96, 152)  # 1.5 A and 2.375 A
    zb_never, zb_last = _peaks("zb-h1", "never")[-1], _peaks("zb-h1", "except_last")[-1]
    assert (zb_never, zb_last) == (256, 288)  # 4 A and 4.5 A
    for text in ("device 0 peaks at 96 MiB under `always` and at 152 MiB under `except_last`",
                 "its last device peaks at 288 MiB under `except_last`, above the 256 MiB"):
        assert text in page
    assert "`except_last` is free memory-wise and saves one recompute per stage" not in page.replace(
        "Under GPipe `except_last` is free", "")


def test_memory_table_rows_the_pages_quote() -> None:
    common, tn = _load("figures.common"), _load("teaching_numbers")
    a = tn.MEMORY_A
    rows = {(name, policy): [b / a for b in peaks] for name, policy, _, peaks in tn.memory_rows(common.simulate)}
    p = tn.MEMORY_P
    assert rows[("zb-h1", "never")] == [p] * p  # p·A on every device, not 1F1B's (p − j)·A
    assert rows[("1f1b", "never")] == [p - j for j in range(p)]
    assert rows[("zb-h1", "except_last")][-1] == 4.5 and rows[("zb-v", "except_last")][-1] == 4.125
    # two stages per device, each checkpointing its own input A/8 (the explorer's model): under `always` device 0
    # of interleaved 1F1B holds 1.875 A, which A/16 per stage input would make 1.1875 A
    assert rows[("interleaved-1f1b", "always")][0] == 1.875
    page = _page("concepts/memory.md")
    for text in ("`p A` on every device", "the seventh", "its own input `A/8`",
                 "ZB-H1's last device peaks at 4.5 A and ZB-V's at 4.125 A"):
        assert text in page
    assert "as 1F1B, `W` keeping only" not in page and "(the third column)" not in page


def test_the_activations_table_has_the_layer_input_seventh() -> None:
    common, tn = _load("figures.common"), _load("teaching_numbers")
    header = tn._activations(common.md_table)["memory_activations"].splitlines()[0]
    assert [c.strip() for c in header.strip("|").split("|")][6] == "layer input (2sh)"


def test_copy_streams_pay_the_fill_and_the_drain() -> None:
    common, copy_streams = _load("figures.common"), _load("figures.copy_streams")
    n, copy = 4, copy_streams.COPY
    free = simulate(gpipe(8, n, "never"), common.teach_cost())
    tl = simulate(gpipe(8, n, "never"), common.teach_cost(copy_seconds=copy))
    assert tl.makespan - free.makespan == pytest.approx(2 * (n - 1) * copy)  # 3 ms
    starts = [tl.compute_spans(j)[0].start for j in range(n)]
    assert starts == pytest.approx([j * (1e-3 + copy) for j in range(n)])  # stage j starts j copies late
    page = _page("concepts/copy-streams.md")
    assert "only the later stages' wait for their first input" in page and "`2 (n − 1)` copies, 3 ms here" in page
    assert "the first stage's wait" not in page


def test_data_parallel_bytes_fall_by_more_than_p() -> None:
    bytes_only = LinkSpec("bytes", latency=0.0, bandwidth=1.0)  # seconds == bytes sent per GPU
    g, p, grad = 8, 4, 1.0
    d = g // p
    ratio = allreduce_seconds(grad, g, bytes_only) / allreduce_seconds(grad / p, d, bytes_only)
    assert ratio == pytest.approx(p * (g - 1) / g * d / (d - 1)) and ratio == pytest.approx(7)
    page = _page("concepts/parallelism-traffic.md")
    assert "`p · ((g − 1)/g) · (d/(d − 1))`" in page and "7 times at `g = 8`, `p = 4`" in page
    assert "fall by about `p`" not in page


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
def test_the_planner_overlaps_the_all_reduce_with_the_drain(make: object) -> None:
    """Each stage's all-reduce starts at its last B: only device 0's, whose last B ends the step, is exposed."""
    schedule = make(8, 4, "never")  # type: ignore[operator]
    link = LinkSpec("dp", latency=0.0, bandwidth=1e9)
    one = allreduce_seconds(4e6, 2, link)  # 6 ms per stage all-reduce over 2 replicas: longer than the drain's gaps
    reduce = StageCollectives((Unit(1.0, reduce=one, reduce_bytes=4e6),))
    alone = simulate(schedule, CostModel.uniform(4, 1e-3, 2e-3))
    tl = simulate(schedule, CostModel(tuple(StageCost(1e-3, 2e-3, collectives=reduce) for _ in range(4))))
    step, exposed = step_seconds(tl, [0.0] * 4, 2)
    assert exposed == pytest.approx(one) and step == pytest.approx(alone.makespan + one)
    assert step < alone.makespan + 4 * one  # not every all-reduce after the makespan


def test_the_traffic_table_shows_hidden_and_exposed_all_reduce() -> None:
    common, plan, tn = _load("figures.common"), _load("figures.plan"), _load("teaching_numbers")
    table = tn._traffic(plan.plan_example(), common.md_table)["traffic_table"]
    rows = {r[0]: r for r in ([c.strip() for c in line.strip("|").split("|")]
                              for line in table.splitlines() if line.startswith("| ") and " x " in line)}

    def whole_exposed(row: list[str]) -> tuple[float, float]:
        a, b = re.findall(r"([\d.]+) ms", row[7])
        return float(a), float(b)

    whole, exposed = whole_exposed(rows["4 x 4"])
    assert 0 < exposed < whole  # device 0's last backward ends the step: what its buckets have left is exposed
    whole, exposed = whole_exposed(rows["8 x 2"])
    assert 0 < exposed < whole  # several stages per device: the later ones' all-reduces hide in the drain
    fastest: dict[tuple[int, int], str] = {}
    for r in sorted((r for r in plan.plan_example().rows if r.fits), key=lambda r: -r.throughput):
        fastest.setdefault((r.stages, r.replicas), r.schedule)  # the first of each shape: the table's row
    assert fastest[(4, 4)] in ("gpipe", "1f1b", "zb-h1") and fastest[(8, 2)] == "interleaved-1f1b"
    page = _page("concepts/parallelism-traffic.md")
    assert "`allreduce_exposed_seconds`" in page and "the `4 x 4` row above" in page
    assert "upper bound" not in page and "adds the all-reduce after the makespan" not in page
    cheat = _page("cheat-sheet.md")
    assert "`max(makespan, last all-reduce's end) + optimizer step`" in cheat
    assert "`makespan + optimizer step + all-reduce`" not in cheat
