"""Context parallelism (:mod:`sim.planning.parallel.context_parallel`): one rank's count, its key/value traffic in
closed form, where its groups sit, and the planner's rows and refusals."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch

from sim.cli import main
from sim.core.link import LinkSpec
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.models import get_model
from sim.planning.parallel.cluster import Cluster
from sim.planning.parallel.context_parallel import (
    ContextParallel,
    attention_kernels,
    kv_bytes,
    split_sequence,
    traffic_bytes,
)
from sim.planning.parallel.recompute import layer_saved
from sim.planning.plan import PlanRequest, plan

SEQ, HEADS, KV_HEADS, HIDDEN = 64, 8, 2, 256
SMALL = f"llama:layers=2,hidden={HIDDEN},heads={HEADS},kv-heads={KV_HEADS},ffn=512,seq={SEQ},vocab=1000"
LINK = LinkSpec("test", 1e-6, 100e9)
NIC = LinkSpec("nic", 5e-6, 25e9)


@cache
def _count(t: int = 1, sp: bool = False, spec: str = SMALL) -> ModelProfile:
    return get_model(spec).tensor_parallel(t, sequence_parallel=sp).count(torch.bfloat16)


@pytest.mark.parametrize("t", [1, 2])
def test_kv_bytes_are_the_whole_sequences_keys_and_values(t: int) -> None:
    """Per sample, 2·s·(K/t)·d·e bytes in each block, none elsewhere; each rank sends (c-1)/c of them forward, twice
    that backward (Note [context parallel traffic])."""
    profile = _count(t, t > 1)
    kv = [kv_bytes(x, 2) for x in profile.layers]
    block = 2 * SEQ * (KV_HEADS // t) * (HIDDEN // HEADS) * 2  # K and V, bf16
    assert kv == [0.0, block, block, 0.0]  # embedding, two blocks, head
    assert traffic_bytes(kv[1], 4) == (0.75 * kv[1], 1.5 * kv[1])
    assert traffic_bytes(kv[1], 1) == (0.0, 0.0)


def test_one_rank_does_a_cth_of_the_work_and_keeps_a_cth_of_the_activations() -> None:
    whole, c = _count(2, True), 4
    rank = split_sequence(whole, c)
    assert rank.context_parallel == c and rank.parameters == whole.parameters
    for a, b in zip(whole.layers, rank.layers, strict=True):
        assert b.saved_bytes == (a.saved_bytes[0], a.saved_bytes[1] / c)
        for policy, fp8 in (("never", False), ("never", True), ("modules:layernorm", False)):  # what the planner reads
            fixed, per_sample = layer_saved(a, policy, fp8)
            assert layer_saved(b, policy, fp8) == pytest.approx((fixed, per_sample / c))
        assert b.output_bytes == (a.output_bytes[0], a.output_bytes[1] / c)
        for x, y in ((a.forward, b.forward), (a.backward, b.backward)):
            np.testing.assert_allclose(y.flops_at(3).sum(), x.flops[:, 0].sum() + x.flops[:, 1].sum() * 3 / c)
            mine = attention_kernels(x)
            # causal load balance: the attention kernel's FLOPs over c too
            np.testing.assert_allclose(y.flops_at(1)[mine], x.flops_at(1)[mine] / c)
        assert kv_bytes(b, 2) == kv_bytes(a, 2)  # the kernel still reads every key and value
    assert attention_kernels(whole.layers[1].forward).sum() == 1 == attention_kernels(whole.layers[1].backward).sum()


def test_degree_one_is_the_count_itself() -> None:
    assert split_sequence(_count(), 1) is _count()


def test_traffic_seconds_in_closed_form() -> None:
    kv, c = np.array([0.0, 8e6]), 4
    gather = ContextParallel(c, "all-gather", LINK)
    # K and V one ring each (Note [keys and values apart]): the bytes of one collective of kv, twice the latencies
    step = (c - 1) / c * 8e6 / LINK.bandwidth + 2 * (c - 1) * LINK.latency
    fwd, bwd = gather.seconds(kv, np.ones(2), np.ones(2))  # exposed whatever the attention takes
    np.testing.assert_allclose(fwd, [0.0, step])
    np.testing.assert_allclose(bwd, [0.0, 2 * step])
    ring = ContextParallel(c, "ring", LINK)
    fwd, bwd = ring.seconds(kv, np.zeros(2), np.zeros(2))  # nothing to hide behind
    np.testing.assert_allclose(fwd, [0.0, (c - 1) * (8e6 / c / LINK.bandwidth + LINK.latency)])
    np.testing.assert_allclose(bwd, [0.0, (c - 1) * (2 * 8e6 / c / LINK.bandwidth + LINK.latency)])
    attention = np.array([0.0, 0.01])
    fwd, bwd = ring.seconds(kv, attention, 2.5 * attention)  # a block's attention outlasts its step: all hidden
    assert fwd.tolist() == [0.0, 0.0] and bwd.tolist() == [0.0, 0.0]
    across = ContextParallel(c, "ring", LINK, NIC, 1, 4)  # a ring across nodes runs at the network's pace
    assert across.seconds(kv, np.zeros(2), np.zeros(2))[0][1] == pytest.approx((c - 1) * (2e6 / 25e9 + 5e-6))


@pytest.mark.parametrize("c", [2, 4, 16])
def test_all_gather_latency_is_a_ring_step_per_rank_and_tensor(c: int) -> None:
    """With bytes that cost nothing, what is left is the rings' latency: (c - 1) steps for each of K and V forward,
    and for each of K, V, dK and dV backward; across nodes, one GPU per node, each step on the network."""
    kv, free = np.array([1.0]), LinkSpec("free", 2e-6, 1e30)
    fwd, bwd = ContextParallel(c, "all-gather", free).seconds(kv, np.zeros(1), np.zeros(1))
    assert fwd[0] == pytest.approx(2 * (c - 1) * 2e-6) and bwd[0] == pytest.approx(4 * (c - 1) * 2e-6)
    nic = LinkSpec("free nic", 7e-6, 1e30)
    fwd, bwd = ContextParallel(c, "all-gather", free, nic, 1, c).seconds(kv, np.zeros(1), np.zeros(1))
    assert fwd[0] == pytest.approx(2 * (c - 1) * 7e-6) and bwd[0] == pytest.approx(4 * (c - 1) * 7e-6)


def test_all_gather_across_nodes_is_hierarchical_per_tensor() -> None:
    """Two ranks in each of two nodes: each of K and V gathered over the network (half its bytes, a ring of two
    nodes), then in the node (a ring of two GPUs)."""
    kv = 8e6
    fwd, _ = ContextParallel(4, "all-gather", LINK, NIC, 2, 2).seconds(np.array([kv]), np.zeros(1), np.zeros(1))
    one = kv / 2
    network = 1 / 2 * one / 2 / NIC.bandwidth + NIC.latency
    node = 1 / 2 * one / LINK.bandwidth + LINK.latency
    assert fwd[0] == pytest.approx(2 * (network + node))


def test_groups_on_the_cluster() -> None:
    """Ranks in the order tensor, context, pipeline, data (Note [layout] in sim.planning.parallel.cluster)."""
    cluster = Cluster(LINK, 8, NIC)
    assert cluster.context_group(8, 16) == (1, 16)  # Llama 3: TP fills a node, one rank of a CP group per node
    assert cluster.context_group(2, 4) == (4, 1)
    assert ContextParallel.on(cluster, 2, 1, "ring") is None
    assert ContextParallel.on(cluster, 8, 4, "ring") == ContextParallel(4, "ring", LINK, cluster.nic, 1, 4)
    # gradients reduced over replicas x context ranks: 2 x 4 GPUs of one node, a ring of 8
    assert cluster.allreduce_seconds(1e9, 1, 1, 2, 0, context_parallel=4) == pytest.approx(
        2 * 7 / 8 * 1e9 / LINK.bandwidth + 14 * LINK.latency)
    assert cluster.node(2, 2, 1, 1, 3, 4) == ((1 * 2 + 1) * 4 + 3) * 2 // 8


def _request(**kw: object) -> PlanRequest:
    fields: dict[str, object] = dict(profile={(2, True): _count(2, True)}, batch=8, device="h100-sxm", gpus=[16],
                                     link="nvlink", network="infiniband-ndr", tensor_parallel=[2],
                                     sequence_parallel=[True], stages=[2], schedules=["1f1b"], checkpoints=["never"],
                                     chunks=[2], tokens_per_sample=SEQ, model_name=SMALL)
    return PlanRequest(**(fields | kw))  # type: ignore[arg-type]


def test_degree_one_changes_no_row() -> None:
    today = plan(_request(), workers=1)
    again = plan(_request(context_parallel=[1], cp_comm="all-gather"), workers=1)
    assert today.rows == again.rows and all(r.context_parallel == 1 for r in today.rows)


def test_rows_carry_context_parallel() -> None:
    result = plan(_request(context_parallel=[2], cp_comm="all-gather"), workers=1)
    best = result.to_dict()["best"]
    assert best["context_parallel"] == 2
    assert best["gpus"] == best["tensor_parallel"] * 2 * best["stages"] * best["replicas"] == 16
    ring = plan(_request(context_parallel=[2]), workers=1).best
    assert ring is not None and ring.step_seconds <= result.rows[0].step_seconds  # the ring hides what it can


@pytest.mark.parametrize("kw, message", [
    (dict(context_parallel=[3]), "6 chunks"),
    (dict(context_parallel=[0]), "integers >= 1"),
    (dict(context_parallel=[2], tokens_per_sample=None), "has none"),
    (dict(context_parallel=[2], cp_comm="p2p"), "ring, all-gather"),
    (dict(context_parallel=[16]), "divides none"),
])
def test_request_refuses(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _request(**kw)


@pytest.mark.parametrize("model, cp, message", [
    (SMALL, "3", "into 6 chunks"),
    (SMALL, "0", "integers >= 1"),
    ("unet:1,8", "2", "not one"),
    (SMALL.replace("seq=", "attention=math,seq="), "2", "writes its attention out"),
])
def test_cli_refuses_before_counting(model: str, cp: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", model, "--batch", "8", "--gpus", "8", "--hardware", "h100-sxm",
                 "--context-parallel", cp]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpipe-sim plan: error:") and message in lines[0]
