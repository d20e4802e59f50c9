"""The page "Mixture of experts in a pipeline" (docs/concepts/mixture-of-experts.md) and the two-direction DualPipe of
"Beyond 1F1B": their formulas are the presets', the counter's, the planner's and the simulator's, the DeepSeek-V3
table is read from the benchmark's results (never typed), and each page states the numbers docs/moe_numbers.py and
docs/figures/dualpipe.py compute."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "concepts" / "mixture-of-experts.md"
BEYOND = ROOT / "docs" / "concepts" / "beyond-1f1b.md"


@pytest.fixture(scope="module")
def moe() -> ModuleType:
    return _load("moe_numbers")


@pytest.fixture(scope="module")
def two_way() -> ModuleType:
    _load("make_figures")  # registers every page module, the docs folder on the path
    return _load("figures.dualpipe")


def _text(page: Path) -> str:
    return " ".join(page.read_text(encoding="utf-8").split())  # a phrase may wrap anywhere


def test_the_page_states_the_numbers(moe: ModuleType) -> None:
    missing = {k: v for k, v in moe.page_numbers().items() if v not in _text(PAGE)}
    assert not missing, f"the page does not state these numbers: {missing}"
    text = PAGE.read_text(encoding="utf-8")
    assert "img/generated/moe_pair.png" in text and "moe_pair.png" in _load("make_figures").FIGURES
    assert "<!-- generated: moe_deepseek_v3 -->" in text


@pytest.mark.parametrize("name", ["deepseek:v3", "deepseek:v2", "mixtral:8x7b", "mixtral:8x22b"])
def test_the_activated_parameters_are_the_formula(moe: ModuleType, name: str) -> None:
    """``N − L_moe·(E − k)·3·h·F_e``, against the preset's own count (each block's experts, skipped ``E − k`` of
    ``E``), without DeepSeek's multi-token-prediction module, as the page counts them."""
    from sim.planning.counting.models import get_model

    spec = get_model(name).config
    assert spec is not None
    cfg = replace(spec, mtp_layers=0)
    per_expert = moe.expert_parameters(cfg) // (cfg.experts * (cfg.n_layer - cfg.dense_layers))
    assert per_expert == 3 * cfg.d_model * cfg.expert_width
    skipped = (cfg.n_layer - cfg.dense_layers) * (cfg.experts - cfg.experts_per_token) * per_expert
    assert cfg.parameters - skipped == cfg.activated_parameters


def test_deepseek_v3_is_the_report_s_671b_and_37b(moe: ModuleType) -> None:
    n = moe.parameters()
    assert round(n["total"] / 1e9) == 671 and round(n["activated_without_embedding"] / 1e9) == 37


@pytest.mark.parametrize(("tensor", "replicas", "ep"), [(1, 128, 64), (1, 128, 8), (2, 64, 16), (8, 16, 128)])
def test_the_fold_is_the_planner_s(moe: ModuleType, tensor: int, replicas: int, ep: int) -> None:
    from sim.planning.parallel.experts import expert_data_group, folds

    per_rank, edp = moe.fold(256, ep, tensor, replicas)
    assert folds(tensor, 1, replicas, ep, 1) and edp == expert_data_group(tensor, 1, replicas, ep, 1)
    assert per_rank * ep == 256 and edp * ep == tensor * replicas


def test_every_all_to_all_the_counter_records_is_the_formula(moe: ModuleType) -> None:
    """DeepSeek-V3's first MoE layer at EP 64, one sequence: four markers, dispatch and combine each way, each
    ``T·k·h·e`` bytes, as ``all_to_all_bytes`` says."""
    from sim.planning.parallel.experts import all_to_all_bytes

    cfg = moe.config()
    formula = moe.message(cfg.seq_len, cfg.experts_per_token, cfg.d_model, 2)
    assert moe.counted_messages() == (formula,) * 4
    assert formula == all_to_all_bytes(cfg.seq_len, cfg.experts_per_token, cfg.d_model, 2) == 4096 * 8 * 7168 * 2


