"""The page "Context parallelism" (docs/concepts/context-parallelism.md): its formulas are the planner's (the count's
keys and values, ``traffic_bytes``, the ring's and the all-gather's seconds), its balanced chunks are the causal
mask's, and it states the numbers docs/cp_numbers.py computes."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "concepts" / "context-parallelism.md"


@pytest.fixture(scope="module")
def cp() -> ModuleType:
    return _load("cp_numbers")


def _page() -> str:
    return " ".join(PAGE.read_text(encoding="utf-8").split())  # a phrase may wrap anywhere


def test_the_page_states_the_numbers(cp: ModuleType) -> None:
    missing = {k: v for k, v in cp.page_numbers(row=False).items() if v not in _page()}
    assert not missing, f"the page does not state these numbers: {missing}"
    text = PAGE.read_text(encoding="utf-8")
    assert "img/generated/cp_ring.png" in text and "cp_ring.png" in _load("make_figures").FIGURES


@pytest.mark.slow
def test_the_page_states_the_planners_128k_row_for_the_command_it_shows(cp: ModuleType) -> None:
    """The page's command is :data:`COMMAND`, and the row it plans is the page's."""
    shown = re.search(r"```bash\n\.venv/bin/gpipe-sim (.*?)\n```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    assert shown is not None
    assert shown.group(1).replace("\\\n", " ").split() == cp.COMMAND
    best = cp.llama_row()
    assert (best["tensor_parallel"], best["context_parallel"], best["stages"], best["replicas"]) == (8, 16, 16, 8)
    numbers = cp.page_numbers()
    missing = {k: numbers[k] for k in ("row", "row step", "above") if numbers[k] not in _page()}
    assert not missing, f"the page does not state these numbers: {missing}"


@pytest.mark.parametrize("c", [1, 2, 4, 16])
def test_balanced_chunks_give_every_rank_the_same_causal_work(cp: ModuleType, c: int) -> None:
    """Token by token under the causal mask: rank i's chunks i and 2c − 1 − i hold the same (query, key) pairs on
    every rank; one contiguous chunk a rank leaves the last with (2c − 1)/c of the mean, as the unit count says."""
    tokens = 2 * c * 8
    seen = np.arange(1, tokens + 1)  # keys each query sees, itself included
    halves = seen.reshape(2 * c, -1).sum(axis=1)
    balanced = [int(halves[i] + halves[j]) for i, j in cp.chunks(c)]
    assert len(set(balanced)) == 1 and sorted(k for pair in cp.chunks(c) for k in pair) == list(range(2 * c))
    assert len(set(cp.causal_work(c))) == 1
    contiguous = seen.reshape(c, -1).sum(axis=1)
    units = cp.causal_work(c, balanced=False)
    assert max(units) / np.mean(units) == pytest.approx((2 * c - 1) / c)
    assert max(contiguous) / np.mean(contiguous) == pytest.approx(max(units) / np.mean(units), rel=0.1)


@pytest.mark.parametrize(("heads", "kv_heads", "t"), [(16, 4, 1), (16, 4, 2), (16, 16, 4), (128, 8, 8)])
def test_the_keys_and_values_are_the_formula(cp: ModuleType, heads: int, kv_heads: int, t: int) -> None:
    """``kv_bytes`` of the count (what the attention kernel reads, less the queries and the output) is
    ``2·s·b·(K/t)·d·e`` bytes, and ``traffic_bytes`` sends ``(c − 1)/c`` of it forward and twice that backward."""
    import torch

    from sim.planning.counting.models import get_model
    from sim.planning.parallel.context_parallel import kv_bytes, traffic_bytes

    s, hidden = 4096, 64 * heads
    spec = f"llama:layers=1,hidden={hidden},heads={heads},kv-heads={kv_heads},ffn={4 * hidden},seq={s},vocab=1024"
    profile = get_model(spec).tensor_parallel(t, sequence_parallel=t > 1).count(torch.bfloat16)
    kv = cp.kv_formula(s, 1, kv_heads, t, hidden // heads, 2)
    assert kv_bytes(profile.layers[1], 2) == kv
    for c in (2, 4, 16):
        assert traffic_bytes(kv, c) == pytest.approx(((c - 1) / c * kv, 2 * (c - 1) / c * kv))


@pytest.mark.parametrize("seq", [4096, 8192, 16384, 131072])
def test_the_ring_is_exposed_exactly_where_the_inequality_fails(cp: ModuleType, seq: int) -> None:
    """The planner's ring: hidden when ``kv/(c·W) + α ≤ A/c``, otherwise ``(c − 1)`` steps of the difference; the
    rank's attention computes ``2·b·s²·(a/t)·d/c`` FLOPs, which gives the tokens-per-rank form without latency."""
    from sim.planning.hardware.catalog import get_link
    from sim.planning.parallel.context_parallel import attention_kernels, split_sequence

    nic, c, t = get_link(cp.CP["network"]), cp.CP["degree"], cp.CP["tensor"]
    ring = cp.layer_costs(seq, c, "ring")
    step, block = cp.ring_step(ring["kv"], c, nic.bandwidth, nic.latency), ring["attention_forward"] / c
    assert ring["exposed_forward"] == pytest.approx((c - 1) * max(0.0, step - block), abs=1e-12)
    assert (ring["exposed_forward"] == 0) == (step <= block)
    table = split_sequence(cp._count(seq), c).layers[1].forward
    flops = table.flops[attention_kernels(table)].sum()
    assert flops == pytest.approx(2 * seq**2 * (cp.LLAMA["heads"] / t) * cp.LLAMA["d"] / c, rel=1e-3)
    rate = cp.attention_rate(seq, c)
    without_latency = step - nic.latency <= block
    heads, kv_heads = cp.LLAMA["heads"], cp.LLAMA["kv_heads"]
    assert without_latency == (seq / c >= cp.ring_min_tokens(kv_heads, heads, 2, rate, nic.bandwidth))
    if ring["exposed_forward"] == 0:  # the backward: twice the bytes against 2.5 times the attention
        assert ring["exposed_backward"] == 0


@pytest.mark.parametrize("seq", [8192, 131072])
def test_the_all_gather_waits_for_its_bytes_and_two_latencies_a_step(cp: ModuleType, seq: int) -> None:
    from sim.planning.hardware.catalog import get_link

    nic, c = get_link(cp.CP["network"]), cp.CP["degree"]
    gather = cp.layer_costs(seq, c, "all-gather")
    forward = cp.allgather_forward(gather["kv"], c, nic.bandwidth, nic.latency)
    assert gather["exposed_forward"] == pytest.approx(forward)
    assert gather["exposed_backward"] == pytest.approx(2 * forward)  # gathers again, reduce-scatters dK and dV


def test_the_page_is_in_the_nav_and_linked() -> None:
    assert "      - Context parallelism: concepts/context-parallelism.md\n" in (ROOT / "mkdocs.yml").read_text(
        encoding="utf-8")
    for source, link in (("cheat-sheet.md", "(concepts/context-parallelism.md)"),
                         ("concepts/cluster.md", "(context-parallelism.md)")):
        assert link in (ROOT / "docs" / source).read_text(encoding="utf-8"), source
