"""Notebook 09's pipeline written by hand: 1F1B over ``torch.distributed`` send and receive, and its launcher.

Spawned ranks import their target function by name, so it lives here rather than in the notebook, which prints
:func:`one_f_one_b_order` and :func:`train_step` and calls :func:`run`. Each rank runs the hand-written step, then
one step of :class:`gpipe.distributed.DistributedGPipe` on the same model, and returns both steps' gradients for
the notebook to check against :func:`plain_gradients`. Gloo listens on the loopback interface only
(:mod:`gpipe.distributed.loopback`).

Note [bounded ranks]: a notebook must never hang. Every wait is bounded: the ranks' group has a timeout (a receive
that nobody answers raises), the launcher waits for the results with a deadline, a rank that fails sends its
traceback (raised in the notebook as a ``RuntimeError`` naming the rank), and the launcher kills whatever is still
running on its way out.

Note [gradients by value]: a rank sends its gradients as numpy arrays, which pickle by value. A tensor put on
``torch.multiprocessing``'s queue travels as a file descriptor of its shared storage, which the launcher fetches from
the sending process when it takes the result; a rank that has put its result and exited is gone by then, and the
launcher failed in ``multiprocessing.resource_sharer`` (``FileNotFoundError`` or ``ConnectionRefusedError``).
"""

from __future__ import annotations

import datetime
import queue
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpipe.distributed.loopback import free_port, init_loopback_group

__all__ = ["WIDTH", "Result", "build", "data", "one_f_one_b_order", "plain_gradients", "run", "stages_of",
           "train_step"]

WIDTH = 512  # features of the input and of every layer: a stage's forward takes a few milliseconds on one core
ROWS = 512  # samples in a mini-batch
LAYERS = 8  # four Linear + Tanh pairs
Order = list[tuple[str, int]]  # one rank's tasks: ("F", i) forward of micro-batch i, ("B", i) its backward


