"""The ranks a pipeline runs on: the process group (torchrun's or the caller's), this rank's device, the store.

Note [backend from the device]: a rank computes on ``cuda:LOCAL_RANK`` when CUDA is available (one GPU per
rank, as ``torchrun --nproc-per-node`` numbers them) and on the CPU otherwise; the process group started here
uses NCCL for a CUDA device and gloo for the CPU. Small objects (the step's batch sizes, the random seed, input
errors) always go through a gloo group, the tensor group itself on CPU or one made beside NCCL.

Note [a group per direction]: on gloo each pair of ranks talks over one connection per group, and posting a send
or receive takes locks of that connection that gloo's own thread also takes to move bytes. With every core busy,
that thread is descheduled holding them and the post waits for its next time slice, on the rank's critical
path. A group for messages to a higher rank and one for messages to a lower keep the two directions' posts off
each other's locks, which removes nearly all those stalls; more groups per direction add nothing (how often a
post stalls each way: ``benchmarks/investigations/gloo_directions.py``; docs/benchmarks.md). NCCL keeps one
group: whether it gains from two is not measured.

Note [a group per pipeline]: a step that fails leaves messages in flight; without ``group=``, each pipeline
talks on a new group of the default one's ranks, so a pipeline built after a failure starts clean. A caller's
group is used as given: after a failure, give the next pipeline a new one.

Note [pipelines of a mesh]: with replicas (:mod:`gpipe.distributed.replicas`) each replica's pipeline is a group of
the mesh's ``pp`` dimension, and the groups a pipeline adds (control, up, down) are made by every rank of the world
for every replica in the same order (``new_group`` is a collective of the whole world), each rank keeping its own.
The pipeline's name, the prefix of its keys in the store, is drawn once for the world: one failure key that every
rank of every replica watches (Note [no rank left waiting] in :mod:`gpipe.distributed.faults`).
"""

from __future__ import annotations

import datetime
import os
import uuid
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gpipe.distributed.faults import store_client
from gpipe.distributed.loopback import init_loopback_group, is_loopback

__all__ = ["Ranks", "default_device", "join", "rank_device", "start_default_group"]


@dataclass(frozen=True)
class Ranks:
    """Attributes: ``group`` (tensors), ``control`` (gloo, objects), this ``rank`` of ``world``, its ``device``,
    ``store`` and ``watcher``: two clients of the rendezvous store under this pipeline's own prefix; ``up`` and
    ``down``: the groups tensors travel on to a higher and to a lower rank (Note [a group per direction])."""

    group: Any
    control: Any
    rank: int
    world: int
    device: torch.device
    store: Any
    watcher: Any
    up: Any = None
    down: Any = None

    def carrying(self, src: int, dst: int) -> Any:
        """The group a tensor from rank ``src`` to rank ``dst`` travels on (Note [a group per direction])."""
        return (self.up if dst > src else self.down) or self.group


def default_device() -> torch.device:
    """``cuda:LOCAL_RANK`` where CUDA is available, else the CPU (Note [backend from the device])."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def rank_device(device: torch.device | str | None) -> torch.device:
    """This rank's device: ``device``, or :func:`default_device`; a CUDA device without an index gets
    ``LOCAL_RANK``'s.

    Raises:
        ValueError: a device that is neither CPU nor CUDA.
    """
    device = default_device() if device is None else torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"DistributedGPipe runs on 'cpu' and 'cuda' devices, got {device}")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def join(group: Any, device: torch.device | str | None, timeout: float, *,
         pipelines: list[list[int]] | None = None, named_over: Any = None) -> Ranks:
    """The ranks of ``group`` (``None``: the default group, started from torchrun's environment if need be).

    ``pipelines``: the global ranks of every replica's pipeline, ``group`` being this rank's; ``named_over``: a
    gloo group of the whole world (Note [pipelines of a mesh]). Both ``None`` for a pipeline without replicas.

    Raises:
        ValueError: no group and no torchrun environment; a device that is neither CPU nor CUDA.
    """
    device = rank_device(device)
    if group is None:
        start_default_group(device, timeout)
        # Note [a group per pipeline]
        group = dist.new_group(backend="nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = dist.get_backend(group)
    members = dist.get_process_group_ranks(group)

    def made(backend: str) -> Any:  # Note [pipelines of a mesh]: every pipeline's, in turn, this rank's kept
        if pipelines is None:
            return dist.new_group(members, backend=backend)
        return [dist.new_group(ranks, backend=backend) for ranks in pipelines][pipelines.index(members)]

    control = group if backend == "gloo" else made("gloo")
    up, down = (made("gloo"), made("gloo")) if backend == "gloo" else (group, group)  # Note [a group per direction]
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    namer = control if named_over is None else named_over
    name = [uuid.uuid4().hex if dist.get_rank(namer) == 0 else None]
    dist.broadcast_object_list(name, group=namer, group_src=0)
    base = dist.distributed_c10d._get_default_store()  # the rendezvous's store: every rank reaches it
    prefix = f"gpipe/{name[0]}/"
    # two clients of the same server under one prefix: one for this thread, one for the alarm's
    return Ranks(group, control, rank, world, device, dist.PrefixStore(prefix, store_client(base, timeout)),
                 dist.PrefixStore(prefix, store_client(base, timeout)), up, down)


def start_default_group(device: torch.device, timeout: float) -> None:
    """Start the default group from torchrun's environment, unless one is started (Note [backend from the device]).

    Raises:
        ValueError: no default group and no torchrun environment.
    """
    if not dist.is_initialized():
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise ValueError(f"no process group and no torchrun environment ({', '.join(missing)} unset): launch "
                             "with torchrun --nproc-per-node N script.py, or call "
                             "torch.distributed.init_process_group first, or pass group=")
        backend = "nccl" if device.type == "cuda" else "gloo"
        span = datetime.timedelta(seconds=max(timeout, 1.0))
        # Note [loopback only] in gpipe.distributed.loopback: torch's env:// store would listen on every
        # interface. Under torchrun the agent serves the store, where torchrun binds it.
        if is_loopback(os.environ["MASTER_ADDR"]) and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            init_loopback_group(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                                int(os.environ["MASTER_PORT"]), span, backend=backend,
                                address=os.environ["MASTER_ADDR"])
        else:
            dist.init_process_group(backend, timeout=span)
