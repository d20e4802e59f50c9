"""The planner's sweep: one configuration of the sweep's space (:mod:`sim.planning.parallel.configurations`) evaluated.

:class:`Sweep` evaluates a configuration: balance its stages by cost, price them, replay its task order for memory
and, if it fits, simulate it with its data-parallel collectives (Note [not simulated] in :mod:`sim.planning.rows`).

Note [reuse in a sweep]: what repeats across configurations is computed once per sweep: a balance per (degree,
stages, micro-batch, policy), a stage pricing per balance, a schedule per (name, shape, recompute), which the
per-layer policies share with the schedule's own (``layers`` runs ``always``) and two schedules with the same tasks
in the same places share with each other, and a simulation per (schedule, pricing, links, data-parallel group and
its sharding), whose collectives are part of it. A large model's sweep is mostly configurations that do not fit;
they cost a replay of their task order, or nothing at all when their model state alone is too large.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gpipe.schedule import Schedule
from gpipe.schedule.timeline import COLLECTIVE, Timeline
from sim.core.collectives import Gather, add_collectives
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.exposure import exposure
from sim.core.rings import allreduce_seconds
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import OpTable
from sim.planning.parallel.cluster import Cluster
from sim.planning.parallel.configurations import Configuration, make_schedule
from sim.planning.parallel.context_parallel import ContextParallel, split_sequence
from sim.planning.parallel.experts import ExpertParallel, dispatch_buffer_bytes, sharded_state_of_experts
from sim.planning.parallel.memory import (
    MemoryParts,
    device_memory,
    round_block,
    round_segment,
    stage_backward_working_bytes,
    stage_working_bytes,
    workspace_bytes,
)
from sim.planning.parallel.partition import block_partition
from sim.planning.parallel.recompute import inside_backward, inside_table, recompute_fraction, schedule_checkpoint
from sim.planning.parallel.replicas import step_seconds
from sim.planning.parallel.zero import (
    Kind,
    after_step_bytes,
    compute_copy_bytes,
    sharded_state,
    stage_collectives,
    transient_bytes,
)
from sim.planning.request import PlanRequest
from sim.planning.rows import PlanRow

__all__ = ["Sweep"]

# simulations kept: configurations that share one are close in the sweep's order (the schedules of one shape, then the
# ZeRO stages of one schedule; :func:`configurations`), and a timeline holds a span per task
TIMELINES_KEPT = 32
NAN = math.nan

# Note [expert gradients]: a stage's routed experts are held alike by its ``edp`` expert-data-parallel ranks only
# (sim.planning.parallel.experts), so their gradients reduce, and under ZeRO their optimizer
# state and its step shard, over that group; every other parameter over the data-parallel group. A unit of the
# stage's collectives (Note [units] in sim.planning.parallel.zero) carries the stage's share of expert parameters and
# runs both, one after the other on the device's communication stream. The all-gather after a ZeRO-1 or -2 step is
# priced over the data-parallel group for the whole copy, the experts' part included: an upper bound.


def _per_device(values: Sequence[float], placement: Sequence[int], devices: int) -> list[float]:
    out = [0.0] * devices
    for j, d in enumerate(placement):
        out[d] += values[j]
    return out


class Sweep:
    """Evaluates the configurations of one request, reusing what repeats (Note [reuse in a sweep]): its counts priced
    on the device (one :class:`~sim.planning.costs.from_flops.FlopCosts` per ``(tensor_parallel,
    sequence_parallel, context_parallel, expert_parallel, expert_tensor_parallel)`` count, :attr:`costs`) and laid
    out on the machine (:attr:`cluster`; in Megatron-Core's order where experts are split, Note [experts' layout]
    in :mod:`sim.planning.parallel.cluster`).

    Raises:
        KeyError: the device has no peak for the policy's dtype, or its roofline lacks an operator the model runs
            (:class:`FlopCosts`).
        ValueError: a negative ``kernel_seconds`` (:class:`FlopCosts`).
    """

    def __init__(self, request: PlanRequest) -> None:
        device, policy, link = request.device_spec, request.policy, request.link_spec
        counts = request.counts
        self.request = request
        self.cluster = Cluster(link, request.gpus_per_node, request.network_spec, request.network_ports,
                               data_inside=max(request.expert_parallel) > 1)
        routing, fp8 = request.routing, policy.other_compute is not None

        def experts(ep: int, etp: int) -> ExpertParallel | None:
            if ep == 1 or routing is None:
                return None
            return ExpertParallel.on(self.cluster, ep, etp, routing, request.expert_imbalance, fp8)
        self.costs = {(t, sp, c, ep, etp): FlopCosts(
            split_sequence(counts[(t, sp, ep, etp)], c), device, policy, request.kernel_seconds, tensor_link=link,
            context=ContextParallel.on(self.cluster, t, c, request.cp_comm), experts=experts(ep, etp))
            for t, sp, ep, etp in request.shards for c in request.contexts}
        self.batch, self.price = request.batch, request.price_per_gpu_hour
        self.pinned = None if request.balance is None else tuple(request.balance)
        self.copy_streams, self.tokens = request.copy_streams, request.tokens_per_sample
        self.config = SimConfig(link=self.cluster.link)
        self.why: dict[str, str] = {}
        self._balances: dict[tuple[object, ...], tuple[int, ...]] = {}
        self._schedules: dict[tuple[object, ...], Schedule | str] = {}  # a schedule, or why its generator refused
        self._given: dict[int, Schedule] = {}  # held, so that no other schedule takes an id a timeline is kept by
        self._stages: dict[tuple[object, ...], tuple[StageCost, ...]] = {}
        self._timelines: dict[tuple[object, ...], Timeline] = {}  # the latest (Note [reuse in a sweep])
        self.last_timeline: Timeline | None = None  # of the configuration evaluated last, if it was simulated
        self._tasks: dict[tuple[object, ...], list[Schedule]] = {}  # schedules by (m, n, devices, checkpoint)
        self._counted: dict[tuple[int, bool, int, int, int], tuple[tuple[float, float], ...]] = {}
        self._inside: dict[tuple[tuple[int, bool, int, int, int], str], tuple[float, float]] = {}  # recomputed in B
        self._work: dict[tuple[object, ...], tuple[float, float]] = {}  # floor's: a micro-batch's compute, its chain
        # each stage's sharded state, working sets and collectives per data-parallel layout (the latest few)
        self._shards: dict[tuple[object, ...], tuple[list[StageCost], list[int], list[int]]] = {}

    def _canonical(self, schedule: Schedule) -> Schedule:
        """``schedule``, or an earlier one of this sweep with the same tasks in the same places (interleaved 1F1B
        with one stage per device is 1F1B), so that they share one simulation (Note [reuse in a sweep])."""
        shape = (schedule.m, schedule.n, schedule.num_devices, schedule.checkpoint)
        same = self._tasks.setdefault(shape, [])
        for other in same:
            if other.placement == schedule.placement and other.tasks == schedule.tasks:
                return other
        same.append(schedule)
        return schedule

    def _balance(self, p: Configuration, costs: FlopCosts, mb: int, copies: int) -> tuple[int, ...]:
        """The model's stages of ``p`` balanced: its ``stages * virtual`` slots over the schedule's ``copies`` (Note
        [copies in the sweep])."""
        if self.pinned is not None:
            return self.pinned
        n = p.stages * p.virtual // copies
        key = (p.count_key, n, mb, p.checkpoint,
               p.chunks if p.checkpoint == "except_last" else 0)
        if key not in self._balances:
            fwd, bwd = costs.layer_seconds(mb)
            if inside_backward(p.checkpoint):
                bwd = bwd + costs.core_seconds(mb, p.checkpoint)
            self._balances[key] = block_partition(fwd * (1 + recompute_fraction(p.checkpoint, p.chunks)) + bwd, n)
        return self._balances[key]

    def floor(self, p: Configuration) -> float:
        """A lower bound on ``p``'s step seconds (Note [bounded sweep] in :mod:`sim.planning.sweep_workers`): its
        replica's compute, recompute included, spread evenly over its pipeline's devices, or one micro-batch's forward
        and input-gradient chain through every stage, whichever is longer. Cheap: no balance, schedule or replay."""
        per_replica = math.ceil(self.batch / p.replicas)
        mb = -(-per_replica // p.chunks)
        key = (p.count_key, mb, p.checkpoint,
               p.chunks if p.checkpoint == "except_last" else 0)
        work = self._work.get(key)
        if work is None:
            costs = self.costs[p.count_key]
            fwd, bwd = costs.layer_seconds(mb)
            core = float(costs.core_seconds(mb, p.checkpoint).sum()) if inside_backward(p.checkpoint) else 0.0
            spread = float(fwd.sum()) * (1 + recompute_fraction(p.checkpoint, p.chunks)) + float(bwd.sum()) + core
            # the chain: F of micro-batch 0 on every stage, then its B back (a split B without W; a recompute may
            # run while the gradient travels, so it is off the chain; selective's is inside B)
            chain = float(fwd.sum()) + float(costs.split_backward_seconds(mb)[0].sum()) + core
            work = self._work[key] = (spread, chain)
        # an uneven last micro-batch runs scaled (CostModel's microbatch_scale); the first is whole
        return max(per_replica / mb * work[0] / p.stages, work[1])

    def evaluate(self, p: Configuration, given: Schedule | None = None) -> PlanRow | None:
        """The row of ``p``, or ``None`` (its reason in :attr:`why`) where its schedule refuses the shape.

        ``given``: a schedule of ``p``'s shape to run in place of the one ``p.schedule`` names (a searched one,
        :mod:`sim.planning.search_plan`); the row is named ``p.schedule``."""
        shape = (p.schedule, p.chunks, p.stages, p.virtual, schedule_checkpoint(p.checkpoint))
        if given is None and shape not in self._schedules:
            try:
                self._schedules[shape] = self._canonical(make_schedule(p))
            except ValueError as exc:  # a shape the generator does not take (e.g. chunks not a multiple of devices)
                self._schedules[shape] = str(exc)
        self.last_timeline = None
        schedule = self._schedules[shape] if given is None else self._given.setdefault(id(given), given)
        if isinstance(schedule, str):
            self.why[p.schedule] = schedule
            return None
        costs = self.costs[p.count_key]
        per_replica = math.ceil(self.batch / p.replicas)
        q, rem = divmod(per_replica, p.chunks)
        mb = q + (1 if rem else 0)
        scale = tuple((q + (1 if i < rem else 0)) / mb for i in range(p.chunks)) if rem else ()
        balance = self._balance(p, costs, mb, schedule.copies)
        split = schedule.splits_weight_gradient
        key = (p.count_key, balance, mb, split, p.checkpoint)
        if key not in self._stages:
            self._stages[key] = costs.stages(balance, mb, split, p.checkpoint)
        # Note [copies in the sweep]: a schedule of copies (DualPipe) balances the model's stages and runs each slot
        # as the stage it copies (Note [stage slots] in gpipe.schedule.schedule); each slot holds its own parameters,
        # gradients and optimizer state and reduces its gradients over the data-parallel group. The sum of the two
        # copies' gradients, between the two devices that hold them, is not priced: one stage's gradients on the
        # link or the network once a step, where the data-parallel reduction of both copies is.
        slots = [schedule.model_stage(j) for j in range(schedule.n)]
        whole = tuple(self._stages[key][s] for s in slots)  # each stage's model state unsharded
        devices, placement = schedule.num_devices, schedule.placement
        working = stage_working_bytes(costs.profile, balance, mb)
        backward = stage_backward_working_bytes(costs.profile, balance, mb, costs.training.gradient_bytes)
        if costs.experts is not None:  # Note [dispatch buffers] in sim.planning.parallel.experts
            sent = dispatch_buffer_bytes(costs.profile, balance, mb, costs.experts.imbalance)
            working, backward = ([w + b for w, b in zip(x, sent, strict=True)] for x in (working, backward))
        working, backward = [working[s] for s in slots], [backward[s] for s in slots]
        stages: Sequence[StageCost] = whole
        if p.data_group > 1:
            shard_key = (key, placement, p.zero, p.replicas, p.context_parallel, p.reshard, p.shard_group,
                         p.expert_parallel, p.expert_tensor_parallel)
            if shard_key not in self._shards:
                if len(self._shards) >= TIMELINES_KEPT:
                    self._shards.pop(next(iter(self._shards)))
                self._shards[shard_key] = self._sharded(p, costs, balance, mb, whole, working, backward, placement,
                                                        slots)
            stages, working, backward = self._shards[shard_key]
        state = [int(x) for x in _per_device([s.model_state_bytes for s in stages], placement, devices)]
        limit = costs.device.memory_bytes
        base: dict[str, Any] = dict(gpus=p.gpus, stages=p.stages, replicas=p.replicas, chunks=p.chunks, microbatch=mb,
                                    checkpoint=p.checkpoint, schedule=p.schedule, balance=balance, virtual=p.virtual,
                                    parameters=costs.profile.parameters, tensor_parallel=p.tensor_parallel,
                                    zero=p.zero, reshard_after_forward=p.reshard, shard_group=p.shard_group,
                                    sequence_parallel=p.sequence_parallel, model_state_bytes=tuple(state),
                                    context_parallel=p.context_parallel, expert_parallel=p.expert_parallel,
                                    expert_tensor_parallel=p.expert_tensor_parallel)
        if max(state) > limit:  # Note [not simulated]: the model state alone does not fit
            parts = [_state_only(stages, schedule.stages_on(d)) for d in range(devices)]
            return PlanRow(step_seconds=NAN, throughput=NAN, bubble_fraction=NAN,
                           memory_bytes=tuple(x.total for x in parts), activation_bytes=(0,) * devices, fits=False,
                           memory_parts=tuple(parts), simulated=False, bound="memory", **base)
        parts = device_memory(schedule, stages, working, workspace_bytes(costs.device.name), scale, backward,
                              self.copy_streams)
        memory = tuple(x.total for x in parts)
        if max(memory) > limit:
            return PlanRow(step_seconds=NAN, throughput=NAN, bubble_fraction=NAN, memory_bytes=memory,
                           activation_bytes=tuple(x.saved for x in parts), fits=False, memory_parts=tuple(parts),
                           simulated=False, bound="memory", **base)
        links = self.cluster.stage_links(placement, p.tensor_parallel, p.stages, p.replicas, p.context_parallel)
        # Note [collectives after the fact] in sim.core.collectives: where no stage gathers (ZeRO below 3) the
        # compute is simulated once for every data-parallel layout and each adds its collectives to it
        collectives = [stage.collectives for stage in stages]
        gathers = any(c is not None and c.gather is not Gather.NEVER for c in collectives)
        sim_key = (id(schedule), key, scale, links,
                   (p.data_group, p.zero, p.reshard, p.shard_group) if gathers else None)
        timeline = self._timelines.get(sim_key)
        if timeline is None:
            simulated = stages if gathers else [replace(stage, collectives=None) for stage in stages]
            cost = CostModel(tuple(simulated), copy_seconds=None, microbatch_scale=scale)
            config = self.config if links is None else replace(self.config, stage_links=links)
            timeline = simulate(schedule, cost, config)
            if len(self._timelines) >= TIMELINES_KEPT:
                self._timelines.pop(next(iter(self._timelines)))
            self._timelines[sim_key] = timeline
        if not gathers:  # measured once on the shared compute timeline; Timeline.with_spans carries it over
            timeline.busy(0), timeline.peak_memory(0)
        # when the last compute or copy ends: the pipeline's makespan, the collectives' exposed tail after it
        drained = timeline.end if not gathers else \
            max((s.end for s in timeline.spans if s.stream != COLLECTIVE), default=timeline.start)
        if not gathers and any(c is not None for c in collectives):
            timeline = add_collectives(timeline, schedule, collectives, self.config.overlap_pairs)
        self.last_timeline = timeline
        per_stage = self._updates(p, costs, balance)
        updates = _per_device([per_stage[s] for s in slots], placement, devices)
        gather = self._collective(p, "allgather_seconds", sharding=True)
        parameters = costs.stage_parameters(balance)
        after = [after_step_bytes(compute_copy_bytes(n, costs.training), p.zero, p.sharding_group)
                 for n in (parameters[s] for s in slots)]
        step, exposed = step_seconds(timeline, updates, p.sharding_group, p.zero, [
            sum(gather(after[j], d) for j in schedule.stages_on(d) if after[j]) for d in range(devices)], drained)
        throughput = self.batch / step if step > 0 else math.inf
        talk = exposure(timeline) if any(s.communication for s in stages) else None
        dollars = p.gpus * self.price / 3600 * 1e6 / throughput if self.price is not None else None
        activations = tuple(timeline.peak_memory(d) for d in range(devices))
        span = drained - timeline.start
        bubble = sum(1 - timeline.busy(d) / span for d in range(devices)) / devices if span > 0 else 0.0
        return PlanRow(step_seconds=step, throughput=throughput, bubble_fraction=bubble,
                       memory_bytes=memory, activation_bytes=activations, fits=True, cost_per_million=dollars,
                       memory_parts=tuple(parts), allreduce_exposed_seconds=exposed,
                       all_to_all_seconds=max(talk.communication) if talk else 0.0,
                       all_to_all_exposed_seconds=max(talk.exposed) if talk else 0.0,
                       **self._utilisation(p, costs, mb, step, throughput, max(updates, default=0.0), exposed,
                                          timeline, drained, (max(talk.communication), max(talk.exposed)) if talk
                                          else (0.0, 0.0)),
                       **base)

    def _collective(self, p: Configuration, name: str, sharding: bool = False) -> Callable[[float, int], float]:
        """``(bytes, device) -> seconds`` of the cluster's collective ``name`` in ``p``'s data-parallel groups: its
        replicas times its context-parallel ranks, which hold the same weights (Megatron-Core reduces gradients over
        the data-and-context-parallel group); with ``sharding`` under hybrid sharding, in a sharding group of
        ``shard_group`` consecutive replicas."""
        method = getattr(self.cluster, name)
        replicas = p.shard_group if sharding and p.shard_group is not None else p.replicas
        return lambda nbytes, device: method(nbytes, p.tensor_parallel, p.stages, replicas, device,
                                             p.context_parallel)

    def _across_groups(self, p: Configuration) -> Callable[[float], float] | None:
        """Under hybrid sharding, ``bytes -> seconds`` of the all-reduce of a reduced shard across the sharding
        groups; ``None`` without it.

        Note [hybrid sharding]: the groups' members at one position sit a sharding group apart, which fills a node
        or more where hybrid sharding is worth it, so the ring runs on the network (one GPU's share of its node's
        ports) when there is one, else on the link."""
        if p.shard_group is None or not p.zero:
            return None
        link = self.cluster.nic or self.cluster.link
        groups = p.data_group // p.sharding_group
        return lambda nbytes: allreduce_seconds(nbytes, groups, link)

    def _sharded(self, p: Configuration, costs: FlopCosts, balance: tuple[int, ...], mb: int,
                 whole: Sequence[StageCost], working: Sequence[int], backward: Sequence[int],
                 placement: Sequence[int], slots: Sequence[int]) -> tuple[list[StageCost], list[int], list[int]]:
        """Stages, working sets and backward working sets of ``p``'s replicas (:mod:`sim.planning.parallel.zero`): the
        model state a device holds of each stage under the ZeRO stage, what the stage's tasks hold besides (a gathered
        layer, a gradient bucket; unscaled by an uneven micro-batch, a bound), and the stage's collectives; ``slots``:
        each slot's stage of the model."""
        training, layers = costs.training, costs.profile.layers
        forward = costs.layer_seconds(mb)[0]
        bounds = [0, *itertools.accumulate(balance)]
        prices = {kind: self._collective(p, name, sharding=p.zero > 0) for kind, name in (
            (Kind.ALL_REDUCE, "allreduce_seconds"), (Kind.REDUCE_SCATTER, "reduce_scatter_seconds"),
            (Kind.ALL_GATHER, "allgather_seconds"))}
        group = p.sharding_group if p.zero else p.data_group
        across = self._across_groups(p)
        stages, work, back = [], [], []
        for j, stage in enumerate(whole):
            mine = slice(bounds[slots[j]], bounds[slots[j] + 1])
            own = [x.parameters for x in layers[mine]]
            device = placement[j]
            experts = sum(x.expert_parameters for x in layers[mine])
            share = experts / sum(own) if experts else 0.0
            held = sharded_state(stage, sum(own), training, p.zero, group) if not experts else \
                sharded_state_of_experts(stage.parameter_bytes, stage.gradient_bytes, stage.optimizer_bytes, sum(own),
                                         experts, training, p.zero, group, p.expert_data_group)
            extra = transient_bytes(own, training, p.zero, group, reshard_after_forward=p.reshard)

            def price(kind: Kind, nbytes: float, d: int = device, f: float = share) -> float:
                # Note [expert gradients]: a unit's routed experts' share reduces over the expert-data-parallel group
                return prices[kind]((1 - f) * nbytes, d) + (self.cluster.strided_seconds(
                    str(kind), f * nbytes, p.expert_parallel * p.expert_tensor_parallel, p.expert_data_group)
                    if f else 0.0)
            collectives = stage_collectives(own, [float(x) for x in forward[mine]], training,
                                            p.zero, p.data_group, price, reshard_after_forward=p.reshard,
                                            shard=group, replicate=across)
            stages.append(replace(stage, parameter_bytes=held.parameters, gradient_bytes=held.gradients,
                                  optimizer_bytes=held.optimizer, collectives=collectives))
            work.append(working[j] + extra.forward)
            back.append(backward[j] + extra.backward)
        return stages, work, back

    def _updates(self, p: Configuration, costs: FlopCosts, balance: tuple[int, ...]) -> list[float]:
        """Each stage's optimizer step over its whole state; under ZeRO its routed experts' part weighted so that
        :func:`~sim.planning.parallel.replicas.step_seconds`, dividing by the sharding group, leaves their shard of the
        expert-data-parallel group (Note [expert gradients])."""
        updates = costs.update_seconds(balance)
        layers, bounds = costs.profile.layers, [0, *itertools.accumulate(balance)]
        experts = [sum(x.expert_parameters for x in layers[a:b]) for a, b in itertools.pairwise(bounds)]
        if not p.zero or not any(experts):
            return updates
        scale = p.sharding_group / p.expert_data_group
        return [u * (1 - e / n + e / n * scale) if n else u
                for u, e, n in zip(updates, experts, costs.stage_parameters(balance), strict=True)]

    def _flops(self, p: Configuration, costs: FlopCosts) -> tuple[float, float]:
        """A step's model FLOPs (forward and backward, every rank) and the FLOPs its recompute adds."""
        profile = costs.profile
        key = p.count_key

        def per_step(tables: Sequence[OpTable]) -> tuple[float, float]:  # (fixed, per sample)
            return (sum(float(t.flops[:, 0].sum()) for t in tables), sum(float(t.flops[:, 1].sum()) for t in tables))
        if key not in self._counted:
            self._counted[key] = (per_step([x.forward for x in profile.layers]),
                                  per_step([x.backward for x in profile.layers]))
        fwd, bwd = self._counted[key]
        inside = (key, p.checkpoint)
        if inside_backward(p.checkpoint) and inside not in self._inside:
            core = profile.attention_core
            self._inside[inside] = per_step([inside_table(x.forward, p.checkpoint, core) for x in profile.layers])
        ranks = p.tensor_parallel * p.context_parallel  # of a pipeline device, each running its own count
        runs = p.chunks * p.replicas * ranks  # micro-batches of every rank in a step

        def total(q: tuple[float, float]) -> float:
            return q[0] * runs + q[1] * self.batch * ranks

        recomputed = total(fwd) * recompute_fraction(p.checkpoint, p.chunks)
        if inside_backward(p.checkpoint):
            recomputed = total(self._inside[inside])
        return total(fwd) + total(bwd), recomputed

    def _utilisation(self, p: Configuration, costs: FlopCosts, mb: int, step: float, throughput: float, update: float,
                     exposed: float, timeline: Timeline, drained: float, talk: tuple[float, float]) -> dict[str, Any]:
        """``tokens_per_second``, ``mfu``, ``hfu`` and ``bound`` of a simulated configuration (:class:`PlanRow`);
        ``drained``: when its last compute or copy ended (the collectives' exposed tail is ``exposed``); ``talk``: the
        busiest device's all-to-all seconds and those exposed (inside its tasks' spans, so out of ``compute``)."""
        model, recomputed = self._flops(p, costs)
        peak = p.gpus * costs.device.peak_flops.get(costs.training.compute.lower(), NAN) * step
        busy = max(timeline.busy(d) for d in range(timeline.num_devices))
        fwd, bwd = costs.layer_seconds(mb)
        whole = max(float(fwd.sum() + bwd.sum()), 1e-300)
        collective = sum(float(x.sum()) for x in costs.collective_seconds(mb)) / whole
        context = sum(float(x.sum()) for x in costs.context_seconds(mb)) / whole
        parts = {"compute": busy * (1 - collective - context) - talk[0], "tensor-parallel": busy * collective,
                 "context-parallel": busy * context, "all-to-all": talk[1],
                 "bubble": drained - timeline.start - busy, "data-parallel": exposed, "optimizer": update}
        return {"tokens_per_second": throughput * self.tokens if self.tokens else None,
                "mfu": model / peak if peak > 0 else None, "hfu": (model + recomputed) / peak if peak > 0 else None,
                "bound": max(parts, key=lambda k: parts[k])}


def _state_only(stages: Sequence[StageCost], mine: Sequence[int]) -> MemoryParts:
    """A device's model state, rounded as the allocator rounds it, and nothing else (Note [not simulated])."""
    params = sum(round_block(stages[j].parameter_bytes) for j in mine)
    optimizer = sum(round_block(stages[j].optimizer_bytes) for j in mine)
    gradients = sum(round_block(stages[j].gradient_bytes) for j in mine)
    raw = params + optimizer + gradients
    return MemoryParts(params, optimizer, gradients, 0, 0, 0, round_segment(raw) - raw)
