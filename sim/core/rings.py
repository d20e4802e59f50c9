"""Collectives on a ring, inside a node or across nodes: what a group of ``r`` devices pays to reduce or gather.

::

    ring reduce-scatter = ring all-gather = (r - 1) / r * bytes / bandwidth + (r - 1) * latency
    ring all-reduce     = reduce-scatter + all-gather

Used for data parallelism (:mod:`sim.planning.parallel.replicas`, :mod:`sim.planning.parallel.cluster`), the
tensor-parallel collectives inside a stage (:mod:`sim.planning.costs.from_flops`), and the demo's replicas, whose
gloo all-reduce is this ring (:mod:`sim.calibration.replicas`): so it lives in the core, below both.
"""

from __future__ import annotations

from sim.core.link import LinkSpec

__all__ = ["allgather_seconds", "allreduce_seconds", "hierarchical_allgather_seconds",
           "hierarchical_allreduce_seconds", "hierarchical_reduce_scatter_seconds", "reduce_scatter_seconds"]


def reduce_scatter_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring reduce-scatter of ``nbytes`` across ``replicas`` over ``link``, each keeping a summed ``1 / r``.

    Each of ``r - 1`` steps sends ``1 / r`` of the bytes to the next replica and pays the link's latency once;
    0 for one replica.
    """
    if replicas < 2:
        return 0.0
    return (replicas - 1) / replicas * nbytes / link.bandwidth + (replicas - 1) * link.latency


def allgather_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring all-gather of ``nbytes`` (the whole gathered tensor) across ``replicas``: a reduce-scatter's steps."""
    return reduce_scatter_seconds(nbytes, replicas, link)


def allreduce_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring all-reduce of ``nbytes`` across ``replicas`` copies over ``link``: reduce-scatter, then all-gather.

    ``2 (r - 1) / r * bytes / bandwidth + 2 (r - 1) * latency``; 0 for one replica.
    """
    return reduce_scatter_seconds(nbytes, replicas, link) + allgather_seconds(nbytes, replicas, link)


def hierarchical_reduce_scatter_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec,
                                        nic: LinkSpec) -> float:
    """A reduce-scatter of ``nbytes`` over ``inside`` GPUs in each of ``nodes`` nodes, in two phases::

        reduce-scatter in the node     (g - 1) / g * bytes / link bandwidth + (g - 1) * link latency
        reduce-scatter across nodes    ring of the 1/g share among the GPUs at the same position, on ``nic``

    ``g = inside``; ``nic``: one GPU's share of its node's network (:attr:`sim.planning.parallel.cluster.Cluster.nic`).
    """
    return reduce_scatter_seconds(nbytes, inside, link) + reduce_scatter_seconds(nbytes / inside, nodes, nic)


def hierarchical_allgather_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec, nic: LinkSpec) -> float:
    """An all-gather of ``nbytes`` over ``inside`` GPUs in ``nodes`` nodes: the reduce-scatter's phases reversed
    (across nodes the ``1/g`` share, then in the node)."""
    return allgather_seconds(nbytes / inside, nodes, nic) + allgather_seconds(nbytes, inside, link)


def hierarchical_allreduce_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec, nic: LinkSpec) -> float:
    """An all-reduce of ``nbytes`` over ``inside`` GPUs in each of ``nodes`` nodes, in three phases::

        reduce-scatter in the node   (g - 1) / g * bytes / link bandwidth + (g - 1) * link latency
        all-reduce across nodes      ring of the 1/g share among the GPUs at the same position, on ``nic``
        all-gather in the node       as the reduce-scatter

    the hierarchical reduce-scatter followed by the hierarchical all-gather.
    """
    return (hierarchical_reduce_scatter_seconds(nbytes, inside, nodes, link, nic)
            + hierarchical_allgather_seconds(nbytes, inside, nodes, link, nic))
