"""Collectives on a ring, inside a node or across nodes: what a group of ``r`` devices pays to reduce or gather.

::

    ring reduce-scatter = ring all-gather = (r - 1) / r * bytes / bandwidth + (r - 1) * latency
    ring all-reduce     = reduce-scatter + all-gather

An all-to-all (a mixture of experts' dispatch and combine) sends each peer its own share instead of passing a ring's
steps, flat or in DeepSeek-V3's two hops (:func:`all_to_all_seconds`, :func:`node_limited_all_to_all_seconds`).

Used for data parallelism (:mod:`sim.planning.parallel.replicas`, :mod:`sim.planning.parallel.cluster`), the
tensor-parallel collectives inside a stage (:mod:`sim.planning.costs.from_flops`), and the demo's replicas, whose
gloo all-reduce is this ring (:mod:`sim.calibration.replicas`): so it lives in the core, below both.
"""

from __future__ import annotations

from sim.core.link import LinkSpec

__all__ = ["all_to_all_seconds", "allgather_seconds", "allreduce_seconds", "hierarchical_allgather_seconds",
           "hierarchical_allreduce_seconds", "hierarchical_reduce_scatter_seconds", "node_limited_all_to_all_seconds",
           "reduce_scatter_seconds"]


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


# Note [all-to-all]: each of ``r`` ranks sends every other rank its own share of one message: tokens routed evenly
# reach each rank with ``1 / r`` of the bytes, and the share a rank keeps is sent nowhere. NCCL's all-to-all posts
# every send at once, so the peers in the node share the GPU's NVLink bandwidth and the peers elsewhere its share of
# the node's network ports; the two are separate engines and run together, so the slower one sets the time, each
# paying its latency once. ``bytes`` is the whole message one rank sends (its own share included).
def all_to_all_seconds(nbytes: float, ranks: int, link: LinkSpec, inside: int | None = None,
                       nic: LinkSpec | None = None) -> float:
    """An all-to-all of ``nbytes`` per rank among ``ranks``, at most ``inside`` of them in one node (Note
    [all-to-all])::

        in the node     (g - 1) / r * bytes / link bandwidth + link latency
        across nodes    (r - g) / r * bytes / nic bandwidth  + nic latency
        seconds         the larger of the two

    ``g = inside`` (``None``: all ``r``, one node); ``nic``: one GPU's share of its node's network
    (:attr:`sim.planning.parallel.cluster.Cluster.nic`), needed when ``g < r``. In one node: ``(r - 1) / r * bytes
    / bandwidth + latency``; 0 for one rank.

    Raises:
        ValueError: ``inside`` outside ``1..ranks``, or a group across nodes without ``nic``.
    """
    g = ranks if inside is None else inside
    if not 1 <= g <= ranks:
        raise ValueError(f"an all-to-all of {ranks} ranks cannot have {g} in one node")
    if ranks < 2 or nbytes <= 0:
        return 0.0
    local = (g - 1) / ranks * nbytes / link.bandwidth + link.latency if g > 1 else 0.0
    if g == ranks:
        return local
    if nic is None:
        raise ValueError(f"an all-to-all of {ranks} ranks across nodes needs the network between them (nic)")
    return max(local, (ranks - g) / ranks * nbytes / nic.bandwidth + nic.latency)


# Note [two hops]: DeepSeek-V3 sends each token to at most M nodes (node-limited routing, arXiv 2412.19437, section
# 2.1.2) and dispatches it in two hops (section 3.2.2): over InfiniBand once per target node, to the GPU of the same
# index there, which forwards it over NVLink to the GPUs of its experts; the two hops run at once, pipelined. Of a
# token's ``k`` copies (``bytes`` holds all ``k``), the network carries one per target node other than its own: a
# token picks ``m = min(M, n, k)`` of the ``n`` nodes, its own among them ``m / n`` of the time, so ``m (n - 1) / n``
# copies cross; NVLink carries every copy whose expert is not on the GPU it lands on, ``(g - 1) / g`` of them.
def node_limited_all_to_all_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec, nic: LinkSpec,
                                    per_token: int, node_limit: int) -> float:
    """An all-to-all of ``nbytes`` per rank (each token's ``per_token`` copies) among ``inside`` ranks in each of
    ``nodes`` nodes, each token sent to at most ``node_limit`` nodes, in DeepSeek-V3's two hops (Note [two hops])::

        across nodes   m (n - 1) / (n k) * bytes / nic bandwidth + nic latency     m = min(M, n, k)
        in the node    (g - 1) / g * bytes / link bandwidth + link latency
        seconds        the larger of the two

    ``g = inside``, ``n = nodes``. In one node it is the flat :func:`all_to_all_seconds`.

    Raises:
        ValueError: ``inside``, ``nodes``, ``per_token`` or ``node_limit`` below 1.
    """
    if min(inside, nodes, per_token, node_limit) < 1:
        raise ValueError(f"a node-limited all-to-all needs g, n, k and M >= 1, got g={inside}, n={nodes}, "
                         f"k={per_token}, M={node_limit}")
    if nodes == 1:
        return all_to_all_seconds(nbytes, inside, link)
    if nbytes <= 0:
        return 0.0
    targets = min(node_limit, nodes, per_token)
    across = targets * (nodes - 1) / (nodes * per_token) * nbytes / nic.bandwidth + nic.latency
    forward = (inside - 1) / inside * nbytes / link.bandwidth + link.latency if inside > 1 else 0.0
    return max(across, forward)
