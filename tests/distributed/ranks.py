"""A pool of ranks for the distributed tests: spawn ``world`` processes once, run many cases in each, collect.

Each case is a function ``case(rank, world) -> str`` run on every rank, in the same order on all; what it
returns (or the error it raised, as ``"raised Type: message"``) comes back per rank. Gloo on loopback, listening
nowhere else (:mod:`gpipe.distributed.loopback`).
"""

from __future__ import annotations

import datetime
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpipe.distributed.loopback import free_port, init_loopback_group

Case = Callable[[int, int], str]


def _rank(rank: int, world: int, port: int, cases: Sequence[tuple[str, Case]], results: Any) -> None:
    torch.set_num_threads(1)
    init_loopback_group(rank, world, port, datetime.timedelta(seconds=60))
    for name, case in cases:
        try:
            out = case(rank, world)
        except BaseException as error:  # noqa: BLE001 - the test reads it
            out = f"raised {type(error).__name__}: {error}"
            if os.environ.get("GPIPE_TEST_TRACE"):
                traceback.print_exc()
        results.put((rank, name, out))
    dist.destroy_process_group()


def run(world: int, cases: Sequence[tuple[str, Case]], timeout: float = 90.0) -> dict[str, list[str | None]]:
    """Every case on ``world`` spawned ranks: per case, each rank's result (``None``: the rank never said)."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [context.Process(target=_rank, args=(r, world, port, list(cases), results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[str, list[str | None]] = {name: [None] * world for name, _ in cases}
    expected, got = world * len(cases), 0
    deadline = time.monotonic() + timeout
    while got < expected and time.monotonic() < deadline:
        try:
            rank, name, value = results.get(timeout=0.25)
        except queue.Empty:
            if any(p.is_alive() for p in procs):
                continue
            try:  # every rank has ended (one was killed, say): what they said is all there is
                rank, name, value = results.get(timeout=1.0)
            except queue.Empty:
                break
        out[name][rank] = value
        got += 1
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return out
