"""What a plan is asked, checked before any work: links named by family, the network, the training default, and the
numbers of a request (batch, GPUs, chunks, tensor-parallel degrees).

:func:`sim.planning.plan.plan` and ``gpipe-sim plan`` call these before counting a model, so a bad request costs
nothing; each refusal is one line.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.core.link import LinkSpec
from sim.planning.hardware import LINKS, DeviceSpec, get_link
from sim.planning.training import Training, training_policy

__all__ = ["GPUS_PER_NODE", "check_request", "check_tensor_parallel", "default_training", "resolve_link",
           "resolve_network"]

GPUS_PER_NODE = 8  # a tensor-parallel group stays inside a node (Note [tensor parallel ranks])

_LINK_FAMILIES = {  # a family name picks the generation that comes with the device (first prefix that matches;
    # "" matches any). The PCIe and NVL H100 cards reach one peer over a bridge; an MI300 has no NVLink (name
    # its link, xgmi-mi300).
    "nvlink": {"v100": "nvlink2", "a100": "nvlink3", "h100-pcie": "nvlink4-bridge", "h100-nvl": "nvlink4-bridge",
               "h100": "nvlink4", "h200": "nvlink4", "b200": "nvlink5", "gb200": "nvlink5"},
    "pcie": {"tesla-p40": "pcie3-x16", "v100": "pcie3-x16", "a100": "pcie4-x16", "h100": "pcie5-x16",
             "h200": "pcie5-x16", "b200": "pcie5-x16", "gb200": "pcie5-x16", "l40s": "pcie4-x16",
             "mi3": "pcie5-x16", "": "pcie4-x16"},
}


def resolve_link(name: str | LinkSpec, device: DeviceSpec) -> LinkSpec:
    """A catalog link, or the generation of a family (``nvlink``, ``pcie``) that comes with ``device``.

    Raises:
        KeyError: an unknown link, or a family the device does not have (the message lists the links).
    """
    if isinstance(name, LinkSpec):
        return name
    key = name.strip().lower()
    if key in LINKS:
        return get_link(key)
    family = _LINK_FAMILIES.get(key)
    if family is not None:
        for prefix, link in family.items():
            if device.name.startswith(prefix):
                return get_link(link)
        raise KeyError(f"device {device.name!r} has no {key}; name a link: {', '.join(LINKS)}")
    raise KeyError(f"unknown link {name!r}; known: {', '.join([*_LINK_FAMILIES, *LINKS])}")


def resolve_network(name: str | LinkSpec) -> LinkSpec:
    """A catalog link for the network between nodes (``infiniband-ndr``, ``roce-400g``, ...), one port of it.

    Raises:
        KeyError: an unknown name (the message lists the catalog's links).
    """
    if isinstance(name, LinkSpec):
        return name
    key = name.strip().lower()
    if key not in LINKS:
        raise KeyError(f"unknown network {name!r}; known: {', '.join(LINKS)}")
    return get_link(key)


def default_training(device: DeviceSpec, optimizer: str = "adam") -> Training:
    """Mixed precision in the device's 16-bit dtype (bf16, else fp16), else fp32; Adam by default."""
    for dtype in ("bf16", "fp16"):
        if dtype in device.peak_flops:
            return training_policy(f"{dtype}-{optimizer}")
    return training_policy(f"fp32-{optimizer}")



def check_request(batch: int, gpus: Sequence[int], chunks: Sequence[int] | None = None) -> None:
    """Reject a batch below 1 or below every chunk count asked for, and fewer than one GPU.

    Raises:
        ValueError: with a one-line message.
    """
    if batch < 1:
        raise ValueError(f"the batch needs at least one sample, got {batch}")
    if not gpus or min(gpus) < 1:
        raise ValueError(f"need at least one GPU, got {list(gpus)}")
    if chunks is not None:
        if not chunks or min(chunks) < 1:
            raise ValueError(f"chunks must be >= 1, got {list(chunks)}")
        if min(chunks) > batch:
            raise ValueError(f"batch {batch} is smaller than the number of chunks ({min(chunks)})")


# Note [tensor parallel ranks]: ``t`` ranks split every layer (Megatron-LM's tensor parallelism), each running its
# shard of the model (its own count: :mod:`sim.planning.tensor_parallel`) with the shard's all-reduces inside its
# stages, priced on the link. They work in lockstep, so one rank's pipeline is simulated and stands for all ``t``;
# a configuration uses ``t * stages * replicas`` GPUs. The group stays inside a node (``t <= gpus_per_node``),
# where the link is. With a network, the pipeline's copies and the data-parallel all-reduce that cross nodes use
# it (:mod:`sim.planning.cluster`); without one, they are priced on the link as in one node.
def check_tensor_parallel(tensor_parallel: Sequence[int], gpus: Sequence[int],
                          gpus_per_node: int = GPUS_PER_NODE) -> None:
    """Reject tensor-parallel degrees below 1, above a node, or not dividing a GPU count (Note [tensor parallel
    ranks]).

    Raises:
        ValueError: with a one-line message.
    """
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"GPUs per node must be an integer >= 1, got {gpus_per_node!r}")
    if not tensor_parallel or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tensor_parallel):
        raise ValueError(f"tensor parallel degrees are integers >= 1, got {list(tensor_parallel)}")
    for t in tensor_parallel:
        if t > gpus_per_node:
            raise ValueError(f"tensor parallel {t} spans more than a node of {gpus_per_node} GPUs; a tensor-parallel "
                             "group stays inside a node")
        bad = [g for g in gpus if g % t]
        if bad:
            raise ValueError(f"tensor parallel {t} does not divide {bad[0]} GPUs")
