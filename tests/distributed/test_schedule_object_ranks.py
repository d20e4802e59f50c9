"""``DistributedGPipe(..., schedule=a_schedule)`` on 2 gloo processes (one spawn for the module,
:mod:`tests.distributed.ranks`): a generated, a hand-edited and an imported schedule, and DualPipeV's pairs two
stages a rank, train like the plain model in the schedule's own order; a schedule for another world size, a
disagreeing ``chunks``, a deadlock and a batch smaller than the schedule are refused on every rank.

(Named apart from ``tests/gpipe/test_schedule_object.py``: test modules here are imported by their file name.)
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from gpipe.distributed import DistributedGPipe
from gpipe.schedule import (
    Schedule,
    dualpipe_v,
    from_pipelining,
    one_f_one_b,
    parse_schedule,
    parse_tasks,
    schedule_text,
    to_pipelining,
    v_shape,
    zb_h1,
)
from tests.distributed.cases import chain
from tests.distributed.ranks import Case, run

WORLD = 2
# 1F1B with device 0's list reordered (its F1@0 after B0@0): valid, and not what any generator builds
EDITED = parse_schedule(schedule_text(one_f_one_b(4, 2, "always")).replace("device 0: F0@0 F1@0 R0@0 B0@0",
                                                                           "device 0: F0@0 R0@0 B0@0 F1@0"))
SCHEDULES: dict[str, Schedule] = {
    "generated": one_f_one_b(4, 2, "except_last"),
    "edited": EDITED,
    "imported": from_pipelining(to_pipelining(zb_h1(4, 2)), "always", name="imported"),
    "pairs": dualpipe_v(4, 4, "never", v_shape(4, WORLD)),
}
STUCK = Schedule(2, 2, "never", (0, 1), (parse_tasks("F0@0 F1@0 B1@0 B0@0"), parse_tasks("B0@1 F0@1 F1@1 B1@1")),
                 name="stuck")


def train(rank: int, world: int, schedule: Schedule) -> str:
    """One step equals the plain model: the loss on every rank, this rank's gradients, its tasks in the given order."""
    torch.manual_seed(0)
    module = chain(schedule.n)
    reference = copy.deepcopy(module)
    x, y = torch.randn(2 * schedule.m, 6), torch.randn(2 * schedule.m, 3)
    pipe = DistributedGPipe(module, [1] * schedule.n, schedule=schedule, record=True, timeout=30)
    assert (pipe.chunks, pipe.checkpoint, pipe.placement) == (schedule.m, schedule.checkpoint, schedule.placement)
    loss = pipe.step(x if rank == pipe.placement[0] else None, y if rank == pipe.placement[-1] else None,
                     nn.functional.mse_loss)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    params = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        torch.testing.assert_close(p.grad, params[name.split(".", 2)[2]].grad)  # partitions.<stage>.<layer>...
    assert pipe.timeline is not None and pipe.timeline.task_order(rank) == list(schedule.tasks[rank])
    pipe.close()
    return "ok"


def refused(rank: int, world: int, what: str) -> str:
    """A pipeline that cannot be built: the error every rank raises."""
    if what == "world":
        DistributedGPipe(chain(3), [1, 1, 1], schedule=one_f_one_b(4, 3), timeout=30)
    elif what == "chunks":
        DistributedGPipe(chain(2), [1, 1], chunks=2, schedule=one_f_one_b(4, 2), timeout=30)
    else:
        DistributedGPipe(chain(2), [1, 1], schedule=STUCK, timeout=30)
    return "accepted"


def small_batch(rank: int, world: int) -> str:
    """A batch of 3 rows for a schedule of 4 micro-batches: refused on every rank before anything is sent; the same
    pipeline then steps a batch of 4."""
    torch.manual_seed(0)
    pipe = DistributedGPipe(chain(2), [1, 1], schedule=one_f_one_b(4, 2), timeout=30)
    results = []
    for rows in (3, 4):
        try:
            pipe.step(torch.randn(rows, 6), torch.randn(rows, 3), nn.functional.mse_loss)
        except ValueError as error:
            results.append(f"ValueError: {error}")
        else:
            results.append("stepped")
    pipe.close()
    return "\nAFTER: ".join(results)


CASES: dict[str, Case] = {f"train-{k}": functools.partial(train, schedule=s) for k, s in SCHEDULES.items()}
CASES.update({f"refused-{w}": functools.partial(refused, what=w) for w in ("world", "chunks", "stuck")})
CASES["small-batch"] = small_batch


@pytest.fixture(scope="module")
def results() -> dict[str, list[str | None]]:
    return run(WORLD, list(CASES.items()))


@pytest.mark.slow
@pytest.mark.parametrize("case", [k for k in CASES if k.startswith("train-")])
def test_a_given_schedule_trains_like_one_process(results: dict[str, list[str | None]], case: str) -> None:
    assert results[case] == ["ok"] * WORLD


@pytest.mark.slow
@pytest.mark.parametrize(("case", "message"), [
    ("refused-world", "raised ValueError: schedule '1f1b' runs on 3 devices, a rank each, but the group has 2 ranks: "
                      "launch 3 processes (e.g. torchrun --nproc-per-node 3), or give a schedule of 2 devices"),
    ("refused-chunks", "raised ValueError: chunks=2, but schedule '1f1b' runs m=4 micro-batches"),
    ("refused-stuck", "raised ScheduleError: schedule 'stuck' deadlocks at step"),
])
def test_a_schedule_that_cannot_run_is_refused_on_every_rank(results: dict[str, list[str | None]], case: str,
                                                            message: str) -> None:
    for result in results[case]:
        assert result is not None and result.startswith(message), result


@pytest.mark.slow
def test_a_batch_smaller_than_the_schedule_is_refused_on_every_rank(results: dict[str, list[str | None]]) -> None:
    for result in results["small-batch"]:
        assert result == ("ValueError: this batch splits into 3 micro-batches, but schedule '1f1b' is fixed to m=4: "
                          "give batches of at least 4 samples (drop a last small one, e.g. DataLoader(..., "
                          "drop_last=True)), or build the pipeline with a registered schedule's name, which fits any "
                          "batch\nAFTER: stepped"), result
