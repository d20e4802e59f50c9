"""Nodes and their network: the layout of ``t x p x d`` GPUs on nodes, stage copies across nodes, and the
hierarchical data-parallel collectives (the all-reduce: reduce-scatter in the node, all-reduce across nodes,
all-gather; ZeRO's reduce-scatter and all-gather its halves)."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from gpipe.schedule import schedule_kind
from sim.cli import main
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.core.rings import allreduce_seconds, hierarchical_allreduce_seconds
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_link
from sim.planning.parallel.cluster import Cluster
from sim.planning.plan import PlanRequest, plan

LINK = LinkSpec("in-node", 1e-6, 200e9)
PORT = LinkSpec("port", 5e-6, 25e9)
SMALL = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"


@cache
def _profile(t: int) -> ModelProfile:
    shard = get_model(SMALL).tensor_parallel(t)
    return count_layers(shard.module("meta"), shard.sample(2, "meta"), dtype=torch.float16)


def test_a_gpus_share_of_its_nodes_ports() -> None:
    assert Cluster(LINK, 8, PORT).nic.bandwidth == 25e9  # type: ignore[union-attr]  # one port per GPU
    assert Cluster(LINK, 8, PORT, ports=4).nic.bandwidth == 12.5e9  # type: ignore[union-attr]
    assert Cluster(LINK, 8).nic is None


def test_the_hierarchical_all_reduce_is_its_three_phases() -> None:
    nbytes, g, n = 8e9, 4, 3
    scatter = (g - 1) / g * nbytes / LINK.bandwidth + (g - 1) * LINK.latency
    across = 2 * (n - 1) / n * (nbytes / g) / PORT.bandwidth + 2 * (n - 1) * PORT.latency
    assert hierarchical_allreduce_seconds(nbytes, g, n, LINK, PORT) == pytest.approx(2 * scatter + across)
    assert hierarchical_allreduce_seconds(nbytes, 1, n, LINK, PORT) == allreduce_seconds(nbytes, n, PORT)


@pytest.mark.parametrize(("t", "p", "r", "inside", "nodes"), [
    (1, 2, 8, 4, 2),  # 4 replicas of a 2-GPU pipeline in each of 2 nodes
    (8, 1, 4, 1, 4),  # one replica a node: a ring across 4 nodes
    (2, 8, 2, 1, 2),  # each replica spans 2 nodes
])
def test_a_group_across_nodes_is_reduced_hierarchically(t: int, p: int, r: int, inside: int, nodes: int) -> None:
    cluster, nbytes = Cluster(LINK, 8, PORT), 1e9
    expected = hierarchical_allreduce_seconds(nbytes, inside, nodes, LINK, cluster.nic)  # type: ignore[arg-type]
    assert all(cluster.allreduce_seconds(nbytes, t, p, r, d) == expected for d in range(p))


@pytest.mark.parametrize(("t", "p", "r"), [(1, 2, 8), (8, 1, 4), (2, 8, 2), (1, 2, 4)])
def test_a_groups_all_reduce_is_its_reduce_scatter_and_all_gather(t: int, p: int, r: int) -> None:
    for cluster in (Cluster(LINK, 8, PORT), Cluster(LINK, 8)):
        for d in range(p):
            assert cluster.reduce_scatter_seconds(3e9, t, p, r, d) + cluster.allgather_seconds(3e9, t, p, r, d) \
                == cluster.allreduce_seconds(3e9, t, p, r, d)


def test_a_group_inside_a_node_is_a_ring_on_the_link() -> None:
    assert Cluster(LINK, 8, PORT).allreduce_seconds(1e9, 1, 2, 4, 0) == allreduce_seconds(1e9, 4, LINK)
    assert Cluster(LINK, 8).allreduce_seconds(1e9, 8, 1, 4, 0) == allreduce_seconds(1e9, 4, LINK)  # no network


def test_consecutive_stages_fill_a_node_before_crossing() -> None:
    cluster = Cluster(LINK, 8, PORT)
    nic = cluster.nic
    assert cluster.stage_links((0, 1, 2, 3), 4, 4, 1) == (LINK, nic, LINK, LINK)  # 2 stages of 4 ranks a node
    assert cluster.stage_links((0, 1, 2, 3), 1, 4, 2) is None  # both replicas' pipelines inside a node
    assert cluster.stage_links((0, 1, 2), 2, 3, 2) == (nic, LINK, LINK)  # replica 1 (GPUs 6-11) crosses after 0
    assert Cluster(LINK, 8).stage_links((0, 1), 8, 2, 1) is None


def test_a_copy_across_nodes_is_priced_on_the_network() -> None:
    """One micro-batch through 4 stages, 1 s per F and B; the copy after stage 1 crosses nodes: 1 s each way."""
    instant, port = LinkSpec("instant", 0.0, 1e30), LinkSpec("port", 0.0, 1e9)
    stages = tuple(StageCost(forward=1.0, backward=1.0, send_bytes=10**9) for _ in range(4))
    schedule = schedule_kind("gpipe")(1, 4, "never")
    cost = CostModel(stages, copy_seconds=None)
    assert simulate(schedule, cost, SimConfig(link=instant)).makespan == pytest.approx(8.0)
    links = Cluster(instant, 2, port).stage_links(schedule.placement, 1, 4, 1)
    assert links == (instant, LinkSpec("port (2 ports / 2 GPUs)", 0.0, 1e9), instant, instant)
    assert simulate(schedule, cost, SimConfig(link=instant, stage_links=links)).makespan == pytest.approx(10.0)


def _plan(gpus: int, network: str | None, **kwargs: object) -> object:
    return plan(PlanRequest(profile={4: _profile(4)}, batch=16, device="a100-80gb", gpus=[gpus], link="nvlink3",
                            training="fp16-adam", chunks=[4], checkpoints=["never"], schedules=["1f1b"],
                            tensor_parallel=(4,), network=network, **kwargs))


def test_a_pipeline_across_two_nodes_pays_the_network() -> None:
    alone, over = (_plan(16, n, stages=[4]).rows[0] for n in (None, "ethernet-100g"))  # type: ignore[attr-defined]
    assert over.step_seconds > alone.step_seconds
    assert _plan(16, "ethernet-100g", stages=[4]).network == "ethernet-100g"  # type: ignore[attr-defined]


def test_without_a_network_or_inside_a_node_the_numbers_stay_todays() -> None:
    today = _plan(8, None).rows  # type: ignore[attr-defined]
    assert _plan(8, "infiniband-hdr").rows == today  # type: ignore[attr-defined]  # 8 GPUs: one node
    assert _plan(8, None, network_ports=2).rows == today  # type: ignore[attr-defined]


def test_replicas_across_nodes_reduce_over_the_network() -> None:
    kwargs = {"stages": [1], "replicas": [4]}
    alone, over = (_plan(16, n, **kwargs).rows[0] for n in (None, "ethernet-100g"))  # type: ignore[attr-defined]
    assert over.step_seconds > alone.step_seconds


def test_the_cli_refuses_an_unknown_network_in_one_line_before_counting(capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def count(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was counted")

    monkeypatch.setattr("sim.cli.plan.count_layers", count)
    assert main(["plan", "--model", SMALL, "--batch", "8", "--gpus", "16", "--hardware", "a100-80gb",
                 "--network", "infiniband-qdr", "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "unknown network 'infiniband-qdr'" in lines[0], lines
    assert main(["plan", "--model", SMALL, "--batch", "8", "--gpus", "16", "--hardware", "a100-80gb",
                 "--network", "infiniband-hdr", "--network-ports", "0", "--no-progress"]) == 2
    assert "--network-ports must be >= 1" in capsys.readouterr().err


def test_the_catalog_networks_resolve() -> None:
    for name in ("infiniband-hdr", "infiniband-ndr", "infiniband-xdr", "roce-400g", "ethernet-100g"):
        assert _plan(8, name).network == get_link(name).name  # type: ignore[attr-defined]
