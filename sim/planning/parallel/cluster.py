"""Nodes and their network: where each GPU of a ``t x c x p x d`` configuration sits, and what each transfer crosses.

Layout (Note [layout]): a GPU's index is ``((replica * p + device) * c + k) * t + rank`` (``k`` its context-parallel
rank; ``c = 1`` without context parallelism); node ``index // gpus_per_node``::

    node 0                          node 1
    [ stage 0: t ranks | stage 1 ]  [ stage 2 | stage 3 ]   replica 0     (t = 4, p = 4, 8 GPUs a node)
    [ stage 0 | stage 1 ]           [ stage 2 | stage 3 ]   replica 1     (nodes 2 and 3)

Tensor-parallel groups stay in a node, context-parallel ranks come next, consecutive stages fill a node before
crossing, replicas are outermost. A
stage-to-stage copy between nodes goes on the network at one GPU's share of its node's ports
(``ports * port bandwidth / gpus_per_node``), inside a node on the link. The data-parallel all-reduce of a stage is
hierarchical when its group spans nodes (:func:`sim.core.rings.hierarchical_allreduce_seconds`), and
so are ZeRO's reduce-scatter and all-gather (:mod:`sim.planning.parallel.zero`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from sim.core.link import LinkSpec
from sim.core.rings import (
    allgather_seconds,
    allreduce_seconds,
    hierarchical_allgather_seconds,
    hierarchical_allreduce_seconds,
    hierarchical_reduce_scatter_seconds,
    reduce_scatter_seconds,
)

__all__ = ["Cluster"]


# Note [layout]: Megatron-LM's order of ranks (tensor fastest, then pipeline, then data) with the tensor-parallel
# group inside a node. Context-parallel ranks sit right after the tensor-parallel ones, where Megatron-Core's order
# ``tp-cp-ep-dp-pp`` puts them (its ``--context-parallel-size``), so a pipeline device's group is ``t * c`` GPUs
# wide and a CP group spans nodes once ``t * c`` exceeds a node (Llama 3's TP 8 x CP 16: one rank of each CP group a
# node). Pipeline and data keep this planner's order (so ``c = 1`` lays out as before); Megatron-Core's puts data
# inside pipeline, which changes no link where ``t * c`` fills whole nodes: every stage copy and data-parallel
# collective crosses nodes either way. A configuration whose replicas do not start on a node boundary
# (``p * t * c`` not dividing ``gpus_per_node`` nor a multiple of it) has replicas that cross nodes at different
# stages; a boundary counts as crossing when it crosses in any replica (or CP rank), as the slowest sets the step.
# Note [experts' layout]: a mixture of experts folds its expert-parallel groups over a stage's ``t * c * d`` GPUs
# (Megatron-Core's parallel folding, :mod:`sim.planning.parallel.experts`), which only keeps an EP group in few nodes
# when a stage's GPUs sit together: a cluster with ``data_inside`` lays out Megatron-Core's order ``tp-cp-dp-pp``,
# GPU ``((device * d + replica) * c + k) * t + rank``, as DeepSeek-V3's EP 64 spans 8 nodes of one stage. A request
# that sweeps expert parallelism asks for it; every other keeps the order above.
@dataclass(frozen=True)
class Cluster:
    """The machine a plan runs on: GPUs per node, the link inside a node, the network between nodes.

    Attributes:
        link: inside a node (stage copies, tensor-parallel and in-node data-parallel collectives).
        gpus_per_node: GPUs a node holds.
        network: one port of the network between nodes; ``None``: every transfer on ``link`` (one node, or a
            cluster whose network is not modelled).
        ports: network ports per node; ``None``: one per GPU.
        data_inside: replicas inside the pipeline, Megatron-Core's order (Note [experts' layout]).
    """

    link: LinkSpec
    gpus_per_node: int = 8
    network: LinkSpec | None = None
    ports: int | None = None
    data_inside: bool = False

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

    def node(self, tensor_parallel: int, stages: int, replica: int, device: int, context: int = 0,
             context_parallel: int = 1, replicas: int = 1) -> int:
        """The node of the first rank of context-parallel rank ``context`` of pipeline device ``device`` of
        ``replica`` of ``replicas`` (Note [layout])."""
        return _node(self.gpus_per_node, tensor_parallel, stages, replica, device, context, context_parallel,
                     replicas if self.data_inside else 0)

    def stage_links(self, placement: tuple[int, ...], tensor_parallel: int, stages: int,
                    replicas: int, context_parallel: int = 1) -> tuple[LinkSpec, ...] | None:
        """The link after each stage of ``placement`` (stage -> device); ``None`` when all are on ``link``."""
        nic = self.nic
        if nic is None:
            return None
        out, crossing = [], False
        c = context_parallel
        for j, d in enumerate(placement):
            nxt = placement[j + 1] if j + 1 < len(placement) else d
            cross = any(self.node(tensor_parallel, stages, r, d, k, c, replicas)
                        != self.node(tensor_parallel, stages, r, nxt, k, c, replicas)
                        for r in range(replicas) for k in range(c))
            crossing |= cross
            out.append(nic if cross else self.link)
        return tuple(out) if crossing else None

    def allreduce_seconds(self, nbytes: float, tensor_parallel: int, stages: int, replicas: int,
                          device: int, context_parallel: int = 1) -> float:
        """The data-parallel all-reduce of ``nbytes`` among the copies of pipeline device ``device``: its
        ``replicas`` times its ``context_parallel`` ranks, which hold the same weights (as Megatron-Core reduces
        over its data-and-context-parallel group).

        A ring on ``link`` when the group is in one node (or there is no network); otherwise hierarchical.
        """
        return self._collective(allreduce_seconds, hierarchical_allreduce_seconds, nbytes, tensor_parallel, stages,
                                replicas, device, context_parallel)

    def reduce_scatter_seconds(self, nbytes: float, tensor_parallel: int, stages: int, replicas: int,
                               device: int, context_parallel: int = 1) -> float:
        """As :meth:`allreduce_seconds`, a reduce-scatter of ``nbytes`` (ZeRO's gradients)."""
        return self._collective(reduce_scatter_seconds, hierarchical_reduce_scatter_seconds, nbytes, tensor_parallel,
                                stages, replicas, device, context_parallel)

    def allgather_seconds(self, nbytes: float, tensor_parallel: int, stages: int, replicas: int,
                          device: int, context_parallel: int = 1) -> float:
        """As :meth:`allreduce_seconds`, an all-gather of ``nbytes``, the gathered whole (ZeRO's parameters)."""
        return self._collective(allgather_seconds, hierarchical_allgather_seconds, nbytes, tensor_parallel, stages,
                                replicas, device, context_parallel)

    def context_group(self, tensor_parallel: int, context_parallel: int) -> tuple[int, int]:
        """A context-parallel group of ``context_parallel`` ranks ``tensor_parallel`` GPUs apart (Note [layout]): the
        most of its GPUs in one node and the nodes it spans, the worst over where a pipeline device's group starts."""
        return _strided(self.gpus_per_node, tensor_parallel, context_parallel)

    def expert_group(self, expert_tensor_parallel: int, expert_parallel: int) -> tuple[int, int]:
        """An expert-parallel group of ``expert_parallel`` ranks ``expert_tensor_parallel`` GPUs apart, folded over a
        stage's GPUs (Note [experts' layout]): the most of its GPUs in one node and the nodes it spans."""
        return _strided(self.gpus_per_node, expert_tensor_parallel, expert_parallel)

    def strided_seconds(self, kind: str, nbytes: float, stride: int, ranks: int) -> float:
        """A collective ``kind`` (``all-reduce``, ``reduce-scatter`` or ``all-gather``) of ``nbytes`` among ``ranks``
        GPUs ``stride`` apart in a stage's folded group (an expert-data-parallel group: Note [experts' layout]): a
        ring on ``link`` in one node (or without a network), else hierarchical."""
        ring, hierarchical = _KINDS[kind]
        inside, nodes = _strided(self.gpus_per_node, stride, ranks)
        if self.nic is None or nodes == 1:
            return ring(nbytes, ranks, self.link)
        return hierarchical(nbytes, inside, nodes, self.link, self.nic)

    def _collective(self, ring: Callable[[float, int, LinkSpec], float],
                    hierarchical: Callable[[float, int, int, LinkSpec, LinkSpec], float], nbytes: float,
                    tensor_parallel: int, stages: int, replicas: int, device: int, context_parallel: int) -> float:
        nic = self.nic
        inside, nodes = _group(self.gpus_per_node, tensor_parallel, stages, replicas, device, context_parallel,
                               self.data_inside)
        if nic is None or nodes == 1:
            return ring(nbytes, replicas * context_parallel, self.link)
        return hierarchical(nbytes, inside, nodes, self.link, nic)


_KINDS: dict[str, tuple[Callable[[float, int, LinkSpec], float],
                        Callable[[float, int, int, LinkSpec, LinkSpec], float]]] = {
    "all-reduce": (allreduce_seconds, hierarchical_allreduce_seconds),
    "reduce-scatter": (reduce_scatter_seconds, hierarchical_reduce_scatter_seconds),
    "all-gather": (allgather_seconds, hierarchical_allgather_seconds)}


def _strided(gpus_per_node: int, stride: int, ranks: int) -> tuple[int, int]:
    """Groups of ``ranks`` GPUs ``stride`` apart, ``stride * ranks`` wide and tiled from GPU 0: the most of one
    group's GPUs in a node and the nodes it spans, the worst over where a group starts."""
    width = stride * ranks
    spans = [Counter((start * width + k * stride) // gpus_per_node for k in range(ranks))
             for start in range(gpus_per_node)]  # the pattern repeats after a node's worth of groups
    worst = max(spans, key=len)
    return max(worst.values()), len(worst)


@lru_cache(maxsize=4096)
def _group(gpus_per_node: int, tensor_parallel: int, stages: int, replicas: int, device: int,
           context_parallel: int = 1, data_inside: bool = False) -> tuple[int, int]:
    """The data-parallel group of pipeline device ``device`` (its replicas' context-parallel ranks too): the most of
    its GPUs in one node, and its nodes."""
    nodes = Counter(_node(gpus_per_node, tensor_parallel, stages, r, device, k, context_parallel,
                          replicas if data_inside else 0)
                    for r in range(replicas) for k in range(context_parallel))
    return max(nodes.values()), len(nodes)


def _node(gpus_per_node: int, tensor_parallel: int, stages: int, replica: int, device: int, context: int = 0,
          context_parallel: int = 1, replicas: int = 0) -> int:
    """The node of a rank (Note [layout]); ``replicas`` > 0: with data inside the pipeline (Note [experts'
    layout])."""
    outer = device * replicas + replica if replicas else replica * stages + device
    return (outer * context_parallel + context) * tensor_parallel // gpus_per_node
