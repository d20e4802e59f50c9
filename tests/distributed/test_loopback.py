"""Ranks spawned on this machine listen on the loopback interface and nowhere else (Note [loopback only] in
gpipe.distributed.loopback): their store once listened on every interface, IPv4 and IPv6, unauthenticated. The
commands that spawn ranks (``demo``/``compare --processes 2``) are watched alike in test_processes_cli.py."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpipe.distributed.loopback import free_port, init_loopback_group, loopback_interface
from gpipe.distributed.loopback import is_loopback as is_loopback_address
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


# Each rank of the hand-launched pipeline: one step, then "ready PID", then waits for a line on stdin to exit.
BY_HAND = """
import os, sys, torch
from torch import nn
from gpipe.distributed import DistributedGPipe

pipe = DistributedGPipe(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), balance=[1, 1], chunks=2, timeout=60)
loss = pipe.step(torch.ones(4, 4), torch.zeros(4, 4), nn.functional.mse_loss)
print("ready", os.getpid(), flush=True)
sys.stdin.readline()
pipe.close()
"""


@pytest.mark.slow
def test_ranks_launched_by_hand_listen_on_loopback_only() -> None:
    """RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT set by hand, no torchrun: DistributedGPipe starts
    the group itself, and its store (torch's env:// one listened on every interface) and pairs listen on loopback."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    env.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(ROOT))
    env.pop("GLOO_SOCKET_IFNAME", None)
    procs = [subprocess.Popen([sys.executable, "-c", BY_HAND], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        lines = [p.stdout.readline() if p.stdout else "" for p in procs]
        assert all(line.startswith("ready") for line in lines), [p.communicate(timeout=60)[1] for p in procs]
        sockets = listening(p.pid for p in procs)
        assert any(port == p for _, _, p in sockets)  # the store, on rank 0
        assert all(is_loopback(address) for _, address, _ in sockets), sockets
        for p in procs:
            _, err = p.communicate("\n", timeout=60)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_only_a_loopback_master_is_served_here() -> None:
    assert all(is_loopback_address(a) for a in ("127.0.0.1", "127.0.0.2", "::1", "localhost", "LOCALHOST"))
    assert not any(is_loopback_address(a) for a in ("0.0.0.0", "10.0.0.1", "::", "node-0"))
    with pytest.raises(ValueError, match="not a loopback address"):
        init_loopback_group(0, 2, free_port(), datetime.timedelta(seconds=1), address="10.0.0.1")
