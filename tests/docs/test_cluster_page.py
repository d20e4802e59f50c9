"""The page "Pipeline parallelism in a cluster" (docs/concepts/cluster.md) states the planner's numbers, and they are
the closed forms it teaches: Korthikanti et al.'s bytes per layer, four ring collectives per layer forward, ZeRO's
model state per stage, memory falling and time rising with the tensor-parallel degree."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "concepts" / "cluster.md"


@pytest.fixture(scope="module")
def cn() -> ModuleType:
    return _load("cluster_numbers")


def _shape(cn: ModuleType) -> tuple[int, int, int, int]:
    return cn._shape()


@pytest.mark.parametrize("t", [1, 2, 4, 8, 16])
def test_saved_bytes_per_layer_are_korthikantis_plus_the_norms_statistics(cn: ModuleType, t: int) -> None:
    s, h, a, _ = _shape(cn)
    for sp in (False, True) if t > 1 else (False,):
        stats = 16 * s / t if sp else 16 * s  # two LayerNorms' fp32 mean and 1/std per token on this rank
        whole, counted = cn.saved_per_layer(t, sp, selective=False)
        assert whole == (s * h / t * (34 + 5 * a * s / h) if sp else s * h * (10 + 24 / t + 5 * a * s / (h * t)))
        assert counted == whole + stats
        kept, counted = cn.saved_per_layer(t, sp, selective=True)
        assert kept == (34 * s * h / t if sp else s * h * (10 + 24 / t))
        assert counted == kept + stats


@pytest.mark.parametrize("t", [2, 4, 8, 16])
def test_a_layers_forward_runs_four_ring_collectives(cn: ModuleType, t: int) -> None:
    """With sequence parallelism: two all-gathers and two reduce-scatters of ``2bsh`` bytes, each
    ``(t - 1)/t · bytes / bandwidth + (t - 1) · latency`` on its link."""
    from sim.core.rings import reduce_scatter_seconds
    from sim.planning.hardware.catalog import get_link

    s, h, _, _ = _shape(cn)
    message = 2 * s * h  # one sample, bf16
    for link in ("nvlink3", "infiniband-hdr"):
        compute, collectives, sent = cn.layer_traffic(t, link)
        assert collectives == pytest.approx(4 * reduce_scatter_seconds(message, t, get_link(link)))
        assert sent == 4 * (t - 1) / t * message
        assert compute > 0
    compute = cn.layer_traffic(t, "nvlink3")[0]
    assert cn.layer_traffic(t, "infiniband-hdr")[0] == pytest.approx(compute, rel=1e-12)  # a link moves bytes only


@pytest.mark.slow
def test_memory_falls_and_the_network_costs_time_as_the_page_says(cn: ModuleType) -> None:
    from sim.planning.counting.models.gpt import gpt_config

    sweep = cn.tensor_sweep()
    s, h, _, layers = _shape(cn)
    for checkpoint in cn.SWEEP["checkpoints"]:
        peaks = [cn._row(sweep["inside"][t], checkpoint, t > 1).peak_memory_bytes for t in cn.DEGREES]
        assert peaks == sorted(peaks, reverse=True), (checkpoint, peaks)
    assert not cn._row(sweep["inside"][1], "selective", False).fits
    assert not cn._row(sweep["inside"][4], "selective", False).fits and cn._row(sweep["inside"][4], "selective",
                                                                                 True).fits
    for t in cn.DEGREES[1:]:  # the same configuration is slower with its collectives on the network
        for r in sweep["inside"][t]:
            if r.fits and t <= cn.SWEEP["gpus_per_node"]:
                twin = cn._row(sweep["across"][t], r.checkpoint, r.sequence_parallel)
                assert twin.step_seconds > r.step_seconds and twin.peak_memory_bytes == r.peak_memory_bytes
    assert sweep["inside"][16] == sweep["across"][16]  # Note [a ring at its slowest hop]
    state = 16 * gpt_config("175b").parameters / cn.SWEEP["gpus"]
    for t in cn.DEGREES[2:]:  # the page's estimate: model state and L layers' activations, the planner a little more
        estimate = state + layers * 34 * s * h / t
        assert estimate < cn._row(sweep["inside"][t], "selective", True).peak_memory_bytes < 1.1 * estimate


def test_zero_divides_the_model_state_as_its_table(cn: ModuleType) -> None:
    rows = {r.zero: r for r in cn.zero_plan().rows}
    d = cn.ZERO["replicas"]
    p = rows[0].memory_parts[0].gradients / 2  # the first device's parameters (bf16 gradients)
    assert rows[0].memory_parts[0].optimizer == 8 * p  # Adam's two fp32 moments; the fp32 master is a parameter
    expected = {0: 16 * p, 1: 4 * p + 12 * p / d, 2: 2 * p + 14 * p / d, 3: 16 * p / d}
    extra = rows[0].model_state_bytes[0] - 16 * p  # buffers, never sharded
    for zero, state in expected.items():
        assert rows[zero].model_state_bytes[0] == pytest.approx(state + extra, abs=64), zero
    assert cn._zero_sent(rows[0], p) == pytest.approx(cn._zero_sent(rows[1], p))  # RS + AG = AR
    assert cn._zero_sent(rows[3], p) == pytest.approx(3 * cn.ZERO["chunks"] / 2 * cn._zero_sent(rows[0], p))
    assert rows[1].step_seconds <= rows[0].step_seconds < rows[3].step_seconds


def test_the_page_states_the_planner_s_numbers(cn: ModuleType) -> None:
    page = PAGE.read_text()
    missing = {k: v for k, v in cn.page_numbers().items() if v not in page}
    assert not missing, f"the page does not state these numbers: {missing}"


def test_the_page_is_in_the_nav_and_linked() -> None:
    mf = _load("make_figures")
    page = PAGE.read_text()
    markers = set(re.findall(r"<!--\s*generated:\s*(\w+)\s*-->", page))
    assert markers == {"cluster_links", "cluster_memory_per_layer", "cluster_layer_traffic", "cluster_sweep_table",
                       "cluster_zero_table"}
    assert "img/generated/cluster_tensor_parallel.png" in page and "cluster_tensor_parallel.png" in mf.FIGURES
    assert "Pipeline parallelism in a cluster: concepts/cluster.md" in (ROOT / "mkdocs.yml").read_text()
    for source, link in (("how-to/plan-large-model.md", "../concepts/cluster.md"),
                         ("concepts/parallelism-traffic.md", "(cluster.md)")):
        assert link in (ROOT / "docs" / source).read_text(), source
