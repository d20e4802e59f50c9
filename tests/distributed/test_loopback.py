"""Ranks spawned on this machine listen on the loopback interface and nowhere else (Note [loopback only] in
gpipe.distributed.loopback): their store once listened on every interface, IPv4 and IPv6, unauthenticated. The
commands that spawn ranks (``demo``/``compare --processes 2``) are watched alike in test_processes_cli.py."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpipe.distributed.loopback import free_port, init_loopback_group, loopback_interface
from tests.distributed.listening import is_loopback, listening

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")


def _rank(rank: int, world: int, port: int, said: Any, stop: Any) -> None:
    init_loopback_group(rank, world, port, datetime.timedelta(seconds=60))
    group = dist.new_group(list(range(world)), backend="gloo")  # a group made later, as DistributedGPipe makes
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.all_reduce(t, group=group)
    said.put((rank, os.getpid(), float(t[0])))
    stop.wait(60)
    dist.destroy_process_group()


@pytest.mark.slow
def test_the_ranks_store_and_pairs_listen_on_loopback_only() -> None:
    context = mp.get_context("spawn")
    said, stop = context.Queue(), context.Event()
    port = free_port()
    procs = [context.Process(target=_rank, args=(r, 2, port, said, stop), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        answers = sorted(said.get(timeout=90) for _ in procs)
        assert [(r, total) for r, _, total in answers] == [(0, 4.0), (1, 4.0)]  # both groups reduced
        sockets = listening(pid for _, pid, _ in answers)
        assert any(port == p for _, _, p in sockets)  # the store, on rank 0
        assert sockets and all(is_loopback(address) for _, address, _ in sockets), sockets
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def test_the_loopback_interface_is_found() -> None:
    assert loopback_interface().startswith("lo")
