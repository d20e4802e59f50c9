"""Expert parallelism: a mixture of experts' routed experts split over ``ep`` GPUs, folded onto a stage's groups,
with the all-to-all that sends each token to its experts and back.

Megatron-Core's parallel folding (Liu et al., 2025, "MoE Parallel Folding", arXiv 2504.14960; its
``expert_tensor_parallel_size``): the attention of a stage runs on ``t x c x d`` GPUs (tensor, context, data
parallel); its experts run on the same GPUs regrouped as ``etp x ep x edp``::

    attention   t x c x d          tensor x context x data parallel
    experts     etp x ep x edp     expert tensor x expert x expert-data parallel;  ep * etp divides t * c * d,
                                   edp = t * c * d / (ep * etp)

A rank holds ``E / ep`` routed experts (each split ``etp`` ways) and receives the tokens routed to them from the
``ep`` ranks of its group. Their gradients are reduced, and under ZeRO their optimizer state sharded, over the
``edp`` ranks that hold the same experts; every other parameter over the whole data-parallel group
(:func:`sharded_state`).

Note [all-to-all bytes]: a rank routes ``T`` tokens (a micro-batch's ``b s / c``) to ``k`` experts each, a hidden
vector of ``h`` elements of ``e`` bytes per copy. Per MoE layer, forward and backward::

    dispatch   T k h e  bytes to the experts          combine   T k h e  bytes back
    forward    dispatch, combine                     backward  the combine's gradient out, the dispatch's back

four all-to-alls of ``T k h e`` a layer (:func:`all_to_all_bytes`). The counter records each as a marker whose
bytes are that message (:data:`~sim.planning.counting.counts.ALL_TO_ALL`); the busiest rank receives ``imbalance``
times a balanced share, and the exchange lasts until it has (:class:`ExpertParallel`). Under an FP8 policy the
all-to-alls toward the experts move FP8 (the forward dispatch, the backward of the combine) with one 32-bit scale
per 128 elements, and those back move BF16, as DeepSeek-V3 runs them (arXiv 2412.19437, section 3.3,
"Low-Precision Communication": "we quantize the activation before MoE up-projections into FP8 and then apply
dispatch components ... A similar strategy is applied to the activation gradient before MoE down-projections. For
both the forward and backward combine components, we retain them in BF16").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.core.link import LinkSpec
from sim.core.rings import all_to_all_seconds, node_limited_all_to_all_seconds
from sim.planning.counting.counts import ALL_TO_ALL, ModelProfile
from sim.planning.parallel.cluster import Cluster
from sim.planning.parallel.zero import ModelState, sharded_state

if TYPE_CHECKING:
    from sim.planning.counting.training import Training

__all__ = ["FP8_DISPATCH", "ExpertParallel", "Routing", "all_to_all_bytes", "check_experts", "check_fold",
           "dispatch_buffer_bytes", "expert_data_group", "folds", "sharded_state_of_experts"]

#: Bytes an FP8 all-to-all moves per BF16 byte: one byte an element and a 32-bit scale per 1 x 128 tile (DeepSeek-V3's
#: fine-grained quantization, arXiv 2412.19437, section 3.3.2) over two bytes an element.
FP8_DISPATCH = (1 + 4 / 128) / 2


@dataclass(frozen=True)
class Routing:
    """What the planner needs of a model's router.

    Attributes:
        experts: routed experts ``E``.
        per_token: experts each token is routed to, ``k``.
        node_limit: the most nodes a token's experts may span (DeepSeek-V3's node-limited routing, ``M``); ``None``:
            no limit.
    """

    experts: int
    per_token: int
    node_limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("experts", "per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"routing needs {name} an integer >= 1, got {value!r}")
        if self.per_token > self.experts:
            raise ValueError(f"each token is routed to k = {self.per_token} experts, more than the {self.experts} "
                             "the model has")
        limit = self.node_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"the node limit is a number of nodes, an integer >= 1, got {limit!r}")


def check_experts(routing: Routing | None, expert_parallel: Sequence[int], expert_tensor_parallel: Sequence[int],
                  imbalance: float) -> None:
    """Refuse expert-parallel degrees below 1 or not dividing the experts, expert tensor-parallel degrees below 1, an
    imbalance below 1, and any degree above 1 for a model without experts (``routing`` ``None``).

    Raises:
        ValueError: with a one-line message.
    """
    for name, degrees in (("expert parallel", expert_parallel), ("expert tensor parallel", expert_tensor_parallel)):
        if not degrees or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in degrees):
            raise ValueError(f"{name} degrees are integers >= 1, got {list(degrees)}")
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) or not 1 <= imbalance < math.inf:
        raise ValueError(f"the expert imbalance is the busiest rank's tokens over a balanced share, a number >= 1, "
                         f"got {imbalance!r}")
    if routing is None:
        if max(expert_parallel) > 1 or max(expert_tensor_parallel) > 1:
            raise ValueError("expert parallelism splits a mixture of experts' routed experts; this model has none")
        return
    for ep in expert_parallel:
        if routing.experts % ep:
            raise ValueError(f"expert parallel {ep} does not divide the model's {routing.experts} routed experts")


def folds(tensor_parallel: int, context_parallel: int, data_group: int, expert_parallel: int,
          expert_tensor_parallel: int) -> bool:
    """Whether ``ep x etp`` expert ranks fold onto a stage's ``t x c x d`` GPUs (the module docstring)."""
    return (tensor_parallel * context_parallel * data_group) % (expert_parallel * expert_tensor_parallel) == 0


