"""Whole systems in the catalog (sim.planning.hardware.systems) and ``gpipe-sim plan --system``: a GB200 NVL72 is one
NVLink domain of 72 GPUs, and a flag given explicitly wins over the system's (Note [a system's flags])."""

from __future__ import annotations

import argparse
import json

import pytest

from sim.cli import CommandError, build_parser, main
from sim.cli.plan_defaults import layout, system
from sim.planning.hardware.catalog import get_link
from sim.planning.hardware.systems import SYSTEMS, System, get_system
from sim.planning.parallel.cluster import Cluster

TINY = "gpt:layers=2,hidden=576,heads=72,seq=144,vocab=512"  # 72 heads and 144 tokens: every t of a 72-GPU domain


def _args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["plan", "--model", "gpt:175b", "--batch", "8", "--gpus", "1152", *flags])


def test_the_issue_s_systems_are_in_the_catalog_with_their_sources() -> None:
    assert {"dgx-a100", "dgx-h100", "dgx-h200", "hgx-h800", "dgx-b200", "gb200-nvl72", "mi300x-platform",
            "mi325x-platform"} <= set(SYSTEMS)
    assert all(s.source for s in SYSTEMS.values())
    h800 = get_system("HGX-H800")
    assert (h800.device, h800.link, h800.network_ports) == ("h800", "nvlink4-h800", 8)
    assert get_link(h800.link).bandwidth == 200e9  # 400 GB/s both directions


def test_a_gb200_nvl72_rack_is_one_nvlink_domain_with_a_400g_port_per_gpu() -> None:
    rack = get_system("gb200-nvl72")
    assert (rack.device, rack.link, rack.gpus_per_node, rack.network_ports) == ("gb200", "nvlink5", 72, 72)
    cluster = Cluster(get_link(rack.link), rack.gpus_per_node, get_link(rack.network), rack.network_ports)
    assert cluster.link.bandwidth == 900e9  # 1.8 TB/s both directions
    assert cluster.nic is not None and cluster.nic.bandwidth == 50e9  # 400 Gb/s
    # tensor parallel 72 inside the rack, then the next replica's stage on the next rack
    assert cluster.node(72, 2, 0, 1) == 1 and cluster.node(8, 9, 0, 8) == 0


def test_an_mi300x_board_s_collectives_use_every_infinity_fabric_link() -> None:
    board = get_system("mi300x-platform")
    assert get_link(board.link).bandwidth == 7 * get_link("xgmi-mi300").bandwidth


def test_a_system_refuses_an_entry_the_catalog_lacks_and_an_unknown_name_lists_them() -> None:
    with pytest.raises(ValueError, match="unknown device 'h999'"):
        System("x", "h999", "nvlink4", 8, "infiniband-ndr", 8, "", "")
    with pytest.raises(ValueError, match="GPUs per node must be an integer >= 1"):
        System("x", "h100-sxm", "nvlink4", 0, "infiniband-ndr", 8, "", "")
    with pytest.raises(KeyError, match="known systems: dgx-a100"):
        get_system("dgx-z9")


def test_a_system_fills_what_was_left_out_and_an_explicit_flag_wins() -> None:
    args = _args("--system", "dgx-h100", "--network", "roce-400g")
    system(args)
    assert (args.hardware, args.link, args.gpus_per_node, args.network, args.network_ports) == (
        "h100-sxm", "nvlink4", 8, "roce-400g", 8)
    args = _args("--hardware", "a100-80gb")
    system(args)
    assert (args.link, args.gpus_per_node, args.network, args.network_ports) == ("pcie", 8, None, None)
    with pytest.raises(CommandError, match="--hardware is required"):
        system(_args())


def test_the_default_tensor_parallel_sweep_of_a_72_gpu_domain_takes_what_the_model_divides() -> None:
    args = _args("--system", "gb200-nvl72")
    system(args)
    assert layout(args, [1152])[0] == [1, 2, 4, 8]  # 2,048 tokens under sequence parallelism: no 3, 6, 12 or 24
    args.sequence_parallel = "off"
    assert layout(args, [1152])[0] == [1, 2, 3, 4, 6, 8, 12, 24]  # 96 heads: never 72
    args.model = TINY
    args.sequence_parallel = None
    assert layout(args, [72])[0] == [1, 2, 3, 4, 6, 8, 9, 12, 18, 24, 36, 72]


def test_plan_on_a_gb200_nvl72_runs_tensor_parallel_72_on_nvlink(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", TINY, "--batch", "4", "--gpus", "72", "--system", "gb200-nvl72", "--json",
                 "--tensor-parallel", "72", "--chunks", "1", "--schedule", "1f1b", "--checkpoint", "never",
                 "--zero", "0", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["device"], result["link"], result["network"]) == ("gb200", "nvlink5", "infiniband-ndr")
    assert {row["tensor_parallel"] for row in result["rows"]} == {72}


def test_gpipe_sim_hardware_lists_the_systems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware"]) == 0
    assert "gb200-nvl72     gb200         72  nvlink5" in capsys.readouterr().out
    assert main(["hardware", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["systems"]
    assert [s["name"] for s in listed] == list(SYSTEMS)
    assert listed[0] == SYSTEMS["dgx-a100"].to_dict()
