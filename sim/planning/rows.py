"""What a capacity plan answers: one row per configuration (:class:`PlanRow`) and the plan itself (:class:`Plan`).

Note [not simulated]: a configuration is checked for memory before it is simulated (its peak follows from the order
of its tasks alone, Note [peak as the allocator sees it] in :mod:`sim.planning.parallel.memory`), and one that does not
fit is not simulated: a step it cannot take has no time. Its row has ``fits`` false, ``simulated`` false, its memory
part by part, and NaN for the step, the throughput and the bubble (``null`` in JSON). A configuration whose model
state alone exceeds the device is not even replayed: its memory is that model state, a lower bound.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.planning.parallel.memory import MemoryParts

__all__ = ["Plan", "PlanRow", "SearchGain"]


def _finite(value: Any) -> Any:
    """NaN as ``None`` (JSON has no NaN)."""
    return None if isinstance(value, float) and math.isnan(value) else value


@dataclass(frozen=True)
class PlanRow:
    """One simulated configuration.

    Attributes:
        gpus: devices used (``tensor_parallel * context_parallel * stages * replicas``).
        stages: pipeline depth: devices per replica.
        replicas: data-parallel copies of the pipeline.
        chunks: micro-batches per replica per step.
        microbatch: samples in the largest micro-batch.
        checkpoint: ``never``, ``except_last`` or ``always`` (torchgpipe's, per stage), ``layers`` or
            ``selective`` (per layer; :mod:`sim.planning.parallel.recompute`).
        schedule: the name of a registered schedule (:data:`gpipe.schedule.SCHEDULES`).
        balance: layers per stage of the model (``stages * virtual`` stages; over the copies of a schedule of copies,
            DualPipe's two).
        step_seconds: one training step (see the module docstring).
        throughput: samples per second.
        bubble_fraction: mean idle fraction of the simulated pipeline.
        memory_bytes: per device, the peak the allocator reserves (``memory_parts``' totals).
        model_state_bytes: per device, weights, gradients and optimizer state of its stages.
        activation_bytes: per device, the peak bytes saved for backward (the simulator's).
        fits: every device fits in its memory.
        cost_per_million: dollars per million samples, if a price was given.
        best: the configuration the planner recommends.
        virtual: stages per device (Note [virtual stages]); 1 for a schedule without a layout.
        memory_parts: per device, its peak part by part (:class:`~sim.planning.parallel.memory.MemoryParts`).
        parameters: the parameters one device holds a share of: the model's, or one tensor-parallel rank's shard.
        allreduce_exposed_seconds: of the step, the gradient all-reduce the backward did not hide.
        tensor_parallel: ranks each layer is split over (Note [tensor parallel ranks] in
            :mod:`sim.planning.request`); memory and model state are per rank.
        zero: the ZeRO stage of its data parallelism (:mod:`sim.planning.parallel.zero`); 0: plain replicas.
        sequence_parallel: LayerNorms and dropouts split over the tensor-parallel ranks by tokens.
        simulated: false for a configuration that does not fit (Note [not simulated]).
        tokens_per_second: ``throughput`` times the tokens in a sample; ``None`` for a model without a sequence.
        mfu: model FLOPs utilisation: the model's FLOPs per step (forward and backward, no recompute, as its
            counted kernels execute them: a causal FlashAttention counts the half of the scores it computes) per
            second, over the dense peak of every GPU of the configuration in the compute dtype.
        hfu: hardware FLOPs utilisation: as ``mfu`` with the recomputed forward FLOPs counted too.
        bound: what bounds the step: the largest of ``compute``, ``bubble`` (devices idle inside the pipeline),
            ``tensor-parallel`` (its collectives), ``context-parallel`` (its key/value traffic that attention did not
            hide), ``all-to-all`` (expert traffic no compute hid), ``data-parallel`` (traffic the backward left
            exposed) and ``optimizer``; ``memory`` for a configuration that does not fit.
        context_parallel: ranks each sample's tokens are split over (:mod:`sim.planning.parallel.context_parallel`);
            memory, model state and ``microbatch`` (in whole samples) are per rank.
        reshard_after_forward: ZeRO-3's gathers before each backward as well as each forward (FSDP's default), or
            once a step (Note [zero traffic] in :mod:`sim.planning.parallel.zero`).
        shard_group: hybrid sharding's group of replicas (Note [hybrid sharding] in :mod:`sim.planning.sweep`);
            ``None``: ZeRO shards over every replica.
        expert_parallel: ranks a mixture of experts' routed experts are split over
            (:mod:`sim.planning.parallel.experts`); 1: none (or a dense model).
        expert_tensor_parallel: ranks each expert's FFN is split over.
        all_to_all_seconds: per step, on the busiest device, the seconds its expert all-to-alls run (dispatch and
            combine, forward and backward; :func:`sim.core.exposure.exposure`).
        all_to_all_exposed_seconds: of those, the seconds no task computed beside them: what an overlapped pair
            (DualPipe, DualPipe-V) did not hide; all of them for a schedule without pairs.
    """

    gpus: int
    stages: int
    replicas: int
    chunks: int
    microbatch: int
    checkpoint: str
    schedule: str
    balance: tuple[int, ...]
    step_seconds: float
    throughput: float
    bubble_fraction: float
    memory_bytes: tuple[int, ...]
    model_state_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    fits: bool
    cost_per_million: float | None = None
    best: bool = False
    virtual: int = 1
    memory_parts: tuple[MemoryParts, ...] = ()
    parameters: int = 0
    allreduce_exposed_seconds: float = 0.0
    tensor_parallel: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    simulated: bool = True
    tokens_per_second: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    bound: str = ""
    context_parallel: int = 1
    reshard_after_forward: bool = True
    shard_group: int | None = None
    expert_parallel: int = 1
    expert_tensor_parallel: int = 1
    all_to_all_seconds: float = 0.0
    all_to_all_exposed_seconds: float = 0.0

    @property
    def peak_memory_bytes(self) -> int:
        return max(self.memory_bytes)

    def to_dict(self) -> dict[str, Any]:
        flat = {k: _finite(v) for k, v in asdict(self).items()}
        return {**flat, "balance": list(self.balance), "memory_bytes": list(self.memory_bytes),
                "model_state_bytes": list(self.model_state_bytes), "activation_bytes": list(self.activation_bytes),
                "memory_parts": [p.to_dict() for p in self.memory_parts]}


@dataclass(frozen=True)
class SearchGain:
    """What the search found for one configuration.

    Attributes:
        configuration: the configuration's fields, its schedule aside.
        named: the schedule of its best named row.
        named_step: that row's step seconds.
        searched_step: the searched row's step seconds; ``None`` when not searched or it did not fit.
        gain: ``named_step / searched_step - 1`` (0.05: 5% more throughput); ``None`` likewise.
        method: how the search found it (:attr:`gpipe.schedule.search.SearchResult.method`), or why it did not run.
    """

    configuration: dict[str, Any]
    named: str
    named_step: float
    searched_step: float | None
    gain: float | None
    method: str

    def to_dict(self) -> dict[str, Any]:
        return {"configuration": dict(self.configuration), "named": self.named, "named_step": self.named_step,
                "searched_step": self.searched_step, "gain": self.gain, "method": self.method}


@dataclass(frozen=True)
class Plan:
    """The result of a sweep: what was asked and one row per configuration, the best marked.

    ``missing`` names each schedule asked for that got no row, with why (its layout or generator refused
    every shape of the sweep); ``searches`` says what the search gained on each configuration it searched
    (:mod:`sim.planning.search_plan`), whose searched rows are among ``rows`` as schedule ``searched``.
    """

    model: str
    batch: int
    device: str
    device_memory_bytes: int
    link: str
    training: str
    price_per_gpu_hour: float | None
    rows: tuple[PlanRow, ...]
    missing: Mapping[str, str] = field(default_factory=dict)
    network: str | None = None
    tokens_per_sample: int | None = None
    searches: tuple[SearchGain, ...] = ()
    skipped: int = 0
    """Configurations not evaluated: none could be among the fastest :attr:`PlanRequest.keep
    <sim.planning.request.PlanRequest.keep>` of its GPU count (Note [bounded sweep] in
    :mod:`sim.planning.sweep_workers`)."""
    expert_imbalance: float | None = None
    """A mixture of experts' routing imbalance assumed (1.0: balanced); ``None``: a dense model."""

    @property
    def best(self) -> PlanRow | None:
        """The recommended row, or ``None`` when nothing fits."""
        return next((r for r in self.rows if r.best), None)

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"model": self.model, "batch": self.batch, "device": self.device,
                "device_memory_bytes": self.device_memory_bytes, "link": self.link,
                "training": self.training, "price_per_gpu_hour": self.price_per_gpu_hour,
                "best": best.to_dict() if best else None, "rows": [r.to_dict() for r in self.rows],
                "missing": dict(self.missing), "network": self.network, "tokens_per_sample": self.tokens_per_sample,
                "searches": [g.to_dict() for g in self.searches], "skipped": self.skipped,
                "expert_imbalance": self.expert_imbalance}
