"""What each rank runs in the distributed tests: a step of DistributedGPipe checked against one process.

Every case is ``case(rank, world, ...) -> str`` (see :mod:`tests.distributed.ranks`), bound with
``functools.partial`` so that it pickles into a spawned rank. ``"ok"`` means every check on that rank held.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.distributed import DistributedGPipe, materialize
from gpipe.schedule import SCHEDULES, Checkpoint
from gpipe.schedule.timeline import COPY
from tests.gpipe.losses import CASES as LOSSES
from tests.gpipe.losses import data as loss_data
from tests.gpipe.losses import model as loss_model
from tests.gpipe.models import convnet, dropnet, mlp, skipnet, tuple_input, tuplenet


def chain(layers: int) -> nn.Sequential:
    """``layers`` layers, each Linear(6, 6) then Tanh, the last Linear(6, 3)."""
    body = [nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(layers - 1)]
    return nn.Sequential(*body, nn.Linear(6, 3))


MODELS: dict[str, Callable[[], nn.Sequential]] = {"mlp": mlp, "skip": skipnet, "chain8": lambda: chain(8),
                                                  "tuple": tuplenet}


def _data(model: str, batch: int) -> tuple[Any, Tensor]:
    if model == "tuple":
        return tuple_input(batch), torch.randn(batch, 6)
    return torch.randn(batch, 6), torch.randn(batch, 3)


def _check_grads(pipe: DistributedGPipe, reference: nn.Module) -> None:
    params = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        q = params[name.split(".", 2)[2]]  # partitions.<stage>.<layer>.<param> -> <layer>.<param>
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, name=name: f"{name}: {m}")


def train(rank: int, world: int, schedule: str, checkpoint: Checkpoint, model: str, balance: list[int],
          m: int) -> str:
    """One step equals the plain model: the loss on every rank, this rank's gradients, its tasks in order."""
    torch.manual_seed(0)
    module = MODELS[model]()
    reference = copy.deepcopy(module)
    x, y = _data(model, 2 * m)
    pipe = DistributedGPipe(module, balance, chunks=m, checkpoint=checkpoint, schedule=schedule, record=True,
                            timeout=30)
    loss = pipe.step(x if rank == pipe.placement[0] else None, y if rank == pipe.placement[-1] else None,
                     nn.functional.mse_loss)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    _check_grads(pipe, reference)
    assert pipe.timeline is not None
    assert pipe.timeline.task_order(rank) == list(pipe.schedule_for(m).tasks[rank])
    pipe.close()
    return "ok"


def like_gpipe(rank: int, world: int, model: str, checkpoint: Checkpoint, batch_norm: bool) -> str:
    """Random draws under checkpointing and deferred batch norm: the same loss, gradients and running statistics
    as the single-process GPipe from the same seed, over two steps."""
    make = {"drop": dropnet, "conv": convnet}[model]
    shape = (8, 6) if model == "drop" else (8, 2, 3, 3)
    target = (8, 8) if model == "drop" else (8, 27)
    results = []
    for distributed in (True, False):
        torch.manual_seed(0)
        module = make()
        x, y = torch.randn(*shape), torch.randn(*target)
        if distributed:
            pipe: Any = DistributedGPipe(module, [2, 3], chunks=4, checkpoint=checkpoint,
                                         deferred_batch_norm=batch_norm, timeout=30)
        else:
            pipe = GPipe(module, [2, 3], devices=["cpu", "cpu"], chunks=4, checkpoint=checkpoint,
                         deferred_batch_norm=batch_norm)
        losses = [pipe.step(x, y, nn.functional.mse_loss) for _ in range(2)]
        results.append((losses, dict(pipe.named_parameters()), dict(pipe.named_buffers())))
    (got, params, buffers), (want, all_params, all_buffers) = results
    torch.testing.assert_close(got, want)
    for name, p in params.items():
        torch.testing.assert_close(p.grad, all_params[name].grad, msg=lambda m, name=name: f"{name}: {m}")
    for name, b in buffers.items():
        torch.testing.assert_close(b, all_buffers[name], msg=lambda m, name=name: f"{name}: {m}")
    assert params
    return "ok"


def loss(rank: int, world: int, name: str, schedule: str) -> str:
    """A step's loss and gradients are the plain model's for one of :data:`tests.gpipe.losses.CASES` (padding in
    the targets, class weights, sums, uneven micro-batches); the input's gradient reaches ``x.grad``."""
    case = LOSSES[name]
    torch.manual_seed(0)
    module = loss_model(case)
    reference = copy.deepcopy(module)
    x, t = loss_data(case)
    want = x.clone().requires_grad_()
    expected = case.loss()(reference(want), t)
    expected.backward()
    pipe = DistributedGPipe(module, [2, len(module) - 2], chunks=4, schedule=schedule, timeout=30)
    first, last = pipe.placement[0], pipe.placement[-1]
    got = x.clone().requires_grad_()
    options = {} if case.loss_reduction is None else {"loss_reduction": case.loss_reduction}
    step_loss = pipe.step(got if rank == first else None, t if rank == last else None, case.loss(), **options)
    torch.testing.assert_close(step_loss, expected.detach(), equal_nan=True)
    _check_grads(pipe, reference)
    if rank == first:
        torch.testing.assert_close(got.grad, want.grad)
    pipe.close()
    return "ok"


