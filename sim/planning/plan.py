"""Capacity planning: sweep pipeline configurations of a counted model on a hardware entry and rank them.

For every GPU count ``g`` and tensor-parallel degree ``t`` the planner tries each pipeline depth ``p`` that divides
``g / t`` (``g / (t p)`` data-parallel replicas of the pipeline; Note [tensor parallel ranks] in
:mod:`sim.planning.request`), each number of
micro-batches (chunks), each checkpoint
policy and each registered schedule (:data:`gpipe.schedule.SCHEDULES`), and for a schedule that
places several stages per device each number ``v`` of stages per device (Note [virtual stages] in
:mod:`sim.planning.parallel.configurations`).
Each configuration is balanced by cost (:mod:`sim.planning.parallel.partition`), priced with the backward
split into B and W where the schedule has W tasks, simulated (:func:`sim.core.engine.simulate`) and
checked against device memory as the allocator sees it; :func:`plan` runs the sweep a
:class:`~sim.planning.request.PlanRequest` asks for::

    step seconds  = simulated pipeline, the all-reduce across replicas overlapped (sim.planning.parallel.replicas;
                    hierarchical across nodes: sim.planning.parallel.cluster), then the optimizer step
    throughput    = global batch / step seconds                              (samples/s)
    memory        = per device, the peak the allocator reserves: model state, saved bytes, the running
                    task's working set, workspace, rounding (sim.planning.parallel.memory)      (fits or out of memory)
    cost          = gpus * price per GPU-hour / 3600 * 1e6 / throughput      ($ per million samples)
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from gpipe.interpreter.affinity import available_cores
from gpipe.schedule.collector import collector_paused
from gpipe.schedule.timeline import Timeline
from sim.planning.parallel.configurations import MAX_CHUNKS, configurations
from sim.planning.parallel.partition import block_partition
from sim.planning.request import (
    GPUS_PER_NODE,
    VIRTUAL,
    PlanRequest,
    check_request,
    check_tensor_parallel,
    default_training,
    resolve_link,
    resolve_network,
)
from sim.planning.rows import Plan, PlanRow
from sim.planning.search_plan import SEARCHED, configuration_of, search_rows
from sim.planning.sweep import Sweep
from sim.planning.sweep_workers import evaluate_all

__all__ = ["GPUS_PER_NODE", "MAX_CHUNKS", "VIRTUAL", "Plan", "PlanRequest", "PlanRow", "block_partition",
           "check_request", "check_tensor_parallel", "default_training", "plan", "resolve_link", "resolve_network",
           "row_timeline"]

SEARCH_SECONDS = 5.0  # the solver's time for each configuration searched (its heuristic answers at once)


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


def plan(request: PlanRequest, *, progress: bool = False, workers: int | None = None) -> Plan:
    """Sweep, balance, simulate and rank the pipeline configurations ``request`` spans (see the module docstring)::

        plan(PlanRequest(profile=counts, batch=256, device="a100-80gb", gpus=[64], link="nvlink"))

    Args:
        request: what to sweep, checked when it was built (its fields say what each means).
        progress: show a ``tqdm`` progress bar on stderr.
        workers: processes to sweep with (Note [sweep workers] in :mod:`sim.planning.sweep_workers`); default the cores
            this process may use. The rows are the same for any number.

    Returns:
        A :class:`Plan`; its ``best`` row is the fastest (or cheapest) configuration that fits.

    Raises:
        TypeError: ``request`` is not a :class:`PlanRequest`.
        ValueError: nothing to sweep (no configuration the request spans can run; the message says why).
    """
    if not isinstance(request, PlanRequest):
        raise TypeError(f"plan takes a PlanRequest (sim.planning.request), got {type(request).__name__}")
    sweep = Sweep(request)
    why: dict[str, str] = {}
    points = configurations(request, why)
    with collector_paused(), _progress(len(points), progress) as tick:  # Note [gc]: a sweep's caches stay alive
        run, skipped = evaluate_all(sweep, points, workers if workers is not None else len(available_cores()), tick,
                                    request.keep)
    why.update(sweep.why)
    rows = [r for r in run if r is not None]
    if not rows:
        reasons = "".join(f"; {s}: {w}" for s, w in why.items())
        pins = (f" with balance {list(request.balance)}" if request.balance is not None else "") + \
            (f" and replicas {list(request.replicas)}" if request.replicas is not None else "")
        raise ValueError(f"nothing to sweep: no configuration of {list(request.gpus)} GPUs fits batch "
                         f"{request.batch} and {request.layers} layers{pins}{reasons}")
    ran = {r.schedule for r in rows} | {p.schedule for p in skipped}  # a schedule skipped ran, slower
    missing = {s: why.get(s, "no configuration") for s in request.schedule_names if s not in ran}
    searched, gains = search_rows(sweep, rows, request.search, SEARCH_SECONDS)
    device, cluster = request.device_spec, sweep.cluster
    return Plan(request.model_name, request.batch, device.name, device.memory_bytes, cluster.link.name,
                request.policy.name, request.price_per_gpu_hour,
                tuple(_mark_best(rows + searched, request.objective)), missing,
                cluster.network.name if cluster.network else None, request.tokens_per_sample, tuple(gains),
                len(skipped), None if request.routing is None else request.expert_imbalance)


def row_timeline(request: PlanRequest, row: PlanRow) -> Timeline:
    """The simulated timeline of ``row``, a row of ``plan(request)``: its tasks, copies and data-parallel
    collectives (:mod:`sim.core.collectives`), for a Perfetto trace or a Gantt chart.

    Raises:
        ValueError: the row was not simulated (it does not fit, or it was skipped), or it is a searched schedule's.
    """
    if row.schedule == SEARCHED or not row.simulated:
        raise ValueError(f"row {row.gpus} GPUs {row.schedule} was not simulated as a named schedule; only a "
                         "simulated row of the sweep has a timeline")
    sweep = Sweep(request)
    evaluated = sweep.evaluate(configuration_of(row))
    if evaluated is None or sweep.last_timeline is None:
        raise ValueError(f"the configuration of row {row.gpus} GPUs {row.schedule} no longer simulates: "
                         f"{sweep.why.get(row.schedule, 'it does not fit')}")
    return sweep.last_timeline


@contextmanager
def _progress(total: int, show: bool) -> Iterator[Callable[[int], None] | None]:
    if not show:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc="simulating", unit="config", leave=False) as bar:
        yield bar.update
