"""Whole systems: a device, the link of its NVLink domain, the domain's GPUs and the network between domains.

A :class:`System` names what a buyer names (``dgx-h100``, ``gb200-nvl72``) and fixes the five choices of
:class:`~sim.planning.parallel.cluster.Cluster` that come with it, each from the catalog of
:mod:`sim.planning.hardware.catalog`::

    gb200-nvl72   72 x gb200 on nvlink5 (one NVLink domain)  -- 72 x infiniband-ndr -->  other racks
    dgx-h100       8 x h100-sxm on nvlink4                    --  8 x infiniband-ndr -->  other nodes

A "node" of the planner is an NVLink domain (Note [NVLink domain]). Every figure's public source is beside its entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sim.planning.hardware.catalog import DEVICES, LINKS, catalog_entry

__all__ = ["SYSTEMS", "System", "get_system"]


# Note [NVLink domain]: the planner's node is the set of GPUs that reach each other on the in-node link, which is
# what bounds a tensor-parallel group (Note [tensor parallel ranks] in sim.planning.request), not the chassis that
# runs one OS image. A DGX or HGX board is both (8 GPUs); a GB200 NVL72 rack is one domain of 72 GPUs over 18 compute
# trays of 4, all on NVLink Switch at every GPU's full NVLink rate (Note [NVSwitch] in sim.planning.hardware.catalog),
# so its ``gpus_per_node`` is 72 and its ports are the rack's 72 scale-out NICs.
@dataclass(frozen=True)
class System:
    """A named machine: what ``gpipe-sim plan --system NAME`` sets.

    Attributes:
        name: catalog key, e.g. ``"dgx-h100"``.
        device: a catalog device (:data:`sim.planning.hardware.catalog.DEVICES`).
        link: the catalog link inside the NVLink domain.
        gpus_per_node: GPUs in one NVLink domain (Note [NVLink domain]).
        network: the catalog link of one scale-out port.
        network_ports: scale-out ports per domain.
        description: the product, for display.
        source: where the figures come from, for display.
    """

    name: str
    device: str
    link: str
    gpus_per_node: int
    network: str
    network_ports: int
    description: str
    source: str

    def __post_init__(self) -> None:
        for what, key, known in (("device", self.device, DEVICES), ("link", self.link, LINKS),
                                 ("network", self.network, LINKS)):
            if key not in known:
                raise ValueError(f"system {self.name!r}: unknown {what} {key!r}")
        for what, value in (("GPUs per node", self.gpus_per_node), ("network ports", self.network_ports)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"system {self.name!r}: {what} must be an integer >= 1, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "link": self.link, "gpus_per_node": self.gpus_per_node,
                "network": self.network, "network_ports": self.network_ports, "description": self.description,
                "source": self.source}


_SYSTEM_LIST = (
    # NVIDIA DGX A100 datasheet (2020/2021): 8x A100 80 GB (DGX A100 640GB), 6 NVSwitches, NVLink 3 600 GB/s per
    # GPU; "8x single-port NVIDIA ConnectX-6 VPI 200Gb/s HDR InfiniBand" for the compute fabric (two more dual-port
    # ConnectX-6 serve storage).
    System("dgx-a100", "a100-80gb", "nvlink3", 8, "infiniband-hdr", 8, "NVIDIA DGX A100 640GB",
           "NVIDIA DGX A100 datasheet: 8x A100 80GB, NVLink 3 via 6 NVSwitches, 8x ConnectX-6 HDR 200 Gb/s"),
    # NVIDIA DGX BasePOD reference architecture, core components (docs.nvidia.com, 2024): DGX H100 and H200 have
    # "Four NVIDIA NVSwitch chips" and "Four OSFP ports serving eight single-port NVIDIA ConnectX-7 VPI ... up to
    # 400 Gb/s InfiniBand/Ethernet" (the compute fabric); 640 GB of GPU memory (H100), 1,128 GB (H200). NVLink 4 900
    # GB/s per GPU (H100 and H200 datasheets).
    System("dgx-h100", "h100-sxm", "nvlink4", 8, "infiniband-ndr", 8, "NVIDIA DGX H100",
           "NVIDIA DGX H100 datasheet / DGX BasePOD reference architecture: 8x H100 SXM, NVLink 4 via 4 NVSwitches, "
           "8x ConnectX-7 NDR 400 Gb/s"),
    System("dgx-h200", "h200", "nvlink4", 8, "infiniband-ndr", 8, "NVIDIA DGX H200",
           "NVIDIA DGX H200 datasheet / DGX BasePOD reference architecture: 8x H200, NVLink 4 via 4 NVSwitches, "
           "8x ConnectX-7 NDR 400 Gb/s"),
    # NVIDIA HGX H800 specifications (2023): 8x H800, NVLink 400 GB/s per GPU (nvlink4-h800). Scale-out as DeepSeek
    # deployed it: DeepSeek-V3 technical report (arXiv 2412.19437, section 3): 8 GPUs a node on NVLink and NVSwitch,
    # InfiniBand across nodes (achieved "NVLink (160 GB/s)" and "IB (50 GB/s)" per GPU); "Insights into DeepSeek-V3"
    # (arXiv 2505.09343, section 5): eight 400G InfiniBand ConnectX-7 NICs a node, one per GPU (multi-plane fat-tree).
    System("hgx-h800", "h800", "nvlink4-h800", 8, "infiniband-ndr", 8, "NVIDIA HGX H800 (DeepSeek-V3's nodes)",
           "NVIDIA HGX H800 specifications: 8x H800, NVLink 400 GB/s; DeepSeek-V3 report and arXiv 2505.09343: "
           "8x ConnectX-7 InfiniBand 400 Gb/s a node"),
    # NVIDIA DGX BasePOD reference architecture (2024) and DGX B200 datasheet: "eight NVIDIA B200", "4x OSFP ports
    # serving 8x single-port NVIDIA ConnectX-7 VPI, up to 400Gb/s InfiniBand/Ethernet"; NVLink 5 1.8 TB/s per GPU
    # through 2 NVSwitch chips (14.4 TB/s in all).
    System("dgx-b200", "b200", "nvlink5", 8, "infiniband-ndr", 8, "NVIDIA DGX B200",
           "NVIDIA DGX B200 datasheet / DGX BasePOD reference architecture: 8x B200, NVLink 5 via 2 NVSwitches, "
           "8x ConnectX-7 NDR 400 Gb/s"),
    # NVIDIA DGX GB200 user guide (docs.nvidia.com/dgx/dgxgb200-user-guide, hardware and networking): a rack is one
    # "72-GPU NVL domain" of 18 compute trays of 2 Grace CPUs and 4 Blackwell GPUs, and 9 NVLink switch trays; NVLink
    # 5 "1.8 TB/s bidirectional per GPU" (130 TB/s in all on the GB200 NVL72 page); InfiniBand "between racks" on 4
    # OSFP ports a compute tray (the GB200 deployment guide's port table: mlx5_0, _1, _4, _5), one ConnectX-7 of 400
    # Gb/s per GPU, 72 a rack (BlueField-3 serves storage and management).
    System("gb200-nvl72", "gb200", "nvlink5", 72, "infiniband-ndr", 72, "NVIDIA GB200 NVL72 (DGX GB200 rack)",
           "NVIDIA DGX GB200 user guide / GB200 NVL72 page: 72x Blackwell GPU in one NVLink 5 domain (1.8 TB/s "
           "per GPU), 72x ConnectX-7 InfiniBand 400 Gb/s a rack"),
    # AMD Instinct MI300X Platform datasheet (2023): 8x MI300X on one board, each GPU's 7 Infinity Fabric links to
    # the 7 others, 896 GB/s in all (xgmi-mi300-board, Note [NVSwitch] in sim.planning.hardware.catalog). AMD's board
    # has no NIC; as clouds deploy it, one 400 Gb/s port per GPU: Microsoft Azure ND MI300X v5 (2024), "8x 400 Gb/s
    # NVIDIA Quantum-2 CX7 InfiniBand" a VM (3.2 Tb/s).
    System("mi300x-platform", "mi300x", "xgmi-mi300-board", 8, "infiniband-ndr", 8,
           "AMD Instinct MI300X Platform (8 GPUs), as Azure ND MI300X v5 deploys it",
           "AMD Instinct MI300X Platform datasheet: 8x MI300X, Infinity Fabric 896 GB/s a GPU; Azure ND MI300X v5: "
           "8x ConnectX-7 InfiniBand 400 Gb/s"),
    # AMD Instinct MI325X Platform datasheet (2024): the MI300X board's Infinity Fabric (896 GB/s a GPU) with 8x
    # MI325X 256 GB. Scale-out as AMD's reference deploys it: one 400 Gb/s RoCE port per GPU (AMD Pensando Pollara
    # 400 AI NIC, 2024: 400 Gb/s Ethernet, RDMA).
    System("mi325x-platform", "mi325x", "xgmi-mi300-board", 8, "roce-400g", 8,
           "AMD Instinct MI325X Platform (8 GPUs), 400G RoCE per GPU",
           "AMD Instinct MI325X Platform datasheet: 8x MI325X, Infinity Fabric 896 GB/s a GPU; AMD Pensando Pollara "
           "400: 400 Gb/s RoCE per GPU"),
)

#: Systems by name (read-only).
SYSTEMS: Mapping[str, System] = MappingProxyType({s.name: s for s in _SYSTEM_LIST})


def get_system(name: str) -> System:
    """The catalog system called ``name`` (case-insensitive).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    return catalog_entry(SYSTEMS, name, "system")
