"""The page "When communication is exposed" (docs/concepts/exposed-communication.md): each parallelism's inequality
agrees with the simulator or the planner, and the page states the numbers docs/exposure_numbers.py computes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from gpipe.schedule import gpipe, one_f_one_b
from sim.core.cost import CostModel
from sim.core.engine import simulate
from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "concepts" / "exposed-communication.md"


@pytest.fixture(scope="module")
def en() -> ModuleType:
    return _load("exposure_numbers")


def _page() -> str:
    return " ".join(PAGE.read_text(encoding="utf-8").split())  # a phrase may wrap anywhere


def test_the_page_states_the_numbers(en: ModuleType) -> None:
    common = _load("figures.common")
    missing = {k: v for k, v in en.page_numbers(common.simulate).items() if v not in _page()}
    assert not missing, f"the page does not state these numbers: {missing}"
    assert "<!-- generated: exposure_thresholds -->" in PAGE.read_text(encoding="utf-8")
    assert "img/generated/exposure_buckets.png" in PAGE.read_text(encoding="utf-8")
    assert "exposure_buckets.png" in _load("make_figures").FIGURES


def test_tensor_parallel_collectives_outlast_the_gemms_below_the_smallest_hidden_size(en: ModuleType) -> None:
    """The planner's layer at GPT-3 175B's width: its collectives cost their ring bytes over the link, so they
    exceed its compute exactly where ``h < (t − 1) · P / (3 W)`` at the rate its compute reaches."""
    from sim.planning.hardware.catalog import get_link

    cn = _load("cluster_numbers")
    s, h, _, _ = cn._shape()
    for t in (2, 4, 8):
        for name in ("nvlink3", "infiniband-hdr"):
            link = get_link(name)
            compute, collectives, sent = cn.layer_traffic(t, name)
            rate = 24 * s * h * h / t / compute  # the GEMMs' FLOPs over the layer's seconds: the P it reaches
            assert collectives == pytest.approx(sent / link.bandwidth + 4 * (t - 1) * link.latency)
            assert (collectives > compute) == (h < en.tp_min_hidden(t, rate, link.bandwidth)), (t, name)
    compute, nvlink, _ = cn.layer_traffic(8, "nvlink3")
    hdr = cn.layer_traffic(8, "infiniband-hdr")[1]
    assert nvlink < compute < hdr  # hidden inside a node, exposed across nodes, as the page says
    for value in (compute, nvlink, hdr):
        assert f"{value * 1e3:.2f} ms" in _page()


@pytest.mark.parametrize(("buckets", "reduce", "backward"), [(4, 0.4, 2.0), (4, 0.5, 2.0), (4, 0.8, 2.0),
                                                              (8, 0.5, 2.0), (1, 0.3, 1.0)])
@pytest.mark.parametrize("m", [1, 3])
def test_bucketed_all_reduces_expose_what_the_closed_form_says(en: ModuleType, buckets: int, reduce: float,
                                                               backward: float, m: int) -> None:
    """Only the last micro-batch's backward hides the buckets (DDP's no_sync): the exposure does not depend on m."""
    tl = simulate(gpipe(m, 1, "never"), en.bucket_cost(1.0, backward, reduce, buckets))
    compute = max(s.end for s in tl.compute_spans(0))
    assert compute == pytest.approx(m * (1.0 + backward))
    assert tl.makespan - compute == pytest.approx(en.bucket_exposed(buckets, reduce, backward))
    assert sum(s.stream == "collective" for s in tl.spans) == buckets
    hidden = reduce <= backward / buckets  # the inequality, per bucket
    assert (tl.makespan - compute == pytest.approx(reduce)) == hidden


def test_the_data_parallel_example_sits_on_either_side_of_the_threshold(en: ModuleType) -> None:
    from sim.planning.hardware.catalog import get_device, get_link

    common = _load("figures.common")
    flops = get_device(en.DP["device"]).peak_flops["bf16"]
    threshold = en.dp_min_tokens(en.DP["replicas"], flops, get_link(en.DP["link"]).bandwidth)
    runs = en.dp_runs(common.simulate)
    reduce = en._dp_example()["reduce"]
    for tokens, _, exposed in runs:
        assert (exposed == pytest.approx(reduce)) == (tokens >= threshold), tokens
    assert [tokens >= threshold for tokens, _, _ in runs] == [True, False]


@pytest.mark.parametrize(("units", "gather"), [(4, 0.2), (4, 0.25), (4, 0.4), (2, 0.9)])
def test_fsdp_prefetch_hides_every_gather_but_the_first_while_it_fits(en: ModuleType, units: int,
                                                                      gather: float) -> None:
    tl = simulate(gpipe(1, 1, "never"), en.fsdp_cost(1.0, 2.0, gather, units))
    forward = next(s for s in tl.compute_spans(0) if s.task.op.value == "F")
    assert forward.end == pytest.approx(en.fsdp_forward(units, gather, 1.0))
    assert (forward.end == pytest.approx(gather + 1.0)) == (gather <= 1.0 / units)


@pytest.mark.parametrize("copy", [0.25e-3, 0.5e-3, 1e-3, 1.5e-3])
def test_pipeline_sends_hide_while_a_copy_fits_in_a_forward(copy: float) -> None:
    m, p, forward, backward = 8, 4, 1e-3, 2e-3
    tl = simulate(gpipe(m, p, "never"), CostModel.uniform(p, forward, backward, copy_seconds=copy))
    closed = (m + p - 1) * (forward + backward) + 2 * (p - 1) * copy
    assert (tl.makespan == pytest.approx(closed)) == (copy <= forward)
    assert tl.makespan >= closed - 1e-12


def test_the_pipeline_threshold_is_the_send_against_a_stage_forward(en: ModuleType) -> None:
    from sim.planning.hardware.catalog import get_device, get_link

    flops, w = get_device("a100-80gb").peak_flops["bf16"], get_link("infiniband-hdr").bandwidth
    b, s = 1, 2048
    for layers, h in ((1, 1024), (1, 1056), (12, 12288)):
        send, forward = 2 * b * s * h / w, 24 * b * s * h * h * layers / flops
        assert (send <= forward) == (layers * h >= en.pipeline_min_width(flops, w))


@pytest.mark.parametrize(("stages", "bubble"), [(8, 0.1), (16, 0.1), (4, 0.05)])
def test_the_batch_budget_is_the_simulated_bubble(en: ModuleType, stages: int, bubble: float) -> None:
    m, d = en.budget(1536, 1, stages, bubble)
    cost = CostModel.uniform(stages, 1e-3, 2e-3)
    assert simulate(one_f_one_b(m, stages, "never"), cost).bubble_fraction() <= bubble + 1e-12
    assert simulate(one_f_one_b(m - 1, stages, "never"), cost).bubble_fraction() > bubble
    assert d * m <= 1536 < (d + 1) * m


def test_the_planner_splits_the_batch_as_m_b_d() -> None:
    """Every row the planner sweeps runs m = B / (b · d) micro-batches."""
    from sim.planning.counting.flops import count_layers
    from sim.planning.counting.models import get_model
    from sim.planning.hardware.catalog import get_device
    from sim.planning.plan import PlanRequest, default_training, plan

    device = get_device("a100-80gb")
    training, model = default_training(device), get_model("gpt:125m")
    profile = count_layers(model.module("meta"), model.sample(1, "meta"), dtype=training.torch_dtype)
    result = plan(PlanRequest(profile=profile, device=device, link="nvlink", training=training, batch=64, gpus=[8],
                              model_name=model.name, schedules=["1f1b"], checkpoints=["never"]))
    assert {r.replicas for r in result.rows} == {1, 2, 4, 8}
    assert all(r.chunks * r.microbatch * r.replicas == 64 for r in result.rows)


def test_past_the_critical_batch_doubling_buys_few_steps(en: ModuleType) -> None:
    assert en.steps_ratio(1.0, 1.0) == pytest.approx(4 / 3)
    assert en.steps_ratio(1e-6, 1.0) == pytest.approx(2, rel=1e-5)  # far below: twice the batch, half the steps
    assert en.steps_ratio(1e6, 1.0) == pytest.approx(1, rel=1e-5)  # far above: nothing


def test_the_page_is_in_the_nav_and_linked() -> None:
    assert "      - When communication is exposed: concepts/exposed-communication.md\n" in (
        ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for source, link in (("cheat-sheet.md", "concepts/exposed-communication.md"),
                         ("learner-path.md", "concepts/exposed-communication.md"),
                         ("concepts/parallelism-traffic.md", "(exposed-communication.md)")):
        assert link in (ROOT / "docs" / source).read_text(encoding="utf-8"), source
