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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from gpipe.interpreter.affinity import available_cores
from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, schedule_kind
from gpipe.schedule.collector import collector_paused
from sim.core.link import LinkSpec
from sim.planning.cluster import Cluster
from sim.planning.costs_from_flops import FlopCosts
from sim.planning.flops import ModelProfile
from sim.planning.hardware import DeviceSpec, get_device
from sim.planning.memory import COPY_STREAMS
from sim.planning.partition import block_partition
from sim.planning.recompute import CHECKPOINTS
from sim.planning.request import (
    GPUS_PER_NODE,
    check_request,
    check_tensor_parallel,
    default_training,
    resolve_link,
    resolve_network,
)
from sim.planning.rows import Plan, PlanRow
from sim.planning.search_plan import check_search, search_rows
from sim.planning.sweep import MAX_CHUNKS, Sweep, configurations, evaluate_all
from sim.planning.training import Training, training_policy
from sim.planning.zero import ZERO_STAGES

__all__ = ["GPUS_PER_NODE", "MAX_CHUNKS", "VIRTUAL", "Plan", "PlanRow", "block_partition", "check_request",
           "check_tensor_parallel", "default_training", "plan", "resolve_link", "resolve_network"]

VIRTUAL = (1, 2, 4)  # default stages per device for a schedule with a layout (Note [virtual stages])
SEARCH_SECONDS = 5.0  # the solver's time for each configuration searched (its heuristic answers at once)


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


