"""Expert parallelism: the all-to-all's closed forms (flat and DeepSeek-V3's two hops), the folding of expert groups
onto a stage's GPUs and where they sit on nodes, the refusals, the all-to-all's seconds as a stage's communication
(not compute) and the model state sharded over the expert-data-parallel group."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim.core.link import LinkSpec
from sim.core.rings import all_to_all_seconds, node_limited_all_to_all_seconds
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import ALL_TO_ALL, COLLECTIVE, LayerProfile, ModelProfile, OpTable
from sim.planning.counting.training import training_policy
from sim.planning.hardware.catalog import get_device
from sim.planning.parallel.cluster import Cluster
from sim.planning.parallel.experts import (
    FP8_DISPATCH,
    ExpertParallel,
    Routing,
    all_to_all_bytes,
    check_experts,
    check_fold,
    dispatch_buffer_bytes,
    expert_data_group,
    folds,
    sharded_state_of_experts,
)
from sim.planning.parallel.zero import sharded_state

LINK = LinkSpec("in-node", 1e-6, 200e9)
PORT = LinkSpec("port", 5e-6, 50e9)
DEEPSEEK = Routing(256, 8, 4)  # DeepSeek-V3: 256 routed experts, 8 a token, at most 4 nodes (arXiv 2412.19437)


# -- the all-to-all ----------------------------------------------------------------------------------------------


def test_an_all_to_all_in_one_node_sends_all_but_its_own_share() -> None:
    nbytes, r = 8e9, 8
    assert all_to_all_seconds(nbytes, r, LINK) == pytest.approx((r - 1) / r * nbytes / LINK.bandwidth + LINK.latency)
    assert all_to_all_seconds(nbytes, 1, LINK) == 0.0
    assert all_to_all_seconds(0.0, r, LINK) == 0.0


def test_an_all_to_all_across_nodes_waits_for_the_slower_of_nvlink_and_the_network() -> None:
    nbytes, r, g = 64e6, 64, 8
    nvlink = (g - 1) / r * nbytes / LINK.bandwidth + LINK.latency
    network = (r - g) / r * nbytes / PORT.bandwidth + PORT.latency
    assert all_to_all_seconds(nbytes, r, LINK, g, PORT) == pytest.approx(max(nvlink, network))
    assert all_to_all_seconds(nbytes, r, LINK, 1, PORT) == pytest.approx((r - 1) / r * nbytes / PORT.bandwidth
                                                                         + PORT.latency)
    with pytest.raises(ValueError, match="needs the network"):
        all_to_all_seconds(nbytes, r, LINK, g)
    with pytest.raises(ValueError, match="cannot have 9 in one node"):
        all_to_all_seconds(nbytes, 8, LINK, 9, PORT)


def test_node_limited_routing_crosses_the_network_once_per_target_node() -> None:
    nbytes, g, n, k, m = 64e6, 8, 8, 8, 4
    across = m * (n - 1) / (n * k) * nbytes / PORT.bandwidth + PORT.latency
    forward = (g - 1) / g * nbytes / LINK.bandwidth + LINK.latency
    two_hops = node_limited_all_to_all_seconds(nbytes, g, n, LINK, PORT, k, m)
    assert two_hops == pytest.approx(max(across, forward))
    # DeepSeek-V3's layout: the network carries 7/16 of the message in two hops, 7/8 flat
    flat = all_to_all_seconds(nbytes, g * n, LINK, g, PORT)
    assert flat - PORT.latency == pytest.approx(2 * (two_hops - PORT.latency))
    # a limit above the nodes or the experts a token has is no limit
    assert node_limited_all_to_all_seconds(nbytes, g, n, LINK, PORT, 2, 8) == \
        node_limited_all_to_all_seconds(nbytes, g, n, LINK, PORT, 2, 2)
    assert node_limited_all_to_all_seconds(nbytes, g, 1, LINK, PORT, k, m) == all_to_all_seconds(nbytes, g, LINK)
    with pytest.raises(ValueError, match="M >= 1"):
        node_limited_all_to_all_seconds(nbytes, g, n, LINK, PORT, k, 0)


def test_the_all_to_all_bytes_are_tokens_times_k_times_hidden() -> None:
    # DeepSeek-V3: one 4096-token sample, k = 8, hidden 7168, BF16
    assert all_to_all_bytes(4096, 8, 7168, 2) == 4096 * 8 * 7168 * 2


# -- the layout --------------------------------------------------------------------------------------------------


def test_expert_groups_fold_onto_a_stages_gpus() -> None:
    assert folds(1, 1, 128, 64, 1) and expert_data_group(1, 1, 128, 64, 1) == 2  # DeepSeek-V3's stage
    assert folds(8, 1, 4, 8, 4) and expert_data_group(8, 1, 4, 8, 4) == 1
    assert not folds(2, 1, 3, 4, 1)


@pytest.mark.parametrize(("etp", "ep", "inside", "nodes"), [
    (1, 8, 8, 1),  # a node
    (1, 64, 8, 8),  # DeepSeek-V3: EP 64 over 8 nodes
    (2, 8, 4, 2),  # ranks two GPUs apart
    (1, 4, 4, 1),
])
def test_an_expert_group_sits_on_consecutive_gpus(etp: int, ep: int, inside: int, nodes: int) -> None:
    assert Cluster(LINK, 8, PORT).expert_group(etp, ep) == (inside, nodes)


def test_an_moe_layout_puts_the_replicas_of_a_stage_together() -> None:
    # 2 stages x 16 replicas, one GPU each: Megatron-Core's order puts a stage's 16 GPUs on 2 nodes
    megatron, ours = Cluster(LINK, 8, PORT, data_inside=True), Cluster(LINK, 8, PORT)
    assert {megatron.node(1, 2, r, 0, replicas=16) for r in range(16)} == {0, 1}
    assert len({ours.node(1, 2, r, 0, replicas=16) for r in range(16)}) == 4
    assert megatron.stage_links((0, 1), 1, 2, 16) == (megatron.nic, LINK)  # the copy to stage 1 crosses nodes
    assert ours.stage_links((0, 1), 1, 2, 16) is None  # each replica's two stages share a node


# -- the refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    ((DEEPSEEK, [3], [1], 1.0), "expert parallel 3 does not divide the model's 256 routed experts"),
    ((DEEPSEEK, [0], [1], 1.0), "expert parallel degrees are integers >= 1"),
    ((DEEPSEEK, [8], [0], 1.0), "expert tensor parallel degrees are integers >= 1"),
    ((DEEPSEEK, [8], [1], 0.9), "a number >= 1, got 0.9"),
    ((DEEPSEEK, [8], [1], float("nan")), "a number >= 1"),
    ((None, [8], [1], 1.0), "this model has none"),
])
def test_bad_expert_parallelism_is_refused_in_one_line(args: tuple, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=message) as error:
        check_experts(*args)
    assert "\n" not in str(error.value)


def test_routing_is_checked_when_built() -> None:
    with pytest.raises(ValueError, match="k = 9 experts, more than the 8"):
        Routing(8, 9)
    with pytest.raises(ValueError, match="node limit"):
        Routing(8, 2, 0)


def test_an_expert_group_that_folds_onto_no_stage_is_refused() -> None:
    check_fold([2048], [16], [64], [1])
    with pytest.raises(ValueError, match="does not fold onto the GPUs of a stage of 64 GPUs in pipelines of 8"):
        check_fold([64], [8], [16], [1])


# -- pricing -----------------------------------------------------------------------------------------------------


def _table(marker_bytes: float, *, compute: float = 1e12) -> OpTable:
    """A GEMM and the two all-to-alls of a MoE layer, ``marker_bytes`` per sample each."""
    return OpTable(flops=np.array([[0.0, compute], [0.0, 0.0], [0.0, 0.0]]),
                   bytes=np.array([[0.0, 1e6], [0.0, marker_bytes], [0.0, marker_bytes]]),
                   kinds=np.array([1, COLLECTIVE, COLLECTIVE], dtype=np.int8),
                   collectives=np.array([0, ALL_TO_ALL, ALL_TO_ALL], dtype=np.int8))


def _profile(marker_bytes: float, ep: int) -> ModelProfile:
    layer = LayerProfile("0", "Block", _table(marker_bytes), _table(marker_bytes), (0, 1e6), (0, 1e6), (0, 1e6),
                         (0, 0), 1000, 2000, 2, expert_parameters=600)
    return ModelProfile((layer, layer), torch.bfloat16, expert_parallel=ep)


def test_the_all_to_all_is_a_stages_communication_not_its_compute() -> None:
    device, nbytes = get_device("h800"), 64e6
    cluster = Cluster(LINK, 8, PORT, data_inside=True)
    experts = ExpertParallel.on(cluster, 64, 1, DEEPSEEK)
    moe = FlopCosts(_profile(nbytes, 64), device, "bf16-adam", experts=experts)
    dense = FlopCosts(_profile(0.0, 1), device, "bf16-adam")
    one = node_limited_all_to_all_seconds(nbytes, 8, 8, LINK, cluster.nic, 8, 4)  # type: ignore[arg-type]
    (stage,) = moe.stages([2], 1)
    assert stage.communication == pytest.approx(2 * 2 * one)  # two layers, dispatch and combine
    assert stage.communication_bytes == 2 * 2 * nbytes
    assert stage.forward == pytest.approx(dense.stages([2], 1)[0].forward)
    assert stage.backward == pytest.approx(dense.stages([2], 1)[0].backward)
    assert dense.stages([2], 1)[0].communication == 0.0


def test_fp8_dispatches_toward_the_experts_in_fp8_and_combines_in_bf16() -> None:
    experts = ExpertParallel.on(Cluster(LINK, 8), 8, 1, DEEPSEEK, fp8_dispatch=True)
    nbytes = 64e6
    forward, sent = experts.exchanges(np.array([nbytes, nbytes]), np.array([1, 1]))
    assert sent.tolist() == pytest.approx([nbytes * FP8_DISPATCH, nbytes])
    assert forward[0] == pytest.approx(all_to_all_seconds(nbytes * FP8_DISPATCH, 8, LINK))
    assert forward[1] == pytest.approx(all_to_all_seconds(nbytes, 8, LINK))


def test_imbalance_stretches_the_all_to_all() -> None:
    even = ExpertParallel.on(Cluster(LINK, 8), 8, 1, DEEPSEEK)
    skewed = ExpertParallel.on(Cluster(LINK, 8), 8, 1, DEEPSEEK, imbalance=1.5)
    assert skewed.seconds(64e6, True) - LINK.latency == pytest.approx(1.5 * (even.seconds(64e6, True) - LINK.latency))


def test_a_profile_counted_with_experts_needs_its_group() -> None:
    with pytest.raises(ValueError, match="one of 64 expert-parallel ranks"):
        FlopCosts(_profile(64e6, 64), get_device("h800"), "bf16-adam")


# -- memory ------------------------------------------------------------------------------------------------------


def test_expert_state_is_sharded_over_the_expert_data_parallel_group() -> None:
    training = training_policy("bf16-adam")
    params, experts = 1000, 600
    state = sharded_state_of_experts(params * training.weight_bytes, params * training.gradient_bytes,
                                     params * training.optimizer_bytes, params, experts, training, 1, 128, 2)

    class Part:
        def __init__(self, n: int) -> None:
            self.parameter_bytes = n * training.weight_bytes
            self.gradient_bytes = n * training.gradient_bytes
            self.optimizer_bytes = n * training.optimizer_bytes

    dense = sharded_state(Part(params - experts), params - experts, training, 1, 128)
    mine = sharded_state(Part(experts), experts, training, 1, 2)
    assert state.total == dense.total + mine.total
    assert state.optimizer == -(-(params - experts) * training.optimizer_bytes // 128) + \
        experts * training.optimizer_bytes // 2
    # without experts it is ZeRO's own
    whole = Part(params)
    assert sharded_state_of_experts(whole.parameter_bytes, whole.gradient_bytes, whole.optimizer_bytes, params, 0,
                                    training, 1, 128, 2) == sharded_state(whole, params, training, 1, 128)


def test_a_stage_holds_one_message_to_send_while_it_exchanges() -> None:
    profile = _profile(64e6, 64)
    assert dispatch_buffer_bytes(profile, [1, 1], 2) == [128e6, 128e6]
    assert dispatch_buffer_bytes(profile, [2], 2, imbalance=1.5) == [192e6]
    assert dispatch_buffer_bytes(_profile(0.0, 1), [2], 2) == [0]