@pytest.mark.parametrize("limit", [1, 2, 4, 8])
@pytest.mark.parametrize("toward", [True, False])
def test_the_two_hops_are_the_planner_s_seconds(moe: ModuleType, limit: int, toward: bool) -> None:
    """The page's two-hop formula against ``ExpertParallel.seconds`` on the HGX H800's group of 64 over 8 nodes, at
    every node limit; FP8 toward the experts, BF16 back."""
    from sim.planning.parallel.experts import FP8_DISPATCH, ExpertParallel, Routing

    cfg, (cluster, _) = moe.config(), moe._cluster()
    one = moe.message(cfg.seq_len, cfg.experts_per_token, cfg.d_model, 2)
    group = ExpertParallel.on(cluster, 64, 1, Routing(cfg.experts, cfg.experts_per_token, limit), fp8_dispatch=True)
    assert (group.inside, group.nodes) == (8, 8)
    sent = one * (FP8_DISPATCH if toward else 1.0)
    nic, link = cluster.nic, cluster.link
    formula = moe.two_hops(sent, 8, 8, cfg.experts_per_token, limit, link.bandwidth, nic.bandwidth,
                           (nic.latency, link.latency))
    assert group.seconds(one, toward) == pytest.approx(formula)
    if limit == cfg.node_limit:
        assert moe.exchange_seconds(one, toward) == pytest.approx(formula)


@pytest.mark.parametrize("x", [0.0, 0.3e-3, 0.6e-3, 1e-3, 1.5e-3])
def test_the_simulated_pair_is_the_closed_form(moe: ModuleType, x: float) -> None:
    """One forward and one backward of ``c`` compute and ``x`` all-to-all: ``2·max(c, x)`` paired, ``2·(c + x)``
    in turn; the backward receives first and the forward sends last, each for ``x`` seconds of its own while
    the other computes (``x <= c``)."""
    from gpipe.schedule.timeline import COLLECTIVE

    c = moe.PAIR["c"]
    runs = moe.pair_runs(c, x)
    for how, expected in (("paired", moe.pair_closed_form(c, x)), ("in turn", moe.in_turn(c, x))):
        assert max(s.end for s in runs[how]) == pytest.approx(expected, abs=1e-12)
    talks = {s.task.op.value: s for s in runs["paired"] if s.stream == COLLECTIVE}
    assert set(talks) == ({"F", "B"} if x else set())
    if x and x <= c:
        assert (talks["B"].start, talks["B"].end) == pytest.approx((0.0, x), abs=1e-12)
        assert (talks["F"].start, talks["F"].end) == pytest.approx((2 * c - x, 2 * c), abs=1e-12)


def _results() -> dict[str, object]:
    data: dict[str, object] = json.loads((ROOT / "benchmarks" / "results" / "deepseek_v3.json").read_text())
    return data


def test_the_deepseek_table_is_the_benchmark_s_results_read_at_build_time(tmp_path: Path) -> None:
    """The fragment renders whatever the results say (a changed file changes the table), says how to produce them
    when absent, and is one of the fragments read anew at every build; the page types none of its numbers."""
    _load("make_figures")
    from figures.benchmarks import benchmark_fragments

    fragment = _load("figures.moe").deepseek_fragment
    data = _results()
    rows = data["rows"]
    assert isinstance(rows, list)
    changed = {**data, "rows": [{**r, "predicted_tokens_per_second_per_gpu": 4321.0} for r in rows]}
    (tmp_path / "deepseek_v3.json").write_text(json.dumps(changed))
    assert "/ 4,321 (" in fragment(tmp_path) and "No results yet" in fragment(tmp_path / "missing")
    shown = benchmark_fragments()["moe_deepseek_v3"]
    page = _text(PAGE)
    for r in rows:
        tokens = f"{r['predicted_tokens_per_second_per_gpu']:,.0f}"
        assert tokens in shown and tokens not in page, tokens
        for seconds in (r["all_to_all_seconds"], r["all_to_all_exposed_seconds"]):
            assert f"| {seconds:.2f} |" in shown and f"{seconds:.2f} s" not in page, seconds


