"""The planner offers a searched schedule: after the sweep, the best configurations are searched
(:func:`gpipe.schedule.search.search`) for their own stage costs, and what the search gained is reported.

Note [search in a plan]: a configuration's stages are unequal after balancing (whole layers per stage, the embedding
and the head at the ends), and a named schedule assumes them equal. For each of the ``top`` fastest configurations
that fit, the search takes the configuration's own F, B and W seconds per stage (B and W apart, as a split schedule
prices them), a copy's seconds on the slowest link between its stages, each stage's saved bytes as its activation,
and as each device's limit the memory the best row leaves for activations (the device's capacity less what that row
holds besides them). The searched schedule then runs through the sweep like any other (same costs, links, memory
replay, all-reduce and optimizer), as a row named ``searched``; one that does not fit the device is searched again
under the named row's own activation peak, which the row showed fits. Searched schedules hold no recompute, so a
configuration that recomputes whole stages (``always``, ``except_last``, ``layers``) or runs ZeRO-3 (whose tasks
stretch by their gathers) is reported as not searched, with why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpipe.schedule import schedule_kind
from gpipe.schedule.search import StageCosts, search
from sim.planning.parallel.configurations import Configuration, make_schedule
from sim.planning.parallel.recompute import schedule_checkpoint
from sim.planning.request import check_search
from sim.planning.rows import PlanRow, SearchGain
from sim.planning.sweep import Sweep

__all__ = ["SEARCHED", "configuration_of", "search_rows"]

#: The schedule name of a searched row.
SEARCHED = "searched"
#: The fields that say which configuration a row is, its schedule aside.
_SHAPE = ("gpus", "stages", "replicas", "chunks", "checkpoint", "virtual", "tensor_parallel", "zero",
          "sequence_parallel", "context_parallel", "reshard_after_forward", "shard_group")


def configuration_of(row: PlanRow) -> Configuration:
    """The configuration a row of the sweep was evaluated for."""
    return Configuration(row.gpus, row.stages, row.replicas, row.chunks, row.checkpoint, row.schedule, row.virtual,
                         row.tensor_parallel, row.zero, row.sequence_parallel, row.context_parallel,
                         row.reshard_after_forward, row.shard_group, row.expert_parallel, row.expert_tensor_parallel)


def _why_not(row: PlanRow) -> str | None:
    if schedule_kind(row.schedule).copies > 1:
        return "not searched: the search places one copy of the stages, and this schedule runs several"
    if schedule_checkpoint(row.checkpoint) != "never":
        return f"not searched: checkpoint {row.checkpoint} recomputes whole stages, and a searched schedule has no R"
    if row.zero == 3 and row.replicas > 1:
        return "not searched: ZeRO-3's tasks last as long as their gathers, which the search does not price"
    return None


def _costs(sweep: Sweep, row: PlanRow, placement: tuple[int, ...]) -> StageCosts:
    costs = sweep.costs[configuration_of(row).count_key]
    stages = costs.stages(row.balance, row.microbatch, split=True, recompute=row.checkpoint)
    links = sweep.cluster.stage_links(placement, row.tensor_parallel, row.stages, row.replicas, row.context_parallel)
    copy = max((((links[j] if links else sweep.cluster.link).transfer_seconds(s.send_bytes))
                for j, s in enumerate(stages[:-1]) if placement[j] != placement[j + 1]), default=0.0)
    return StageCosts(tuple(s.forward for s in stages), tuple(s.backward for s in stages),
                      tuple(s.weight for s in stages), copy=copy, activation=tuple(float(s.saved_bytes)
                                                                                   for s in stages))


def _search_one(sweep: Sweep, row: PlanRow, time_limit: float, seed: int) -> tuple[PlanRow | None, SearchGain]:
    shape = {k: getattr(row, k) for k in _SHAPE}
    why = _why_not(row)
    if why is not None:
        return None, SearchGain(shape, row.schedule, row.step_seconds, None, None, why)
    placement = make_schedule(configuration_of(row)).placement
    costs = _costs(sweep, row, placement)
    capacity = sweep.costs[configuration_of(row).count_key].device.memory_bytes
    free = tuple(float(capacity - (total - saved)) for total, saved in zip(row.memory_bytes, row.activation_bytes,
                                                                             strict=True))
    method = ""
    for limit in (free, tuple(float(a) for a in row.activation_bytes)):  # Note [search in a plan]
        try:
            found = search(row.chunks, placement, costs, limit, time_limit=time_limit, seed=seed)
        except ValueError as exc:
            method = f"not searched: {exc}"
            continue
        searched = sweep.evaluate(replace(configuration_of(row), schedule=SEARCHED), given=found.schedule)
        method = found.method
        if searched is not None and searched.fits:
            gain = row.step_seconds / searched.step_seconds - 1 if searched.step_seconds > 0 else 0.0
            faster = gain > 1e-9  # a tie is the named schedule's: no row that differs from it by rounding
            return searched if faster else None, SearchGain(shape, row.schedule, row.step_seconds,
                                                            searched.step_seconds, gain, method)
        method = f"{method}; the searched schedule does not fit the device"
    return None, SearchGain(shape, row.schedule, row.step_seconds, None, None, method)


def search_rows(sweep: Sweep, rows: Sequence[PlanRow], top: int, time_limit: float = 5.0,
                seed: int = 0) -> tuple[list[PlanRow], list[SearchGain]]:
    """Search the ``top`` fastest configurations of ``rows`` that fit (one row per configuration, its fastest named
    schedule; Note [search in a plan]); return the searched rows that fit and beat their named row, and what each
    search gained.

    Raises:
        ValueError: ``top`` below 0 or a time limit that is not a positive number.
    """
    check_search(top)
    if not (isinstance(time_limit, (int, float)) and 0 < time_limit < math.inf):
        raise ValueError(f"the search's time limit is a positive number of seconds, got {time_limit!r}")
    best: dict[tuple[Any, ...], PlanRow] = {}
    for row in sorted((r for r in rows if r.fits and r.schedule != SEARCHED), key=lambda r: r.step_seconds):
        best.setdefault(tuple(getattr(row, k) for k in _SHAPE), row)
    found, gains = [], []
    for row in list(best.values())[:top]:
        searched, gain = _search_one(sweep, row, time_limit, seed)
        gains.append(gain)
        if searched is not None:
            found.append(searched)
    return found, gains
