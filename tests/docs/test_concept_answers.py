"""The concept pages' exercise answers state the project's numbers: memory.md's and micro-batch-size.md's
(docs/teaching_numbers.py, ``answer_numbers``) are on their pages and are the closed forms the answers teach.
The other pages' answers are checked beside their pages' numbers: cluster.md in test_cluster_page.py,
beyond-1f1b.md in test_teaching_numbers.py, memory.md's third and parallelism-traffic.md's second in
test_teaching_fixes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

DOCS = Path(__file__).resolve().parents[2] / "docs"
GiB = 2**30


@pytest.fixture(scope="module")
def numbers() -> dict[str, dict[str, str]]:
    common, tn = _load("figures.common"), _load("teaching_numbers")
    out: dict[str, dict[str, str]] = tn.answer_numbers(common.simulate)
    return out


def test_the_pages_state_the_answers_numbers(numbers: dict[str, dict[str, str]]) -> None:
    for page, texts in numbers.items():
        text = " ".join((DOCS / page).read_text(encoding="utf-8").split())  # a phrase may wrap anywhere
        missing = {k: v for k, v in texts.items() if v not in text}
        assert not missing, f"{page} does not state these numbers: {missing}"


def test_memory_answers_are_model_state_over_stages_and_korthikantis_layers() -> None:
    from sim.planning.counting.models.gpt import gpt_config
    from sim.planning.hardware.catalog import get_device

    common, tn = _load("figures.common"), _load("teaching_numbers")
    c, a100 = gpt_config("13b"), get_device("a100-80gb")
    left = a100.memory_bytes / GiB - 16 * c.parameters / GiB / 8  # GiB for activations on each of 8 stages
    five = c.n_layer // 8 * c.seq_len * c.d_model * (34 + 5 * c.n_head * c.seq_len / c.d_model) / GiB
    assert c.n_layer // 8 == 5 and round(left / five) == 10  # "ten times over"
    assert "ten times over" in (DOCS / "concepts" / "memory.md").read_text(encoding="utf-8")
    rows = {(name, policy): peaks for name, policy, _, peaks in tn.memory_rows(common.simulate)}
    # GPipe under `always`: m inputs of A/8 at the turn, plus one recompute's whole A
    assert max(rows[("gpipe", "always")]) == tn.MEMORY_M * tn.MEMORY_A // 8 + tn.MEMORY_A == 2 * tn.MEMORY_A


def test_a_faster_device_wants_about_twice_the_tokens() -> None:
    from sim.planning.hardware.catalog import get_device

    tn = _load("teaching_numbers")
    ridge = {n: d.peak_flops["bf16"] / d.memory_bandwidth for n in ("a100-80gb", "h100-sxm")
             for d in (get_device(n),)}
    for h in tn.ROOFLINE_WIDTHS[1:]:  # wide enough that the GEMM reaches both ridges
        ratio = tn.min_tokens(h, ridge["h100-sxm"]) / tn.min_tokens(h, ridge["a100-80gb"])
        assert 1.8 < ratio < 2.5, (h, ratio)  # "about twice the tokens"


@pytest.mark.parametrize("s", [2048, 8192, 131072])
def test_q_k_transpose_stays_below_d_and_the_a100_ridge(s: int) -> None:
    from sim.planning.hardware.catalog import get_device

    a100, d = get_device("a100-80gb"), 128
    intensity = 2 * s * s * d / (2 * (2 * s * d + s * s))  # FLOPs over 16-bit bytes of Q, K and the s x s scores
    assert intensity < d < a100.peak_flops["bf16"] / a100.memory_bandwidth