def check_fold(gpus: Sequence[int], stages: Sequence[int] | None, expert_parallel: Sequence[int],
               expert_tensor_parallel: Sequence[int]) -> None:
    """Refuse an ``ep x etp`` that folds onto no stage of the GPU counts: it must divide ``g / p`` for some count
    ``g`` and pipeline depth ``p`` (of ``stages``; ``None``: any divisor).

    Raises:
        ValueError: with a one-line message.
    """
    for ep in expert_parallel:
        for etp in expert_tensor_parallel:
            width = ep * etp
            if width > 1 and not any(g % p == 0 and (g // p) % width == 0 for g in gpus
                       for p in (stages if stages is not None else range(1, g + 1))):
                depths = "" if stages is None else f" in pipelines of {', '.join(map(str, stages))} stages"
                raise ValueError(f"expert parallel {ep} x expert tensor parallel {etp} = {width} GPUs does not fold "
                                 f"onto the GPUs of a stage of {', '.join(map(str, gpus))} GPUs{depths}")


def expert_data_group(tensor_parallel: int, context_parallel: int, data_group: int, expert_parallel: int,
                      expert_tensor_parallel: int) -> int:
    """The ranks that hold the same experts: ``t * c * d / (ep * etp)`` (the module docstring)."""
    return tensor_parallel * context_parallel * data_group // (expert_parallel * expert_tensor_parallel)


def all_to_all_bytes(tokens: float, per_token: int, hidden: int, itemsize: int) -> float:
    """The message one rank sends in one all-to-all of a MoE layer, ``T k h e`` (Note [all-to-all bytes]); a layer
    runs two forward and two backward."""
    return tokens * per_token * hidden * itemsize


# Note [all-to-all in the layout]: the group's ranks sit as the layout puts them (Note [experts' layout] in
# sim.planning.parallel.cluster): in one node it is the flat all-to-all on NVLink; across nodes, with node-limited
# routing, DeepSeek-V3's two hops (Note [two hops] in sim.core.rings), the limit capped at the nodes the group spans;
# without a limit the flat all-to-all, each peer across nodes reached on one GPU's share of the network.
@dataclass(frozen=True)
class ExpertParallel:
    """An expert-parallel group and how its all-to-alls run (Note [all-to-all in the layout]).

    Attributes:
        degree: ranks the routed experts are split over (``ep``).
        link: inside a node.
        nic: one GPU's share of the network; ``None``: the group is in one node (or the network is not modelled).
        inside: the most ranks of the group in one node.
        nodes: the nodes the group spans.
        routing: the model's router.
        imbalance: the busiest rank's tokens over a balanced share (>= 1).
        fp8_dispatch: the all-to-alls toward the experts move FP8 (Note [all-to-all bytes]).
    """

    degree: int
    link: LinkSpec
    routing: Routing
    nic: LinkSpec | None = None
    inside: int = 1
    nodes: int = 1
    imbalance: float = 1.0
    fp8_dispatch: bool = False

    @classmethod
    def on(cls, cluster: Cluster, degree: int, tensor_parallel: int, routing: Routing, imbalance: float = 1.0,
           fp8_dispatch: bool = False) -> ExpertParallel:
        """The group of ``degree`` ranks ``tensor_parallel`` GPUs apart laid out on ``cluster``."""
        inside, nodes = cluster.expert_group(tensor_parallel, degree)
        nic = cluster.nic if nodes > 1 else None
        if nodes > 1 and nic is None:  # no network modelled: every rank on the link, as in one node
            inside, nodes = degree, 1
        return cls(degree, cluster.link, routing, nic, inside, nodes, imbalance, fp8_dispatch)

    def exchanges(self, nbytes: np.ndarray, layer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Seconds and bytes sent of each all-to-all of one pass, in order: ``nbytes`` each (the counted message),
        ``layer`` the layer each is in. A layer's first, third, ... move toward the experts: the forward's dispatch,
        and the backward's gradient of the combine, which runs first (Note [all-to-all bytes])."""
        nth = np.arange(len(layer)) - np.searchsorted(layer, layer)  # its place among its layer's
        toward = [n % 2 == 0 for n in nth]
        return (np.array([self.seconds(float(b), t) for b, t in zip(nbytes, toward, strict=True)]),
                np.array([self.sent(float(b), t) for b, t in zip(nbytes, toward, strict=True)]))

    def sent(self, nbytes: float, toward_experts: bool) -> float:
        """The bytes the busiest rank moves in one all-to-all whose counted message is ``nbytes``: ``imbalance``
        times them, in FP8 toward the experts under an FP8 policy (Note [all-to-all bytes])."""
        return nbytes * self.imbalance * (FP8_DISPATCH if self.fp8_dispatch and toward_experts else 1.0)

    def seconds(self, nbytes: float, toward_experts: bool) -> float:
        """Seconds of one all-to-all whose counted message is ``nbytes`` (Note [all-to-all in the layout])."""
        sent = self.sent(nbytes, toward_experts)
        if self.nic is None:
            return all_to_all_seconds(sent, self.degree, self.link)
        limit = self.routing.node_limit
        if limit is None:
            return all_to_all_seconds(sent, self.degree, self.link, self.inside, self.nic)
        return node_limited_all_to_all_seconds(sent, self.inside, self.nodes, self.link, self.nic,
                                               self.routing.per_token, limit)


# Note [dispatch buffers]: an all-to-all sends from one buffer and receives into another. The received rows are the
# experts' input, which the counter already holds (the output of its marker, saved for the experts' backward); the
# rows sent, the permuted tokens, live only while the exchange runs, beside the layer's input and output: one
# message of the busiest rank (``imbalance`` times the counted one), in the forward and again in the backward.
def dispatch_buffer_bytes(profile: ModelProfile, balance: Sequence[int], microbatch: int,
                          imbalance: float = 1.0) -> list[int]:
    """Per stage of ``balance``, the largest all-to-all message of its layers at ``microbatch`` samples: the send
    buffer its working set holds while the exchange runs (Note [dispatch buffers]); 0 for a stage without one."""
    out, start = [], 0
    for size in balance:
        largest = 0.0
        for layer in profile.layers[start:start + size]:
            table = layer.forward
            mine = table.collectives_or_default() == ALL_TO_ALL
            if mine.any():
                largest = max(largest, float((table.bytes[mine, 0] + table.bytes[mine, 1] * microbatch).max()))
        out.append(math.ceil(largest * imbalance))
        start += size
    return out


@dataclass(frozen=True)
class _Bytes:
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int


def sharded_state_of_experts(parameter_bytes: int, gradient_bytes: int, optimizer_bytes: int, parameters: int,
                             expert_parameters: int, training: Training, zero: int, data_group: int,
                             expert_group: int) -> ModelState:
    """The model state one device holds for a stage whose ``parameters`` include ``expert_parameters`` of routed
    experts (this rank's shard): ZeRO shards those over the ``expert_group`` (``edp``) and the rest over the
    ``data_group`` (:func:`sim.planning.parallel.zero.sharded_state`); each byte count splits as the parameters do.

    Raises:
        ValueError: as :func:`~sim.planning.parallel.zero.sharded_state`, or more expert parameters than parameters.
    """
    if not 0 <= expert_parameters <= parameters:
        raise ValueError(f"{expert_parameters} expert parameters of a stage of {parameters}")
    share = expert_parameters / parameters if parameters else 0.0

    def part(nbytes: int, mine: bool) -> int:
        experts = round(nbytes * share)
        return experts if mine else nbytes - experts

    out = []
    for mine, count, group in ((False, parameters - expert_parameters, data_group),
                               (True, expert_parameters, expert_group)):
        held = _Bytes(part(parameter_bytes, mine), part(gradient_bytes, mine), part(optimizer_bytes, mine))
        out.append(sharded_state(held, count, training, zero, group))
    return ModelState(*(a + b for a, b in zip(
        (out[0].parameters, out[0].gradients, out[0].optimizer),
        (out[1].parameters, out[1].gradients, out[1].optimizer), strict=True)))
