"""Nodes and their network: where each GPU of a ``t x p x d`` configuration sits, and what each transfer crosses.

Layout (Note [layout]): a GPU's index is ``replica * (p * t) + device * t + rank``; node ``index // gpus_per_node``::

    node 0                          node 1
    [ stage 0: t ranks | stage 1 ]  [ stage 2 | stage 3 ]   replica 0     (t = 4, p = 4, 8 GPUs a node)
    [ stage 0 | stage 1 ]           [ stage 2 | stage 3 ]   replica 1     (nodes 2 and 3)

Tensor-parallel groups stay in a node, consecutive stages fill a node before crossing, replicas are outermost. A
stage-to-stage copy between nodes goes on the network at one GPU's share of its node's ports
(``ports * port bandwidth / gpus_per_node``), inside a node on the link. The data-parallel all-reduce of a stage is
hierarchical when its group spans nodes (:func:`sim.planning.collectives.hierarchical_allreduce_seconds`), and so are
ZeRO's reduce-scatter and all-gather (:mod:`sim.planning.zero`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from sim.core.link import LinkSpec
from sim.planning.collectives import (
    allgather_seconds,
    allreduce_seconds,
    hierarchical_allgather_seconds,
    hierarchical_allreduce_seconds,
    hierarchical_reduce_scatter_seconds,
    reduce_scatter_seconds,
)

__all__ = ["Cluster"]


# Note [layout]: Megatron-LM's order of ranks (tensor fastest, then pipeline, then data) with the tensor-parallel
# group inside a node. A configuration whose replicas do not start on a node boundary (``p * t`` not dividing
# ``gpus_per_node`` nor a multiple of it) has replicas that cross nodes at different stages; a boundary counts as
# crossing when it crosses in any replica, as the slowest replica sets the step.
@dataclass(frozen=True)
class Cluster:
    """The machine a plan runs on: GPUs per node, the link inside a node, the network between nodes.

    Attributes:
        link: inside a node (stage copies, tensor-parallel and in-node data-parallel collectives).
        gpus_per_node: GPUs a node holds.
        network: one port of the network between nodes; ``None``: every transfer on ``link`` (one node, or a
            cluster whose network is not modelled).
        ports: network ports per node; ``None``: one per GPU.
    """

    link: LinkSpec
    gpus_per_node: int = 8
    network: LinkSpec | None = None
    ports: int | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise ValueError(f"GPUs per node must be >= 1, got {self.gpus_per_node}")
        if self.ports is not None and self.ports < 1:
            raise ValueError(f"network ports per node must be >= 1, got {self.ports}")

    @cached_property
    def nic(self) -> LinkSpec | None:
        """One GPU's share of its node's network ports, or ``None`` without a network."""
        if self.network is None:
            return None
        ports = self.gpus_per_node if self.ports is None else self.ports
        share = ports * self.network.bandwidth / self.gpus_per_node
        return LinkSpec(f"{self.network.name} ({ports} ports / {self.gpus_per_node} GPUs)", self.network.latency,
                        share, self.network.description)

    def node(self, tensor_parallel: int, stages: int, replica: int, device: int) -> int:
        """The node of the first rank of pipeline device ``device`` of ``replica`` (Note [layout])."""
        return _node(self.gpus_per_node, tensor_parallel, stages, replica, device)

    def stage_links(self, placement: tuple[int, ...], tensor_parallel: int, stages: int,
                    replicas: int) -> tuple[LinkSpec, ...] | None:
        """The link after each stage of ``placement`` (stage -> device); ``None`` when all are on ``link``."""
        nic = self.nic
        if nic is None:
            return None
        out, crossing = [], False
        for j, d in enumerate(placement):
            nxt = placement[j + 1] if j + 1 < len(placement) else d
            cross = any(self.node(tensor_parallel, stages, r, d) != self.node(tensor_parallel, stages, r, nxt)
                        for r in range(replicas))
            crossing |= cross
            out.append(nic if cross else self.link)
        return tuple(out) if crossing else None

    def allreduce_seconds(self, nbytes: float, tensor_parallel: int, stages: int, replicas: int,
                          device: int) -> float:
        """The data-parallel all-reduce of ``nbytes`` among the ``replicas`` copies of pipeline device ``device``.

        A ring on ``link`` when the group is in one node (or there is no network); otherwise hierarchical.
        """
        return self._collective(allreduce_seconds, hierarchical_allreduce_seconds, nbytes, tensor_parallel, stages,
                                replicas, device)

    def reduce_scatter_seconds(self, nbytes: float, tensor_parallel: int, stages: int, replicas: int,
                               device: int) -> float:
        """As :meth:`allreduce_seconds`, a reduce-scatter of ``nbytes`` (ZeRO's gradients)."""
        return self._collective(reduce_scatter_seconds, hierarchical_reduce_scatter_seconds, nbytes, tensor_parallel,
                                stages, replicas, device)

    def allgather_seconds(self, nbytes: float, tensor_parallel: int, stages: int, replicas: int,
                          device: int) -> float:
        """As :meth:`allreduce_seconds`, an all-gather of ``nbytes``, the gathered whole (ZeRO's parameters)."""
        return self._collective(allgather_seconds, hierarchical_allgather_seconds, nbytes, tensor_parallel, stages,
                                replicas, device)

    def _collective(self, ring: Callable[[float, int, LinkSpec], float],
                    hierarchical: Callable[[float, int, int, LinkSpec, LinkSpec], float], nbytes: float,
                    tensor_parallel: int, stages: int, replicas: int, device: int) -> float:
        nic = self.nic
        inside, nodes = _group(self.gpus_per_node, tensor_parallel, stages, replicas, device)
        if nic is None or nodes == 1:
            return ring(nbytes, replicas, self.link)
        return hierarchical(nbytes, inside, nodes, self.link, nic)


@lru_cache(maxsize=4096)
def _group(gpus_per_node: int, tensor_parallel: int, stages: int, replicas: int, device: int) -> tuple[int, int]:
    """The data-parallel group of pipeline device ``device``: the most of its GPUs in one node, and its nodes."""
    nodes = Counter(_node(gpus_per_node, tensor_parallel, stages, r, device) for r in range(replicas))
    return max(nodes.values()), len(nodes)


def _node(gpus_per_node: int, tensor_parallel: int, stages: int, replica: int, device: int) -> int:
    return (replica * stages + device) * tensor_parallel // gpus_per_node