def test_the_planner_ranks_dualpipe_above_1f1b_by_its_exposed_all_to_all(moe: ModuleType) -> None:
    """What the page says of the table: the layout is the page's, 1F1B exposes its whole all-to-all, DualPipe's pairs
    hide part of it, and DualPipe and DualPipe-V rank above 1F1B."""
    data = _results()
    assert (data["gpus"], data["pipeline"], data["expert_parallel"], data["replicas"], data["system"]) == tuple(
        moe.EP[k] for k in ("gpus", "pipeline", "degree", "replicas", "system"))
    by = {r["schedule"]: r for r in data["rows"]}  # type: ignore[attr-defined]
    plain = by["1f1b"]
    assert plain["all_to_all_exposed_seconds"] == pytest.approx(plain["all_to_all_seconds"])
    for name in ("dualpipe", "dualpipe-v"):
        row = by[name]
        assert row["fits"] and row["all_to_all_exposed_seconds"] < row["all_to_all_seconds"]
        assert row["predicted_tokens_per_second_per_gpu"] > plain["predicted_tokens_per_second_per_gpu"]


def test_the_page_is_in_the_nav_and_linked() -> None:
    assert "      - Mixture of experts in a pipeline: concepts/mixture-of-experts.md\n" in (
        ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for source, link in (("cheat-sheet.md", "(concepts/mixture-of-experts.md"),
                         ("concepts/cluster.md", "(mixture-of-experts.md)"),
                         ("concepts/mixture-of-experts.md", "(beyond-1f1b.md#dualpipe-two-directions)")):
        assert link in (ROOT / "docs" / source).read_text(encoding="utf-8"), source


# -- the two-direction DualPipe on "Beyond 1F1B" --------------------------------------------------------------------


def test_the_beyond_page_states_dualpipe_s_numbers_and_credits(two_way: ModuleType) -> None:
    missing = {k: v for k, v in two_way.page_numbers().items() if v not in _text(BEYOND)}
    assert not missing, f"the page does not state these numbers: {missing}"
    text = BEYOND.read_text(encoding="utf-8")
    assert "img/generated/dualpipe_two_way.png" in text and "<!-- generated: dualpipe_table2 -->" in text
    assert "dualpipe_two_way.png" in _load("make_figures").FIGURES
    section = _text(BEYOND).split("## DualPipe: two directions")[1].split("## ")[0]
    assert "DeepSeek-AI's report" in section and "Sea AI Lab" in section and "Two copies of the parameters" in section


def test_table_2_is_exact_in_turn_at_the_page_s_costs_and_not_at_equal_ones(two_way: ModuleType) -> None:
    """What the page says of its table: the first three costs match the report with pairs in turn, equal costs do
    not (the simulator idles), and sharing the device never idles less and often more (half the rows or more)."""
    rows = two_way.bubble_rows()
    longer = 0
    for _, costs, table2, turn, paired in rows:
        if costs == (1.0, 1.0, 1.0):
            assert table2 == 0 < turn
        else:
            assert turn == pytest.approx(table2)
        assert paired >= turn - 1e-9
        longer += paired > turn + 1e-9
    assert longer >= len(rows) / 2


def test_the_gantt_gives_both_schedules_the_same_work(two_way: ModuleType) -> None:
    """DualPipe's slots are whole stages of one copy, DualPipe-V's half stages: each device computes the same
    seconds, so the makespans compare the orders, as on the rest of the page (``teaching_numbers.beyond_cost``)."""
    runs = two_way.gantt_runs()
    busy = [[tl.busy(d) for d in range(two_way.P)] for _, _, tl in runs]
    assert busy[0] == pytest.approx(busy[1])
    assert busy[0] == pytest.approx([two_way.M * sum(two_way.COSTS)] * two_way.P)
    beyond = {name: tl for name, _, tl in _load("figures.beyond_1f1b").beyond_schedules()}
    assert beyond["dualpipe"].busy(0) == pytest.approx(beyond["1f1b"].busy(0))