def build() -> tuple[nn.Sequential, Tensor]:
    """The model and one mini-batch, the same in every process that calls it (``sim.calibration``'s ``Build``)."""
    torch.manual_seed(0)
    layers = [layer for _ in range(LAYERS // 2) for layer in (nn.Linear(WIDTH, WIDTH), nn.Tanh())]
    return nn.Sequential(*layers), torch.randn(ROWS, WIDTH)


def data() -> tuple[nn.Sequential, Tensor, Tensor]:
    """:func:`build` and a target for the mean square error."""
    model, x = build()
    return model, x, torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(1))


def stages_of(model: nn.Sequential, world: int) -> list[nn.Sequential]:
    """The model cut into ``world`` stages of equal numbers of layers (the first ones longer by one if need be)."""
    sizes = [len(model) // world + (r < len(model) % world) for r in range(world)]
    starts = [sum(sizes[:r]) for r in range(world)]
    return [nn.Sequential(*list(model)[s:s + size]) for s, size in zip(starts, sizes, strict=True)]


def one_f_one_b_order(rank: int, world: int, m: int) -> Order:
    """1F1B on rank ``rank``: ``world - 1 - rank`` forwards to fill the pipeline, then a forward and a backward in
    turn, then the backwards left."""
    warmup = min(world - 1 - rank, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def train_step(stage: nn.Module, x: Tensor | None, target: Tensor | None, m: int, order: Order) -> dict[str, Any]:
    """One training step of this rank's ``stage`` in the order ``order``: the first rank reads ``x``, the last
    ``target``; activations go forward to ``rank + 1`` and gradients back to ``rank - 1``. Returns what the step
    did: the loss (on the last rank), messages sent, and the most micro-batches held for their backward at once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs = x.chunk(m) if x is not None else ()  # m micro-batches of (rows/m, WIDTH)
    targets = target.chunk(m) if target is not None else ()
    rows = ROWS // m
    kept: dict[int, tuple[Tensor, Tensor]] = {}  # micro-batch -> (stage input, stage output) for its backward
    pending: list[Any] = []  # sends in flight: isend returns at once, its tensor must live until wait()
    loss, sent, peak = torch.zeros(()), 0, 0
    for op, i in order:
        if op == "F":
            if first:
                a = inputs[i]
            else:  # the previous stage's output is this stage's input: (rows/m, WIDTH)
                a = torch.empty(rows, WIDTH)
                dist.recv(a, src=rank - 1)
                a.requires_grad_()
            y = stage(a)
            if last:  # the plain model's loss is the mean over the batch: each micro-batch gives 1/m of it
                y = nn.functional.mse_loss(y, targets[i]) / m
                loss += y.detach()
            else:
                pending.append(dist.isend(y.detach(), dst=rank + 1))
                sent += 1
            kept[i] = (a, y)
            peak = max(peak, len(kept))
        else:
            a, y = kept.pop(i)
            if last:
                y.backward()
            else:  # the next stage's gradient of its input is the gradient of this stage's output
                grad = torch.empty_like(y)
                dist.recv(grad, src=rank + 1)
                y.backward(grad)
            if not first:
                pending.append(dist.isend(cast(Tensor, a.grad), dst=rank - 1))
                sent += 1
    for request in pending:
        request.wait()
    return {"loss": float(loss), "sent": sent, "peak_kept": peak}


@dataclass(frozen=True)
class Result:
    """What :func:`run` found: per rank, the hand-written step's report; the gradients of both steps by parameter
    name (``"0.weight"``: layer 0's weight), merged over the ranks; the library's loss."""

    reports: list[dict[str, Any]]
    scratch: dict[str, Tensor]
    library: dict[str, Tensor]
    library_loss: float


def _rank(rank: int, world: int, port: int, m: int, orders: list[Order], wait: float, results: Any) -> None:
    """One spawned rank: the hand-written step, then DistributedGPipe's on a fresh copy of the same model."""
    from gpipe.distributed import DistributedGPipe

    try:
        torch.set_num_threads(1)
        init_loopback_group(rank, world, port, datetime.timedelta(seconds=wait))  # Note [bounded ranks]
        model, x, target = data()
        stage = stages_of(model, world)[rank]
        report = train_step(stage, x if rank == 0 else None, target if rank == world - 1 else None, m, orders[rank])
        first = sum(len(s) for s in stages_of(model, world)[:rank])
        scratch = {f"{first + k}.{name}": p.grad for k, layer in enumerate(stage)
                   for name, p in layer.named_parameters()}
        model, x, target = data()  # the library's step starts from the same weights
        pipe = DistributedGPipe(model, [len(s) for s in stages_of(model, world)], chunks=m, checkpoint="never",
                                schedule="1f1b", timeout=wait)
        loss = pipe.step(x if rank == 0 else None, target if rank == world - 1 else None, nn.functional.mse_loss)
        library = {f"{k}.{name}": p.grad for k, layer in enumerate(model) for name, p in layer.named_parameters()
                   if p.grad is not None}
        pipe.close()
        results.put(("ok", rank, report, _by_value(scratch), _by_value(library), float(loss)))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the launcher raises it (Note [bounded ranks])
        results.put(("error", rank, traceback.format_exc()))


def _by_value(grads: Mapping[str, Tensor | None]) -> dict[str, Any]:
    """The gradients in ``grads`` as numpy copies, for the launcher (Note [gradients by value]); a parameter without
    one is left out, and the notebook's comparison names it."""
    return {name: g.detach().numpy().copy() for name, g in grads.items() if g is not None}


def run(world: int = 2, m: int = 4, orders: list[Order] | None = None, *, wait: float = 20.0) -> Result:
    """Train one step on ``world`` spawned ranks, by hand in ``orders`` (one per rank; default 1F1B), then by the
    library. ``wait``: the seconds a rank waits for another before it fails (Note [bounded ranks]).

    Raises:
        RuntimeError: a rank failed (its traceback in the message) or did not answer in time.
    """
    import torch.multiprocessing as mp

    orders = orders or [one_f_one_b_order(r, world, m) for r in range(world)]
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [context.Process(target=_rank, args=(r, world, port, m, orders, wait, results), daemon=True)
             for r in range(world)]
    got: dict[int, tuple[Any, ...]] = {}
    deadline = time.monotonic() + 10.0 + 2 * wait  # starting the ranks, then both steps' waits: under a cell's minute
    try:
        for p in procs:
            p.start()
        while len(got) < world:
            try:
                answer = results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
                if dead or time.monotonic() > deadline:
                    said = f"exited with code {procs[dead[0]].exitcode}" if dead else "did not answer in time"
                    raise RuntimeError(f"rank {dead[0] if dead else min(set(range(world)) - set(got))} {said}, "
                                       "without a traceback") from None
                continue
            if answer[0] == "error":
                raise RuntimeError(f"rank {answer[1]} failed:\n{answer[2]}")
            got[answer[1]] = answer[2:]
        for p in procs:
            p.join(timeout=10)
    finally:
        for p in procs:  # Note [bounded ranks]: nothing outlives the call
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return Result([got[r][0] for r in range(world)],
                  {k: torch.from_numpy(g) for r in range(world) for k, g in got[r][1].items()},
                  {k: torch.from_numpy(g) for r in range(world) for k, g in got[r][2].items()}, got[world - 1][3])


def plain_gradients() -> tuple[float, dict[str, Tensor]]:
    """The loss and gradients of the plain model on the whole mini-batch, in this process."""
    model, x, target = data()
    loss = nn.functional.mse_loss(model(x), target)
    loss.backward()
    return float(loss.detach()), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
