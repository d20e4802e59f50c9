"""Context parallelism: a decoder's sequence split over ``c`` GPUs, one rank's count and its key/value traffic.

Megatron-Core's context parallelism, and Llama 3's (Dubey et al., 2024, section 3.3.2), splits each sample's ``s``
tokens over ``c`` ranks that hold the same weights. A rank runs its ``s / c`` tokens through every layer; only the
attention needs the other ranks' tokens, whose keys and values it receives::

    tokens      2c chunks; rank i keeps chunks i and 2c-1-i, so every rank does the same causal attention work
    one rank    every per-token FLOP, byte and saved activation over c, the attention kernel's FLOPs too;
                the kernel still reads the whole sequence's keys and values
    K and V     ring        c - 1 steps; each passes a rank's K/V block to the next while the attention on the block
                            before runs (Megatron-Core's default, cp_comm_type "p2p"); the backward passes the blocks
                            and their gradients
                all-gather  gather K, gather V, then attention on the local queries (Llama 3's); the backward
                            gathers them again and reduce-scatters dK and dV, all on the critical path

Note [context parallel traffic]: with ``kv`` the keys and values of a micro-batch's whole sequence on one
tensor-parallel rank, ``2·s·b·(K/t)·d·e`` bytes (``K`` key/value heads, head width ``d``, ``e`` bytes an element),
one rank sends ``(c - 1) / c · kv`` bytes a layer forward and ``2 (c - 1) / c · kv`` backward in both variants
(:func:`traffic_bytes`). The all-gather's are exposed, one collective per tensor (Note [keys and values apart]):
two all-gathers of ``kv / 2`` forward, two all-gathers and two reduce-scatters backward, each a ring
(:mod:`sim.core.rings`; hierarchical when the group spans nodes with several members in one). The
ring's step of ``kv / c`` bytes (twice that backward) overlaps the attention on one block,
``1 / c`` of the layer's attention kernel: only what a step takes beyond it is exposed,
``(c - 1) · max(0, step - attention / c)``, and a ring that crosses nodes runs at its slowest hop, the network.
The seconds join their layer's forward and backward (the input gradient's ``B`` of a split backward), as the
tensor-parallel collectives do (Note [collectives in the stage] in :mod:`sim.planning.costs.from_flops`).

Note [keys and values apart]: the all-gather variant runs K and V as collectives of their own, as Llama 3 describes
it ("we first all-gather the key (K) and value (V) tensors", section 3.3.2) and as TransformerEngine's
``AttnFuncWithCPAndKVAllGather`` runs it (``gather_along_first_dim`` on k and on v, forward and again backward;
``reduce_scatter_along_first_dim`` on dk and on dv). The bytes are those of one collective of ``kv``; each
collective pays the ring's ``(c - 1)`` step latencies, so a layer pays ``2 (c - 1)`` of them forward and
``4 (c - 1)`` backward. The ring variant sends K and V in one buffer a step (TransformerEngine's ``p2p``
concatenates them), one latency a step.

Note [gathered keys not kept]: the gathered K and V (the all-gather's) and the ring's two blocks in flight live only
while their layer's attention runs; they are not added to the working set (64 MiB for a Llama 3 405B layer at 128K
tokens on one of 8 tensor-parallel ranks, under 0.1% of an H100), and each rank keeps only its own tokens' K and V
for the backward, as Megatron-Core and TransformerEngine do.

References: Dubey et al. (2024), "The Llama 3 Herd of Models", arXiv 2407.21783, section 3.3.2 (all-gather CP, 2·CP
chunks) and Table 4; Liu et al. (2023), "Ring Attention with Blockwise Transformers"; Megatron-Core's
``context_parallel`` and TransformerEngine's ``attn_forward_func_with_cp`` (``cp_comm_type`` ``p2p`` and
``all_gather``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.core.link import LinkSpec
from sim.core.rings import (
    allgather_seconds,
    hierarchical_allgather_seconds,
    hierarchical_reduce_scatter_seconds,
    reduce_scatter_seconds,
)
from sim.planning.counting.counts import MATMUL, LayerProfile, ModelProfile, OpTable
from sim.planning.parallel.cluster import Cluster

__all__ = ["CP_COMMS", "ContextParallel", "attention_kernels", "check_context_parallel", "check_splittable", "kv_bytes",
           "split_sequence", "traffic_bytes"]

#: How the ranks see each other's keys and values: ``ring`` (Megatron-Core's default) or ``all-gather`` (Llama 3's).
CP_COMMS = ("ring", "all-gather")
#: Tensors the all-gather variant gathers one collective each, K and V (Note [keys and values apart]).
KV_TENSORS = 2


def check_context_parallel(degrees: Sequence[int], comm: str, tokens: int | None) -> None:
    """Refuse context-parallel degrees below 1, an unknown variant, or a degree whose ``2c`` chunks do not divide the
    sequence of ``tokens`` (``None``: a model without one, which only degree 1 takes).

    Raises:
        ValueError: with a one-line message.
    """
    if not degrees or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in degrees):
        raise ValueError(f"context parallel degrees are integers >= 1, got {list(degrees)}")
    if comm not in CP_COMMS:
        raise ValueError(f"context parallel communication must be one of {', '.join(CP_COMMS)}, got {comm!r}")
    for c in degrees:
        if c == 1:
            continue
        if tokens is None:
            raise ValueError(f"context parallel {c} splits a sequence; the model has none (a built-in gpt or llama "
                             "has)")
        if tokens % (2 * c):
            raise ValueError(f"context parallel {c} splits the sequence into {2 * c} chunks (two per rank, for "
                             f"causal load balance), which do not divide its {tokens} tokens")


def check_splittable(profile: ModelProfile) -> None:
    """Refuse a count whose sequence context parallelism cannot split: one without a FlashAttention kernel (a model
    that is not a built-in decoder, or one whose attention is written out, ``attention=math``).

    Raises:
        ValueError: with a one-line message.
    """
    if profile.attention_core is not None or not any(attention_kernels(x.forward).any() for x in profile.layers):
        raise ValueError("context parallelism splits a decoder's FlashAttention (a built-in gpt or llama with "
                         "attention=flash, the default), as Megatron-Core's needs a fused attention")


def attention_kernels(table: OpTable) -> np.ndarray:
    """Which operators of ``table`` are FlashAttention kernels (forward or backward): products of ``M`` query rows
    that grow with the batch against a fixed ``N`` of keys, not a Linear layer's (Note [flash attention] in
    :mod:`sim.planning.counting.operators` records them so)."""
    dims = table.dims_or_default()
    return ((table.kinds_or_default() == MATMUL) & ~table.linear_or_default() & (dims[:, 0, 0] == 0)
            & (dims[:, 0, 1] > 0) & (dims[:, 1, 0] > 0) & (dims[:, 1, 1] == 0))


def kv_bytes(layer: LayerProfile, itemsize: int) -> float:
    """Per sample, the keys and values of the whole sequence that ``layer``'s attention reads (0 without one).

    The forward kernel reads q, k and v and writes o and the logsumexp (float32 for 16-bit inputs): its bytes per
    sample less ``2·e·M·d`` (q and o: ``M`` rows of width ``d``) and the logsumexp's ``max(e, 4)·M``.
    """
    table = layer.forward
    mine = attention_kernels(table)
    dims = table.dims_or_default()[mine]
    rows, width = dims[:, 0, 1], dims[:, 2, 0]
    return float((table.bytes[mine, 1] - 2 * itemsize * rows * width - max(itemsize, 4) * rows).sum())


def split_sequence(profile: ModelProfile, degree: int) -> ModelProfile:
    """One context-parallel rank's count: every per-sample FLOP, byte, GEMM row and activation of ``profile`` over
    ``degree``, but the attention kernels' reads of the whole sequence's keys and values (the module docstring).

    Raises:
        ValueError: ``degree > 1`` and the profile has no FlashAttention kernel to split (a model that is not a
            built-in decoder, or one counted with ``attention=math``).
    """
    if degree == 1:
        return profile
    check_splittable(profile)
    itemsize = profile.dtype.itemsize
    layers = []
    for x in profile.layers:
        kv = kv_bytes(x, itemsize)
        layers.append(replace(
            x, forward=_split_table(x.forward, degree, kv), backward=_split_table(x.backward, degree, 2 * kv),
            input_backward=None if x.input_backward is None else _split_table(x.input_backward, degree, 2 * kv),
            output_bytes=_split(x.output_bytes, degree), input_bytes=_split(x.input_bytes, degree),
            saved_bytes=_split(x.saved_bytes, degree), input_saved_bytes=_split(x.input_saved_bytes, degree),
            held=tuple(replace(h, bf16=_split(h.bf16, degree), fp8=_split(h.fp8, degree)) for h in x.held),
            new_output_bytes=None if x.new_output_bytes is None else _split(x.new_output_bytes, degree)))
    return replace(profile, layers=tuple(layers), context_parallel=degree)


def _split(q: tuple[float, float], degree: int) -> tuple[float, float]:
    return q[0], q[1] / degree


def _split_table(table: OpTable, degree: int, kv: float) -> OpTable:
    """``table`` on one rank's tokens; its attention kernels keep reading (and writing, backward: ``kv`` is then the
    keys' and values' bytes and their gradients') the whole sequence's keys and values."""
    flops, nbytes, dims = table.flops.copy(), table.bytes.copy(), table.dims_or_default().copy()
    flops[:, 1] /= degree
    dims[:, :, 1] /= degree
    attention = attention_kernels(table)
    nbytes[:, 1] = np.where(attention, (nbytes[:, 1] - kv) / degree + kv, nbytes[:, 1] / degree)
    return replace(table, flops=flops, bytes=nbytes, dims=dims)


def traffic_bytes(kv: float, degree: int) -> tuple[float, float]:
    """Bytes one rank sends in a layer, forward and backward, for the keys and values ``kv`` of the whole sequence
    (Note [context parallel traffic]): ``(c - 1) / c · kv`` and twice that, in either variant."""
    share = (degree - 1) / degree * kv
    return share, 2 * share


@dataclass(frozen=True)
class ContextParallel:
    """A context-parallel group and how it passes keys and values (Note [context parallel traffic]).

    Attributes:
        degree: ranks the sequence is split over (``c``).
        comm: one of :data:`CP_COMMS`.
        link: inside a node.
        nic: one GPU's share of the network (:attr:`sim.planning.parallel.cluster.Cluster.nic`); ``None``: the group is
            in one node (or the network is not modelled).
        inside: the most ranks of the group in one node, when it spans nodes.
        nodes: the nodes the group spans.
    """

    degree: int
    comm: str
    link: LinkSpec
    nic: LinkSpec | None = None
    inside: int = 1
    nodes: int = 1

    @classmethod
    def on(cls, cluster: Cluster, tensor_parallel: int, degree: int, comm: str) -> ContextParallel | None:
        """The group of ``degree`` ranks of a pipeline device split ``tensor_parallel`` ways, laid out on ``cluster``
        (Note [layout] in :mod:`sim.planning.parallel.cluster`); ``None`` for degree 1."""
        if degree == 1:
            return None
        inside, nodes = cluster.context_group(tensor_parallel, degree)
        nic = cluster.nic if nodes > 1 else None
        return cls(degree, comm, cluster.link, nic, inside, nodes)

    def seconds(self, kv: np.ndarray, forward_attention: np.ndarray, backward_attention: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, the seconds its key/value traffic adds to the forward and to the backward.

        Args:
            kv: per layer, the whole sequence's keys and values of one micro-batch, bytes.
            forward_attention: per layer, its attention kernel's forward seconds on this rank.
            backward_attention: the same, backward.
        """
        c = self.degree
        if self.comm == "all-gather":  # Note [keys and values apart]
            gather = np.array([KV_TENSORS * self._gather(x / KV_TENSORS) for x in kv])
            return gather, gather + np.array([KV_TENSORS * self._scatter(x / KV_TENSORS) for x in kv])
        link = self.link if self.nic is None else self.nic  # the ring runs at its slowest hop
        steps = [(kv / c / link.bandwidth + link.latency) * (kv > 0), (2 * kv / c / link.bandwidth + link.latency)
                 * (kv > 0)]
        return ((c - 1) * np.maximum(steps[0] - forward_attention / c, 0.0),
                (c - 1) * np.maximum(steps[1] - backward_attention / c, 0.0))

    def _gather(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if self.nic is None:
            return allgather_seconds(nbytes, self.degree, self.link)
        return hierarchical_allgather_seconds(nbytes, self.inside, self.nodes, self.link, self.nic)

    def _scatter(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if self.nic is None:
            return reduce_scatter_seconds(nbytes, self.degree, self.link)
        return hierarchical_reduce_scatter_seconds(nbytes, self.inside, self.nodes, self.link, self.nic)
