"""The page "FP8 training" (docs/concepts/fp8.md): the planner's step splits into the linear products, the casts and
a rest priced as under BF16; Amdahl's law over those parts is the planner's speedup, under its bounds; the memory
table is the planner's policies; and the page states the numbers docs/fp8_numbers.py computes."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "concepts" / "fp8.md"
POLICIES = ("bf16-adam", "fp8-adam")


@pytest.fixture(scope="module")
def fp8() -> ModuleType:
    return _load("fp8_numbers")


def _page() -> str:
    return " ".join(PAGE.read_text(encoding="utf-8").split())  # a phrase may wrap anywhere


def test_the_page_states_the_numbers(fp8: ModuleType) -> None:
    missing = {k: v for k, v in fp8.page_numbers().items() if v not in _page()}
    assert not missing, f"the page does not state these numbers: {missing}"
    assert "img/generated/fp8_parts.png" in PAGE.read_text(encoding="utf-8")
    assert "fp8_parts.png" in _load("make_figures").FIGURES


def test_the_parts_are_the_planner_s_step_and_only_products_and_casts_change(fp8: ModuleType) -> None:
    parts = fp8.step_parts()
    for policy in POLICIES:
        assert sum(parts[policy].values()) == pytest.approx(fp8.plan_row(policy).step_seconds, rel=1e-12)
    bf16, fp8_parts = parts["bf16-adam"], parts["fp8-adam"]
    assert bf16["casts"] == 0 < fp8_parts["casts"]
    assert fp8_parts["rest"] == pytest.approx(bf16["rest"], rel=1e-12)  # everything else as under BF16
    assert fp8_parts["products"] < bf16["products"]


def test_amdahls_law_is_the_planner_s_speedup_under_its_bounds(fp8: ModuleType) -> None:
    x = fp8.terms()
    speedup = fp8.plan_row("bf16-adam").step_seconds / fp8.plan_row("fp8-adam").step_seconds
    assert fp8.amdahl(**x) == pytest.approx(speedup, rel=1e-12)
    ratio = fp8.rate_ratio(fp8.ROW["device"])
    assert x["r"] <= ratio * (1 + 1e-12)  # no product gains more than a large GEMM's rates allow
    assert speedup < fp8.amdahl_bound(x["f"], ratio) < fp8.amdahl_bound(x["f"], 2)
    assert 1 < speedup < 2


def test_the_memory_table_is_the_planner_s_policies(fp8: ModuleType) -> None:
    """The table's columns are each policy's bytes per parameter, and FP8's model state is BF16's plus 2 bytes for
    every parameter."""
    from sim.planning.counting.training import training_policy

    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] and not cells[0].startswith(":"):
            rows[cells[0]] = cells[1:]
    total = rows.pop("model state, bytes per parameter")

    def column(k: int) -> int:
        return sum(eval(r[k].replace(" ", "") or "0", {"__builtins__": {}}) for r in rows.values())  # noqa: S307

    for k, name in enumerate(POLICIES):
        policy = training_policy(name)
        assert column(k) == int(total[k]) == policy.model_state_bytes_per_parameter
    assert int(rows["FP32 master weights"][1]) == 4 and int(rows["Adam's two FP32 moments"][1]) == 8
    assert rows["FP8 weight and its transpose"][1] == "1 + 1" and training_policy("fp8-adam").fp8_weight_bytes == 2
    parameters = sum(x.parameters for x in fp8._profile().layers)
    bf16, fp8_row = (fp8.plan_row(p) for p in POLICIES)
    assert fp8_row.model_state_bytes[0] - bf16.model_state_bytes[0] == 2 * parameters
    grown = fp8_row.peak_memory_bytes - bf16.peak_memory_bytes  # less the Linears' inputs kept in FP8 (Note [fp8
    kept = fp8_row.activation_bytes[0] - bf16.activation_bytes[0]  # saved] in sim.planning.counting.saved)
    assert kept < 0 and grown == pytest.approx(2 * parameters + kept, rel=1e-3)


def test_the_page_is_in_the_nav_and_linked() -> None:
    assert "      - FP8 training: concepts/fp8.md\n" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for source, link in (("cheat-sheet.md", "(concepts/fp8.md)"), ("concepts/cluster.md", "(fp8.md)")):
        assert link in (ROOT / "docs" / source).read_text(encoding="utf-8"), source
    assert re.search(r"#what-fp8-buys\)", PAGE.read_text(encoding="utf-8"))