def meta(rank: int, world: int) -> str:
    """A model built on meta gets, rank by rank, the weights materialize() gives it in one process."""
    with torch.device("meta"):
        module = mlp()
    pipe = DistributedGPipe(module, [3, 2], chunks=2, seed=7, timeout=30)
    with torch.device("meta"):
        reference = materialize(mlp(), "cpu", seed=7)
    params = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        assert not p.is_meta and torch.equal(p, params[name.split(".", 2)[2]]), name
    torch.manual_seed(1)
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    loss = pipe.step(x, y, nn.functional.mse_loss)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    _check_grads(pipe, reference)
    pipe.close()
    return "ok"


class Boom(nn.Module):
    """Fails in the forward (``where="F"``) or the backward (``"B"``) of the stage it is in."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def forward(self, x: Tensor) -> Tensor:
        if self.where == "F":
            raise ValueError("boom in the forward")
        return _FailBack.apply(x)


class _FailBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        raise ValueError("boom in the backward")


def fail(rank: int, world: int, stage: int, where: str, schedule: str) -> str:
    """A task that raises on the rank of ``stage``: every rank raises, naming that rank, stage and task."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(6, 6) for _ in range(world)]
    layers.insert(stage + 1, Boom(where))
    balance = [1] * world
    balance[stage] = 2
    pipe = DistributedGPipe(nn.Sequential(*layers), balance, chunks=2, schedule=schedule, timeout=30)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    try:
        pipe.step(x, y, nn.functional.mse_loss)
    except Exception as error:  # noqa: BLE001
        after = _again(pipe, x, y)
        pipe.close()
        return f"{type(error).__name__}: {error}\nAFTER: {after}"
    return "no error"


def detached_loss(rank: int, world: int) -> str:
    """A loss with no grad_fn raises as ``loss.backward()`` does, on the last stage's rank, and ends every rank before
    any gradient is written."""
    torch.manual_seed(0)
    pipe = DistributedGPipe(nn.Sequential(*[nn.Linear(6, 6) for _ in range(world)]), [1] * world, chunks=2, timeout=30)
    try:
        pipe.step(torch.randn(4, 6), torch.randn(4, 6), lambda o, t: nn.functional.mse_loss(o, t).detach())
    except Exception as error:  # noqa: BLE001
        written = [n for n, p in pipe.named_parameters() if p.grad is not None]
        pipe.close()
        return f"{type(error).__name__}: {error}".splitlines()[0] + f"\nGRADS: {written}"
    return "no error"


def _again(pipe: DistributedGPipe, x: Tensor, y: Tensor) -> str:
    try:
        pipe.step(x, y, nn.functional.mse_loss)
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return "stepped"