def plan(profile: ModelProfile | Mapping[Any, ModelProfile], batch: int, device: DeviceSpec | str, gpus: Sequence[int],
         link: LinkSpec | str = "pcie", *, training: Training | str | None = None,
         chunks: Sequence[int] | None = None, checkpoints: Sequence[str] = CHECKPOINT_MODES,
         schedules: Sequence[str] | None = None, stages: Sequence[int] | None = None,
         virtual: Sequence[int] = VIRTUAL, balance: Sequence[int] | None = None,
         replicas: Sequence[int] | None = None,
         price_per_gpu_hour: float | None = None, objective: str = "throughput",
         kernel_seconds: float | None = None, model_name: str = "", progress: bool = False,
         copy_streams: str = "shared", tensor_parallel: Sequence[int] | None = None,
         gpus_per_node: int = GPUS_PER_NODE, network: LinkSpec | str | None = None,
         network_ports: int | None = None, tokens_per_sample: int | None = None, zero: Sequence[int] = (0,),
         sequence_parallel: Sequence[bool] = (False,), workers: int | None = None, search: int = 0) -> Plan:
    """Sweep, balance, simulate and rank pipeline configurations (see the module docstring).

    Args:
        profile: the counted model (:func:`sim.planning.flops.count_layers`, in the policy's dtype), or for each
            tensor-parallel degree the count of one rank's shard (``{1: whole, 2: shard, ...}``; a key
            ``(t, True)`` for a sequence-parallel shard).
        batch: global batch, samples per step.
        device: a :class:`~sim.planning.hardware.DeviceSpec` or catalog name.
        gpus: GPU counts to try.
        link: a :class:`~sim.core.link.LinkSpec`, a catalog name, or ``nvlink``/``pcie`` (the
            generation that comes with the device).
        training: precision and optimizer (:data:`sim.planning.training.TRAINING`); default
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
        tokens_per_sample: tokens in one sample (a decoder's sequence), for tokens per second; ``None``: none.
        workers: processes to sweep with (Note [sweep workers] in :mod:`sim.planning.sweep`); default the cores
            this process may use. The rows are the same for any number.
        zero: ZeRO stages to try (:mod:`sim.planning.zero`); a configuration with one replica runs stage 0 only.
        sequence_parallel: sequence parallelism off and/or on, for tensor-parallel degrees above 1; ``on`` needs the
            counts of the sequence-parallel shards (keys ``(t, True)`` of ``profile``).
        search: after the sweep, search a schedule for this many of the fastest configurations that fit, for their
            own stage costs (Note [search in a plan] in :mod:`sim.planning.search_plan`): their rows join the plan
            as schedule ``searched`` and :attr:`Plan.searches` says what each gained; 0: none.

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
    counts = _counts(profile)
    degrees = tuple(dict.fromkeys(t for t, _ in counts)) if tensor_parallel is None else \
        tuple(dict.fromkeys(tensor_parallel))
    check_tensor_parallel(degrees, gpus, gpus_per_node)
    splits = tuple(dict.fromkeys(bool(x) for x in sequence_parallel))
    check_zero_stages(zero)
    check_search(search)
    wanted = [(t, sp) for t in degrees for sp in splits if t > 1 or not sp] or [(t, False) for t in degrees]
    for t, sp in wanted:
        if (t, sp) not in counts or counts[(t, sp)].tensor_parallel != t or counts[(t, sp)].sequence_parallel != sp:
            what = " with sequence parallelism" if sp else ""
            raise ValueError(f"tensor parallel {t}{what} needs the count of one rank's shard (a model built with "
                             f"tensor_parallel={t}{', sequence_parallel=True' if sp else ''}); got counts for "
                             f"{sorted(counts)}")
        _check(counts[(t, sp)], batch, gpus, chunks, checkpoints, schedules, policy)
    layers = len(counts[wanted[0]])
    if any(len(counts[k]) != layers for k in wanted):
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
    points = configurations(gpus, batch, layers, chunks, checkpoints, schedules, stages, virtual, why, replicas,
                            len(pinned) if pinned is not None else None, degrees, zero, splits)
    costs = {k: FlopCosts(counts[k], dev, policy, kernel_seconds, tensor_link=lk) for k in wanted}
    if network_ports is not None and (isinstance(network_ports, bool) or not isinstance(network_ports, int)
                                      or network_ports < 1):
        raise ValueError(f"network ports per node must be an integer >= 1, got {network_ports!r}")
    cluster = Cluster(lk, gpus_per_node, None if network is None else resolve_network(network), network_ports)
    sweep = Sweep(costs, batch, cluster, price_per_gpu_hour, pinned, copy_streams, tokens_per_sample)
    with collector_paused(), _progress(len(points), progress) as tick:  # Note [gc]: a sweep's caches stay alive
        run = evaluate_all(sweep, points, workers if workers is not None else len(available_cores()), tick)
    why.update(sweep.why)
    rows = [r for r in run if r is not None]
    if not rows:
        reasons = "".join(f"; {s}: {w}" for s, w in why.items())
        pins = (f" with balance {list(pinned)}" if pinned is not None else "") + \
            (f" and replicas {list(replicas)}" if replicas is not None else "")
        raise ValueError(f"nothing to sweep: no configuration of {list(gpus)} GPUs fits batch {batch} "
                         f"and {layers} layers{pins}{reasons}")
    ran = {r.schedule for r in rows}
    missing = {s: why.get(s, "no configuration") for s in schedules if s not in ran}
    searched, gains = search_rows(sweep, rows, search, SEARCH_SECONDS)
    return Plan(model_name, batch, dev.name, dev.memory_bytes, lk.name, policy.name, price_per_gpu_hour,
                tuple(_mark_best(rows + searched, objective)), missing,
                cluster.network.name if cluster.network else None, tokens_per_sample, tuple(gains))


def check_zero_stages(zero: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``zero`` lists ZeRO stages (:data:`sim.planning.zero.ZERO_STAGES`)."""
    if not zero or any(isinstance(z, bool) or z not in ZERO_STAGES for z in zero):
        raise ValueError(f"zero lists ZeRO stages, of {', '.join(map(str, ZERO_STAGES))}; got {list(zero)}")


def _counts(profile: ModelProfile | Mapping[Any, ModelProfile]) -> dict[tuple[int, bool], ModelProfile]:
    """The counts keyed ``(tensor_parallel, sequence_parallel)``: a key ``t`` is ``(t, False)``."""
    if isinstance(profile, ModelProfile):
        return {(profile.tensor_parallel, False): profile}
    return {(k, False) if isinstance(k, int) else (int(k[0]), bool(k[1])): v for k, v in profile.items()}


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


@contextmanager
def _progress(total: int, show: bool) -> Iterator[Callable[[int], None] | None]:
    if not show:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc="simulating", unit="config", leave=False) as bar:
        yield bar.update
