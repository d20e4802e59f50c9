"""One time base for the ranks' timelines: clock offsets by ping-pong, spans and transfers gathered to rank 0.

Note [one time base]: each rank records its spans on its own ``time.perf_counter`` (seconds from its recorder's
start). To put them on rank 0's clock, rank 0 exchanges a few round trips with every other rank over the control
group: rank 0 reads its clock (``a``), the peer answers with its reading (``b``), rank 0 reads again (``c``). If
the message took as long each way, the peer's clock is ahead by ``b - (a + c) / 2``; whatever the split, the
error is at most half the round trip, ``(c - a) / 2``. The round with the shortest trip is kept, and the largest
such half trip over the ranks is the timeline's stated residual (``meta["clock"]["residual"]``): a time on one
rank and one on another compare only to within it.

A transfer between ranks becomes a copy span on the receiving rank (as the single-process recorder draws a copy
on the device it arrives at), from the moment the sender posted it to the moment its last tensor arrived.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from gpipe.schedule import Task
from gpipe.schedule.timeline import COPY, MemorySample, Span, Timeline

__all__ = ["Transfers", "measure_offsets", "merge"]

Transfers = dict[str, list[tuple[int, str, str, float]]]
"""A rank's transfers on its own ``perf_counter``: ``"sent"``: (to rank, task, channel, posted at);
``"arrived"``: (from rank, task, channel, last tensor in at)."""


def measure_offsets(group: Any, rank: int, world: int, rounds: int = 8) -> list[tuple[float, float]]:
    """Per rank, ``(offset, residual)``: how far its ``perf_counter`` is ahead of rank 0's, and the bound on that
    estimate (Note [one time base]). Every rank of ``group`` calls it; all get the same list."""
    best: list[tuple[float, float]] = [(0.0, 0.0)] * world
    buffer = torch.zeros(1, dtype=torch.float64)
    for peer in range(1, world):
        for _ in range(rounds):
            if rank == 0:
                a = time.perf_counter()
                dist.send(buffer, group=group, group_dst=peer)
                dist.recv(buffer, group=group, group_src=peer)
                c = time.perf_counter()
                offset, residual = float(buffer.item()) - (a + c) / 2, (c - a) / 2
                if best[peer] == (0.0, 0.0) or residual < best[peer][1]:
                    best[peer] = (offset, residual)
            elif rank == peer:
                dist.recv(buffer, group=group, group_src=0)
                buffer.fill_(time.perf_counter())
                dist.send(buffer, group=group, group_dst=0)
    told: list[Any] = [best]
    dist.broadcast_object_list(told, group=group, group_src=0)
    return list(told[0])


def merge(parts: Sequence[dict[str, Any]], offsets: Sequence[tuple[float, float]],
          origin: float | None = None) -> Timeline:
    """One timeline of every rank's ``parts`` (each: ``timeline`` as a dict, ``t0`` its recorder's start on its
    ``perf_counter``, ``transfers``), on rank 0's clock, from the earliest start of any rank (or from ``origin``, a
    time on rank 0's clock: one origin for several pipelines' timelines)."""
    starts = [part["t0"] - offsets[r][0] for r, part in enumerate(parts)]  # each rank's t0 on rank 0's clock
    origin = min(starts) if origin is None else origin
    spans: list[Span] = []
    memory: list[MemorySample] = []
    for r, part in enumerate(parts):
        shift = starts[r] - origin
        timeline = Timeline.from_dict(part["timeline"])
        spans += [Span(r, s.stream, s.task, s.start + shift, s.end + shift, s.label)
                  for s in timeline.spans if s.device == r]
        memory += [MemorySample(r, s.time + shift, s.bytes) for s in timeline.memory if s.device == r]
    posted = {(r, dst, task, channel): at - offsets[r][0] - origin
              for r, part in enumerate(parts) for dst, task, channel, at in part["transfers"]["sent"]}
    for r, part in enumerate(parts):
        for src, task, channel, at in part["transfers"]["arrived"]:
            start = posted[(src, r, task, channel)]
            end = max(at - offsets[r][0] - origin, start)  # within the residual, it cannot arrive before it left
            spans.append(Span(r, COPY, Task.parse(task), start, end, "" if channel == "" else "skip"))
    first = parts[0]["timeline"]["meta"]
    meta = {key: value for key, value in first.items() if key not in ("rank", "clock", "devices", "held_bytes")}
    state = [p["timeline"]["meta"].get("model_state_bytes", []) for p in parts]
    meta.update(world_size=len(parts), model_state_bytes=[sum(column) for column in zip(*state, strict=True)],
                devices=[p["timeline"]["meta"]["devices"][r] for r, p in enumerate(parts)],
                held_bytes={k: v for p in parts for k, v in p["timeline"]["meta"].get("held_bytes", {}).items()},
                clock={"method": "ping-pong with rank 0 over the control group, the shortest of the rounds",
                       "offsets": [o for o, _ in offsets], "residual": max(e for _, e in offsets)})
    memory.sort(key=lambda s: (s.device, s.time))
    return Timeline(tuple(spans), tuple(memory), len(parts), "measured", meta)
