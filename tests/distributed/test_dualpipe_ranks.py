"""DeepSeek-V3's DualPipe on ``DistributedGPipe`` (2, 3 and 4 gloo processes, one spawn each,
:mod:`tests.distributed.ranks`): each rank holds stage ``d`` and a copy of stage ``p-1-d``, the two ends read the
batch, the mirror ranks sum each stage's gradients by an all-reduce recorded as a collective span (the middle rank of
an odd ``p`` sums its two slots alone), and after SGD steps every slot's parameters equal the plain model's (Note
[mirrored stages] in :mod:`gpipe.distributed.mirrors`).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from gpipe.distributed import DistributedGPipe
from gpipe.schedule import dualpipe
from gpipe.schedule.timeline import COLLECTIVE
from tests.distributed.ranks import Case, run

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)


def _model(stages: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(6, 8)]
    for _ in range(2 * stages - 2):
        layers += [nn.Tanh(), nn.Linear(8, 8)]
    return nn.Sequential(*layers, nn.Linear(8, 3))


def _balance(model: nn.Sequential, stages: int) -> list[int]:
    size = len(model) // stages
    return [size] * (stages - 1) + [len(model) - size * (stages - 1)]


def train(rank: int, world: int, chunks: int, checkpoint: str, steps: int) -> str:
    """``steps`` SGD steps: the loss on every rank and, after each step, every parameter of this rank's slots equal
    the plain model's layer; the rank's tasks in the schedule's order, and the mirrors' all-reduce recorded."""
    torch.manual_seed(0)
    module = _model(world)
    reference = copy.deepcopy(module)
    pipe = DistributedGPipe(module, _balance(module, world), chunks=chunks, checkpoint=checkpoint,
                            schedule="dualpipe", record=True, timeout=30)
    assert pipe.placement == dualpipe(chunks, 2 * world).placement
    assert sorted(pipe.stages) == sorted({rank, 2 * world - 1 - rank})
    ours = torch.optim.SGD(pipe.parameters(), lr=0.05)
    theirs = torch.optim.SGD(reference.parameters(), lr=0.05)
    layers = dict(reference.named_parameters())
    ends = {0, world - 1}
    data = torch.Generator().manual_seed(1)  # alike on every rank: a step draws its seed on rank 0 alone
    for _ in range(steps):
        x, y = torch.randn(2 * chunks, 6, generator=data), torch.randn(2 * chunks, 3, generator=data)
        ours.zero_grad()
        theirs.zero_grad()
        loss = pipe.step(x if rank in ends else None, y if rank in ends else None, nn.functional.mse_loss)
        expected = nn.functional.mse_loss(reference(x), y)
        expected.backward()
        torch.testing.assert_close(loss, expected.detach())
        for name, p in pipe.named_parameters():
            q = layers[name.split(".", 2)[2]]  # partitions.<slot>.<layer>.<param> -> <layer>.<param>
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        ours.step()
        theirs.step()
        for name, p in pipe.named_parameters():
            torch.testing.assert_close(p, layers[name.split(".", 2)[2]], msg=name)
    timeline = pipe.timeline
    assert timeline is not None
    assert timeline.task_order(rank) == list(pipe.schedule_for(chunks).tasks[rank])
    reduced = [s for s in timeline.spans if s.stream == COLLECTIVE and "mirrored stages" in s.label]
    middle = world % 2 == 1 and rank == world // 2
    assert len(reduced) == (0 if middle else 1), reduced
    pipe.close()
    return "ok"


def different_batches(rank: int, world: int) -> str:
    """The two ends read different batches: refused on every rank before anything is sent."""
    torch.manual_seed(0)
    module = _model(world)
    pipe = DistributedGPipe(module, _balance(module, world), chunks=2 * world, schedule="dualpipe", timeout=30)
    rows = 4 * world if rank != world - 1 else 4 * world + 2
    x, y = torch.randn(rows, 6), torch.randn(rows, 3)
    try:
        pipe.step(x if rank in (0, world - 1) else None, y if rank in (0, world - 1) else None,
                  nn.functional.mse_loss)
    except ValueError as error:
        return str(error)
    finally:
        pipe.close()
    return "stepped"


CASES: dict[int, dict[str, Case]] = {
    2: {"never": functools.partial(train, chunks=4, checkpoint="never", steps=2),
        "except_last-odd": functools.partial(train, chunks=5, checkpoint="except_last", steps=2),
        "batches": different_batches},
    3: {"always": functools.partial(train, chunks=6, checkpoint="always", steps=2), "batches": different_batches},
    4: {"except_last": functools.partial(train, chunks=8, checkpoint="except_last", steps=2),
        "batches": different_batches},
}


@pytest.fixture(scope="module", params=sorted(CASES))
def results(request: pytest.FixtureRequest) -> tuple[int, dict[str, list[str | None]]]:
    world = request.param
    return world, run(world, list(CASES[world].items()))


def test_dualpipe_trains_like_the_plain_model_on_every_rank(
        results: tuple[int, dict[str, list[str | None]]]) -> None:
    world, out = results
    for name in CASES[world]:
        if name != "batches":
            assert out[name] == ["ok"] * world, (name, out[name])


def test_ends_that_read_different_batches_are_refused_on_every_rank(
        results: tuple[int, dict[str, list[str | None]]]) -> None:
    world, out = results
    message = f"rank {world - 1}'s input differs from rank 0's: give them the same batch"
    assert all(text is not None and message in text for text in out["batches"]), out["batches"]
