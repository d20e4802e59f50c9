"""Capacity planning: sweep pipeline configurations of a counted model on a hardware entry and rank them.

For every GPU count ``g`` and tensor-parallel degree ``t`` the planner tries each pipeline depth ``p`` that divides
``g / t`` (``g / (t p)`` data-parallel replicas of the pipeline; Note [tensor parallel ranks] in
:mod:`sim.planning.request`), each number of
micro-batches (chunks), each checkpoint
policy and each registered schedule (:data:`gpipe.schedule.SCHEDULES`), and for a schedule that
places several stages per device each number ``v`` of stages per device (Note [virtual stages]).
Each configuration is balanced by cost (:mod:`sim.planning.partition`), priced with the backward
split into B and W where the schedule has W tasks, simulated (:func:`sim.core.engine.simulate`) and
checked against device memory as the allocator sees it; :func:`plan` runs the sweep::

    step seconds  = simulated pipeline, the all-reduce across replicas overlapped (sim.planning.replicas;
                    hierarchical across nodes: sim.planning.cluster), then the optimizer step
    throughput    = global batch / step seconds                              (samples/s)
    memory        = per device, the peak the allocator reserves: model state, saved bytes, the running
                    task's working set, workspace, rounding (sim.planning.memory)      (fits or out of memory)
    cost          = gpus * price per GPU-hour / 3600 * 1e6 / throughput      ($ per million samples)
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Schedule, ScheduleKind, schedule_kind
from sim.core.config import SimConfig
from sim.core.engine import simulate
from sim.core.link import LinkSpec
from sim.planning.cluster import Cluster
from sim.planning.costs_from_flops import FlopCosts, Training, training_policy
from sim.planning.flops import ModelProfile
from sim.planning.hardware import DeviceSpec, get_device
from sim.planning.memory import (
    COPY_STREAMS,
    MemoryParts,
    device_memory,
    stage_backward_working_bytes,
    stage_working_bytes,
    workspace_bytes,
)
from sim.planning.partition import block_partition
from sim.planning.recompute import CHECKPOINTS, recompute_fraction, schedule_checkpoint
from sim.planning.replicas import step_seconds
from sim.planning.request import (
    GPUS_PER_NODE,
    check_request,
    check_tensor_parallel,
    default_training,
    resolve_link,
    resolve_network,
)

__all__ = ["GPUS_PER_NODE", "VIRTUAL", "Plan", "PlanRow", "block_partition", "check_request",
           "check_tensor_parallel", "default_training", "plan", "resolve_link", "resolve_network"]

MAX_CHUNKS = 128  # default sweep: powers of two up to this (a simulation grows with chunks x stages)
VIRTUAL = (1, 2, 4)  # default stages per device for a schedule with a layout (Note [virtual stages])


@dataclass(frozen=True)
class PlanRow:
    """One simulated configuration.

    Attributes:
        gpus: devices used (``tensor_parallel * stages * replicas``).
        stages: pipeline depth: devices per replica.
        replicas: data-parallel copies of the pipeline.
        chunks: micro-batches per replica per step.
        microbatch: samples in the largest micro-batch.
        checkpoint: ``never``, ``except_last`` or ``always`` (torchgpipe's, per stage), ``layers`` or
            ``selective`` (per layer; :mod:`sim.planning.recompute`).
        schedule: the name of a registered schedule (:data:`gpipe.schedule.SCHEDULES`).
        balance: layers per stage (``stages * virtual`` stages).
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
        memory_parts: per device, its peak part by part (:class:`~sim.planning.memory.MemoryParts`).
        parameters: the parameters one device holds a share of: the model's, or one tensor-parallel rank's shard.
        allreduce_exposed_seconds: of the step, the gradient all-reduce the backward did not hide.
        tensor_parallel: ranks each layer is split over (Note [tensor parallel ranks]); memory and model state
            are per rank.
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

    @property
    def peak_memory_bytes(self) -> int:
        return max(self.memory_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "balance": list(self.balance), "memory_bytes": list(self.memory_bytes),
                "model_state_bytes": list(self.model_state_bytes), "activation_bytes": list(self.activation_bytes),
                "memory_parts": [p.to_dict() for p in self.memory_parts]}


@dataclass(frozen=True)
class Plan:
    """The result of a sweep: what was asked and one row per configuration, the best marked.

    ``missing`` names each schedule asked for that got no row, with why (its layout or generator refused
    every shape of the sweep).
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
                "missing": dict(self.missing), "network": self.network}


# -- the sweep ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Point:
    gpus: int
    stages: int
    replicas: int
    chunks: int
    checkpoint: str
    schedule: str
    virtual: int = 1
    tensor_parallel: int = 1


# Note [virtual stages]: a schedule registered with a layout (``ScheduleKind.place``: several stages per device)
# runs ``v`` stages on each of the pipeline's ``p`` devices, ``n = v * p`` stages placed by ``layout(n, p)``; the
# sweep tries each ``v`` of ``virtual`` whose ``n`` the model's layers cover and whose placement the layout
# accepts (a V-shape takes ``v = 2`` only). A schedule without a layout runs one stage per device (``v = 1``).
def _virtuals(kind: ScheduleKind, depth: int, layers: int, virtual: Sequence[int], why: dict[str, str]) -> list[int]:
    if kind.place is None:
        return [1]
    out = []
    for v in virtual:
        if v * depth > layers:
            why[kind.name] = f"{v} stages on each of {depth} devices need {v * depth} layers, the model has {layers}"
            continue
        try:
            kind.layout(v * depth, depth)
        except ValueError as exc:
            why[kind.name] = str(exc)
            continue
        out.append(v)
    return out


def _points(gpus: Sequence[int], batch: int, layers: int, chunks: Sequence[int] | None,
            checkpoints: Sequence[str], schedules: Sequence[str], stages: Sequence[int] | None,
            virtual: Sequence[int], why: dict[str, str], replicas: Sequence[int] | None = None,
            pinned: int | None = None, tensor_parallel: Sequence[int] = (1,)) -> list[_Point]:
    out: list[_Point] = []
    kinds = [schedule_kind(s) for s in schedules]
    for t, g in ((t, g) for t in tensor_parallel for g in gpus):
        pipelines = g // t  # devices per tensor-parallel rank
        for n in (s for s in range(1, min(pipelines, layers) + 1)
                  if pipelines % s == 0 and (stages is None or s in stages)):
            r = pipelines // n
            if r > batch or (replicas is not None and r not in replicas):
                continue
            per_replica = math.ceil(batch / r)
            ms = chunks if chunks is not None else [2**k for k in range(8) if 2**k <= min(per_replica, MAX_CHUNKS)]
            vs = [(k.name, [v for v in _virtuals(k, n, layers, virtual, why) if pinned in (None, v * n)])
                  for k in kinds]
            for m in ms:
                if m > per_replica:
                    continue
                for ck in checkpoints:
                    out.extend(_Point(g, n, r, m, ck, s, v, t) for s, each in vs for v in each)
    return out


def _check(profile: ModelProfile, batch: int, gpus: Sequence[int], chunks: Sequence[int] | None,
           checkpoints: Sequence[str], schedules: Sequence[str], training: Training) -> None:
    check_request(batch, gpus, chunks)
    for ck in checkpoints:
        if ck not in CHECKPOINTS:
            raise ValueError(f"unknown checkpoint mode {ck!r}; use {', '.join(CHECKPOINTS)}")
        if ck == "selective" and profile.attention_core is None:
            raise ValueError("checkpoint selective recomputes the attention core, which this model has not "
                             "(a built-in gpt or llama with the math attention has)")
    for s in schedules:
        schedule_kind(s)  # unknown: a ValueError that lists the registered names
    size = {2: "16-bit", 4: "32-bit"}
    counted = profile.dtype.itemsize
    if counted != training.torch_dtype.itemsize:
        raise ValueError(f"the model was counted in {size.get(counted, profile.dtype)} but the training policy "
                         f"{training.name!r} computes in {training.compute}; count it in {training.torch_dtype}")


def _make_schedule(p: _Point) -> Schedule:
    """The point's schedule: ``v * p`` stages placed by the schedule's layout, or one stage per device."""
    kind = schedule_kind(p.schedule)
    checkpoint = schedule_checkpoint(p.checkpoint)  # Note [per-layer recompute] in sim.planning.recompute
    if kind.place is None:
        return kind(p.chunks, p.stages, checkpoint)
    return kind(p.chunks, p.stages * p.virtual, checkpoint, devices=p.stages)


def _per_device(values: Sequence[float], placement: Sequence[int], devices: int) -> list[float]:
    out = [0.0] * devices
    for j, d in enumerate(placement):
        out[d] += values[j]
    return out


def _run(p: _Point, costs: FlopCosts, batch: int, cluster: Cluster, config: SimConfig,
         balances: dict[tuple[int, int, int, str, int], tuple[int, ...]], price: float | None,
         why: dict[str, str], pinned: tuple[int, ...] | None = None, copy_streams: str = "shared") -> PlanRow | None:
    try:
        schedule = _make_schedule(p)
    except ValueError as exc:  # a shape the generator does not take (e.g. chunks not a multiple of devices)
        why[p.schedule] = str(exc)
        return None
    per_replica = math.ceil(batch / p.replicas)
    q, rem = divmod(per_replica, p.chunks)
    mb = q + (1 if rem else 0)
    scale = [(q + (1 if i < rem else 0)) / mb for i in range(p.chunks)] if rem else []
    n = p.stages * p.virtual
    key = (p.tensor_parallel, n, mb, p.checkpoint, p.chunks if p.checkpoint == "except_last" else 0)
    if pinned is not None:
        balances[key] = pinned
    elif key not in balances:
        fwd, bwd = costs.layer_seconds(mb)
        if p.checkpoint == "selective":
            bwd = bwd + costs.core_seconds(mb)
        balances[key] = block_partition(fwd * (1 + recompute_fraction(p.checkpoint, p.chunks)) + bwd, n)
    balance = balances[key]
    cost = costs.cost_model(balance, mb, scale, split=schedule.splits_weight_gradient, recompute=p.checkpoint)
    links = cluster.stage_links(schedule.placement, p.tensor_parallel, p.stages, p.replicas)
    timeline = simulate(schedule, cost, config if links is None else replace(config, stage_links=links))
    devices, placement = schedule.num_devices, schedule.placement
    state = [int(x) for x in _per_device([s.model_state_bytes for s in cost.stages], placement, devices)]
    activations = [timeline.peak_memory(d) for d in range(devices)]
    parts = device_memory(schedule, cost.stages, stage_working_bytes(costs.profile, balance, mb),
                          workspace_bytes(costs.device.name), scale,
                          stage_backward_working_bytes(costs.profile, balance, mb, costs.training.gradient_bytes),
                          copy_streams)
    memory = [x.total for x in parts]
    updates = _per_device(costs.update_seconds(balance), placement, devices)
    allreduce = None if cluster.network is None else \
        (lambda nbytes, d: cluster.allreduce_seconds(nbytes, p.tensor_parallel, p.stages, p.replicas, d))
    step, exposed = step_seconds(schedule, timeline, [s.gradient_bytes for s in cost.stages], updates,
                                 p.replicas, cluster.link, allreduce)
    throughput = batch / step if step > 0 else math.inf
    dollars = p.gpus * price / 3600 * 1e6 / throughput if price is not None else None
    return PlanRow(p.gpus, p.stages, p.replicas, p.chunks, mb, p.checkpoint, p.schedule, balance, step, throughput,
                   timeline.bubble_fraction(), tuple(memory), tuple(state), tuple(activations),
                   all(x <= costs.device.memory_bytes for x in memory), dollars, virtual=p.virtual,
                   memory_parts=tuple(parts), parameters=costs.profile.parameters, allreduce_exposed_seconds=exposed,
                   tensor_parallel=p.tensor_parallel)


def _mark_best(rows: list[PlanRow], objective: str) -> list[PlanRow]:
    fitting = [k for k, r in enumerate(rows) if r.fits]
    if not fitting:
        return rows
    if objective == "cost" and rows[fitting[0]].cost_per_million is not None:
        k = min(fitting, key=lambda k: (rows[k].cost_per_million or 0.0, rows[k].gpus))
    else:
        k = min(fitting, key=lambda k: (-rows[k].throughput, rows[k].gpus, rows[k].peak_memory_bytes))
    rows[k] = replace(rows[k], best=True)
    return rows


def plan(profile: ModelProfile | Mapping[int, ModelProfile], batch: int, device: DeviceSpec | str, gpus: Sequence[int],
         link: LinkSpec | str = "pcie", *, training: Training | str | None = None,
         chunks: Sequence[int] | None = None, checkpoints: Sequence[str] = CHECKPOINT_MODES,
         schedules: Sequence[str] | None = None, stages: Sequence[int] | None = None,
         virtual: Sequence[int] = VIRTUAL, balance: Sequence[int] | None = None,
         replicas: Sequence[int] | None = None,
         price_per_gpu_hour: float | None = None, objective: str = "throughput",
         kernel_seconds: float | None = None, model_name: str = "", progress: bool = False,
         copy_streams: str = "shared", tensor_parallel: Sequence[int] | None = None,
         gpus_per_node: int = GPUS_PER_NODE, network: LinkSpec | str | None = None,
         network_ports: int | None = None) -> Plan:
    """Sweep, balance, simulate and rank pipeline configurations (see the module docstring).

    Args:
        profile: the counted model (:func:`sim.planning.flops.count_layers`, in the policy's dtype), or for each
            tensor-parallel degree the count of one rank's shard (``{1: whole, 2: shard, ...}``).
        batch: global batch, samples per step.
        device: a :class:`~sim.planning.hardware.DeviceSpec` or catalog name.
        gpus: GPU counts to try.
        link: a :class:`~sim.core.link.LinkSpec`, a catalog name, or ``nvlink``/``pcie`` (the
            generation that comes with the device).
        training: precision and optimizer (:data:`sim.planning.costs_from_flops.TRAINING`); default
            :func:`default_training`.
        chunks: micro-batch counts to try; default powers of two up to the batch per replica (at most 128).
        checkpoints: checkpoint policies to try (:data:`sim.planning.recompute.CHECKPOINTS`).
        schedules: schedule names to try; default every registered one (:data:`gpipe.schedule.SCHEDULES`).
        stages: pipeline depths (devices per replica) to allow; default every divisor of each GPU count.
        virtual: stages per device to try for a schedule registered with a layout (Note [virtual stages]).
        balance: layers per stage, pinned (a published partition): only pipelines of ``len(balance)`` stages
            run, and none is balanced by the planner.
        replicas: data-parallel copies to allow; default every one the GPU counts give.
        price_per_gpu_hour: dollars, to price each row per million samples.
        objective: ``throughput`` (default) or ``cost`` (cheapest per sample; needs a price).
        kernel_seconds: fixed cost per kernel; ``None``: the device's (:mod:`sim.planning.costs_from_flops`).
        model_name: for the result's display.
        progress: show a ``tqdm`` progress bar on stderr.
        copy_streams: ``shared`` (this project's executor) or ``per_microbatch`` (torchgpipe's copy streams; Note
            [a copy stream per micro-batch] in :mod:`sim.planning.memory`).
        tensor_parallel: tensor-parallel degrees to try (Note [tensor parallel ranks]); default the degrees of
            ``profile`` (1 for one count). Their all-reduces run over ``link``.
        gpus_per_node: GPUs in a node, the most a tensor-parallel group spans.
        network: one port of the network between nodes (a catalog name or a LinkSpec); ``None``: every transfer
            on ``link``, as in one node. With it, stages and replicas are laid out on nodes
            (:mod:`sim.planning.cluster`): a stage copy that crosses nodes and a data-parallel all-reduce that
            spans them use the network.
        network_ports: network ports per node; default one per GPU.

    Returns:
        A :class:`Plan`; its ``best`` row is the fastest (or cheapest) configuration that fits.

    Raises:
        KeyError: unknown device, link or training policy.
        ValueError: a batch below 1 or below the chunks asked for, fewer than one GPU, an unknown
            checkpoint mode, schedule, objective or copy streams, a price below 0, a balance that does not
            cover the model's layers, a tensor-parallel degree above a node, not dividing a GPU count or without
            its shard's count, or nothing to sweep.
    """
    dev = get_device(device) if isinstance(device, str) else device
    policy = default_training(dev) if training is None else training_policy(training) \
        if isinstance(training, str) else training
    lk = resolve_link(link, dev)
    # by default every registered schedule, several stages per device where it has a layout (Note [virtual stages])
    schedules = tuple(SCHEDULES) if schedules is None else tuple(schedules)
    profiles = {profile.tensor_parallel: profile} if isinstance(profile, ModelProfile) else dict(profile)
    degrees = tuple(profiles) if tensor_parallel is None else tuple(dict.fromkeys(tensor_parallel))
    check_tensor_parallel(degrees, gpus, gpus_per_node)
    for t in degrees:
        if t not in profiles or profiles[t].tensor_parallel != t:
            raise ValueError(f"tensor parallel {t} needs the count of one rank's shard (a model built with "
                             f"tensor_parallel={t}); got counts for {sorted(profiles)}")
        _check(profiles[t], batch, gpus, chunks, checkpoints, schedules, policy)
    layers = len(profiles[degrees[0]])
    if any(len(profiles[t]) != layers for t in degrees):
        raise ValueError("the counts of the tensor-parallel shards have different numbers of layers")
    if copy_streams not in COPY_STREAMS:
        raise ValueError(f"copy_streams must be one of {', '.join(COPY_STREAMS)}, got {copy_streams!r}")
    if copy_streams == "per_microbatch" and "layers" in checkpoints:
        # Note [a copy stream per micro-batch] counts a stage's checkpoint as the input it received
        raise ValueError("checkpoint layers (Megatron-LM's) runs with one copy stream; per_microbatch copy streams "
                         "are torchgpipe's, whose checkpoint is a stage's input")
    if objective not in ("throughput", "cost"):
        raise ValueError(f"objective must be 'throughput' or 'cost', got {objective!r}")
    if price_per_gpu_hour is not None and not 0 <= price_per_gpu_hour < math.inf:
        raise ValueError(f"the price per GPU-hour must be a finite number >= 0, got {price_per_gpu_hour}")
    if not virtual or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in virtual):
        raise ValueError(f"virtual lists stages per device, integers >= 1, got {list(virtual)}")
    pinned = _check_pins(balance, replicas, layers)
    why: dict[str, str] = {}
    points = _points(gpus, batch, layers, chunks, checkpoints, schedules, stages, virtual, why, replicas,
                     len(pinned) if pinned is not None else None, degrees)
    costs = {t: FlopCosts(profiles[t], dev, policy, kernel_seconds, tensor_link=lk) for t in degrees}
    config = SimConfig(link=lk)
    if network_ports is not None and (isinstance(network_ports, bool) or not isinstance(network_ports, int)
                                      or network_ports < 1):
        raise ValueError(f"network ports per node must be an integer >= 1, got {network_ports!r}")
    cluster = Cluster(lk, gpus_per_node, None if network is None else resolve_network(network), network_ports)
    balances: dict[tuple[int, int, int, str, int], tuple[int, ...]] = {}
    run = [_run(p, costs[p.tensor_parallel], batch, cluster, config, balances, price_per_gpu_hour, why, pinned,
                copy_streams) for p in _progress(points, progress)]
    rows = [r for r in run if r is not None]
    if not rows:
        reasons = "".join(f"; {s}: {w}" for s, w in why.items())
        pins = (f" with balance {list(pinned)}" if pinned is not None else "") + \
            (f" and replicas {list(replicas)}" if replicas is not None else "")
        raise ValueError(f"nothing to sweep: no configuration of {list(gpus)} GPUs fits batch {batch} "
                         f"and {layers} layers{pins}{reasons}")
    ran = {r.schedule for r in rows}
    missing = {s: why.get(s, "no configuration") for s in schedules if s not in ran}
    return Plan(model_name, batch, dev.name, dev.memory_bytes, lk.name, policy.name, price_per_gpu_hour,
                tuple(_mark_best(rows, objective)), missing, cluster.network.name if cluster.network else None)


def _check_pins(balance: Sequence[int] | None, replicas: Sequence[int] | None,
                layers: int) -> tuple[int, ...] | None:
    if replicas is not None and (not replicas or any(isinstance(r, bool) or not isinstance(r, int) or r < 1
                                                     for r in replicas)):
        raise ValueError(f"replicas lists data-parallel copies, integers >= 1, got {list(replicas)}")
    if balance is None:
        return None
    pinned = tuple(int(b) for b in balance)
    if not pinned or min(pinned) < 1 or sum(pinned) != layers:
        raise ValueError(f"balance {list(pinned)} must give every stage at least one layer and cover the model's "
                         f"{layers} layers exactly (it covers {sum(pinned)})")
    return pinned


def _progress(points: list[_Point], show: bool) -> Iterator[_Point]:
    if not show:
        yield from points
        return
    from tqdm import tqdm

    yield from tqdm(points, desc="simulating", unit="config", leave=False)