def hang(rank: int, world: int) -> str:
    """The last rank sleeps past the timeout inside a task: the others fail saying what they waited for."""
    class Sleep(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            time.sleep(4.0)
            return x

    layers = [nn.Linear(6, 6), Sleep(), nn.Linear(6, 6)] if world == 2 else []
    pipe = DistributedGPipe(nn.Sequential(*layers), [1, 2], chunks=1, timeout=1.5)
    try:
        pipe.step(torch.randn(2, 6), torch.randn(2, 6), nn.functional.mse_loss)
    except Exception as error:  # noqa: BLE001
        pipe.close()
        return f"{type(error).__name__}: {error}"
    return "no error"


def kill(rank: int, world: int, victim: int) -> str:
    """Rank ``victim`` dies in its forward: the others fail with a message naming it."""
    class Die(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            os._exit(3)

    layers: list[nn.Module] = [nn.Linear(6, 6) for _ in range(world)]
    layers.insert(victim + 1, Die())
    balance = [1] * world
    balance[victim] = 2
    # no dry run (Note [a dry run on fake tensors]): Die would end every rank there
    pipe = DistributedGPipe(nn.Sequential(*layers), balance, chunks=2, timeout=20, check_shapes=False)
    try:
        pipe.step(torch.randn(4, 6), torch.randn(4, 6), nn.functional.mse_loss)
    except Exception as error:  # noqa: BLE001
        pipe.close()
        return f"{type(error).__name__}: {error}"
    return "no error"


def bad_balance(rank: int, world: int) -> str:
    DistributedGPipe(mlp(), [1] * 5, chunks=2, timeout=30)
    return "accepted"


def bad_input(rank: int, world: int, what: str) -> str:
    """Bad input is refused on every rank before anything is sent: the same pipeline then steps."""
    torch.manual_seed(0)
    pipe = DistributedGPipe(mlp(), [3, 2], chunks=4, timeout=30)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    bad_x, bad_y = {"empty": (torch.randn(0, 6), y), "target": (x, torch.randn(6, 3)), "type": ([1, 2], y)}[what]
    try:
        pipe.step(bad_x, bad_y, nn.functional.mse_loss)
    except Exception as error:  # noqa: BLE001
        result = f"{type(error).__name__}: {error}"
    else:
        result = "accepted"
    return f"{result}\nAFTER: {_again(pipe, x, y)}"


def shape_mismatch(rank: int, world: int) -> str:
    """Stage 1's first layer takes 5 features, stage 0 makes 6: refused on every rank before anything is sent."""
    pipe = DistributedGPipe(nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(5, 3)), [2, 1], chunks=2,
                            timeout=30)
    pipe.step(torch.randn(4, 6) if rank == 0 else None, torch.randn(4, 3) if rank == 1 else None,
              nn.functional.mse_loss)
    return "accepted"


class _Scale(nn.Module):
    """``x * w``, for inputs of any shape: a stage that keeps what it is given, with a parameter to train."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.w


def new_structures(rank: int, world: int) -> str:
    """Note [one exchange a step]: an input structure not seen before (other rows, other dimensions) is checked on
    every rank before anything is sent, a known one is not fetched again; the losses equal the plain model's."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), _Scale(), nn.Linear(6, 3))
    reference = copy.deepcopy(module)
    data = [(torch.randn(*shape), torch.randn(shape[0], 3)) for shape in ((4, 6), (6, 2, 3), (4, 6), (4, 5), (6, 2, 3))]
    pipe = DistributedGPipe(module, [2, 1], chunks=2, timeout=30)  # after the data, as train() draws it
    results = []
    for x, y in data:
        try:
            loss = pipe.step(x if rank == 0 else None, y if rank == 1 else None, nn.functional.mse_loss)
        except ValueError as error:
            results.append(f"{type(error).__name__}: {error}".splitlines()[0])
            continue
        torch.testing.assert_close(loss, nn.functional.mse_loss(reference(x), y).detach())
        results.append("stepped")
    pipe.close()
    return " | ".join(results) + f" | checked {len(pipe._checked)}"


def gathered(rank: int, world: int, schedule: str, balance: list[int], m: int) -> str:
    """Two recorded steps, the second gathered to rank 0 on one clock: each rank's compute spans in its schedule's
    order, every task starting after its dependencies end (within the stated residual), one copy span per
    message between ranks, on the receiving rank."""
    torch.manual_seed(0)
    pipe = DistributedGPipe(chain(sum(balance)), balance, chunks=m, schedule=schedule, record=True, timeout=30)
    x, y = torch.randn(2 * m, 6), torch.randn(2 * m, 3)
    for _ in range(2):
        pipe.step(x if rank == pipe.placement[0] else None, y if rank == pipe.placement[-1] else None,
                  nn.functional.mse_loss)
    timeline = pipe.gather_timeline()
    pipe.close()
    if rank != 0:
        assert timeline is None
        return "ok"
    assert timeline is not None and timeline.num_devices == world
    plan = pipe.schedule_for(m)
    residual = timeline.meta["clock"]["residual"]
    assert 0 <= residual < float("inf") and len(timeline.meta["clock"]["offsets"]) == world
    for d in range(world):
        assert timeline.task_order(d) == list(plan.tasks[d]), d
    ends = {s.task: s.end for s in timeline.compute_spans()}
    for s in timeline.compute_spans():
        for dep in plan.dependencies(s.task):
            assert s.start >= ends[dep] - residual, (s.task, dep, s.start, ends[dep], residual)
    crossing = sorted({(plan.device_of(t.stage), str(dep)) for t in plan.all_tasks() for dep in plan.dependencies(t)
                       if plan.device_of(dep.stage) != plan.device_of(t.stage)})
    copies = sorted((s.device, str(s.task)) for s in timeline.spans if s.stream == COPY)
    assert copies == crossing, (copies, crossing)
    assert all(s.end >= s.start for s in timeline.spans)
    return "ok"


def refused(name: str, checkpoint: str, n: int, m: int, world: int) -> bool:
    """Whether schedule ``name`` refuses ``n`` stages on ``world`` ranks with ``m`` micro-batches (its
    documented ``ValueError``): such a case is left out of the parametrization, not skipped."""
    try:
        SCHEDULES[name](m, n * SCHEDULES[name].copies, checkpoint, devices=world).validate()  # type: ignore[arg-type]
    except ValueError:
        return True
    return False
