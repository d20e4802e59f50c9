"""A new schedule is one generator registered once: the simulator, the executor and the CLI run it by name.

The schedule here is not the library's: GPipe's fill-drain, with each stage's backwards in forward
micro-batch order (``B0`` first), registered for these tests only::

    n=2, m=3, never:   dev0  F0 F1 F2 .  .  .  B0 B1 B2
                       dev1  .  F0 F1 F2 B0 B1 B2 .  .
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.schedule import (
    CHECKPOINT_MODES,
    SCHEDULES,
    Checkpoint,
    Op,
    Schedule,
    Task,
    checkpointed,
    gpipe,
    parse_tasks,
    register,
    unregister,
)
from sim.cli import main
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import simulate
from sim.planning.counting.flops import count_layers
from sim.planning.hardware.catalog import DeviceSpec
from sim.planning.plan import PlanRequest, plan
from tests.gpipe.models import dropnet, mlp, skipnet

NAME = "forward-order"


def forward_order(m: int, n: int, checkpoint: Checkpoint = "except_last",
                  placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's forwards in clock cycles; then ``B(i, j)`` (after its ``R``) at drain cycle ``i + n - 1 - j``."""
    devices = tuple(range(n)) if placement is None else tuple(placement)
    lists: list[list[Task]] = [[] for _ in range(max(devices) + 1)]
    for k in range(m + n - 1):
        for j in range(n):
            if 0 <= k - j < m:
                lists[devices[j]].append(Task(Op.F, k - j, j))
    for k in range(m + n - 1):
        for j in reversed(range(n)):
            i = k - (n - 1 - j)
            if 0 <= i < m:
                if checkpointed(checkpoint, i, m):
                    lists[devices[j]].append(Task(Op.R, i, j))
                lists[devices[j]].append(Task(Op.B, i, j))
    return Schedule(m, n, checkpoint, devices, tuple(map(tuple, lists)), name=NAME)


@pytest.fixture
def registered() -> Iterator[str]:
    register(NAME, "GPipe's fill-drain with the backwards in forward micro-batch order")(forward_order)
    try:
        yield NAME
    finally:
        unregister(NAME)
    assert NAME not in SCHEDULES


def test_the_schedule_looks_like_the_diagram(registered: str) -> None:
    s = SCHEDULES[registered](3, 2, "never")
    assert s.validate() is s and s.forwards_first
    assert s.tasks == (parse_tasks("F0@0 F1@0 F2@0 B0@0 B1@0 B2@0"), parse_tasks("F0@1 F1@1 F2@1 B0@1 B1@1 B2@1"))
    assert SCHEDULES[registered].default_checkpoint == "except_last"
    for m, n, policy in [(1, 1, "always"), (5, 3, "except_last"), (4, 4, "always"), (2, 5, "never")]:
        for placement in (None, [j % 2 for j in range(n)] if n > 1 else None):
            assert SCHEDULES[registered](m, n, policy, placement).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize(("m", "n"), [(1, 1), (4, 3), (8, 4), (3, 6)])
@pytest.mark.parametrize("checkpoint", ["never", "always"])
def test_the_simulator_runs_it_to_a_closed_form(registered: str, m: int, n: int, checkpoint: Checkpoint) -> None:
    """Free copies, F = 1, B = 2, R = 1: the forwards end at ``(m + n - 1) F``; the last stage then runs
    ``R B`` pairs back to back and every stage below follows one ``B`` later, so the makespan is
    ``(m + n - 1)(F + B) + m R`` with each micro-batch checkpointed (``m R`` is 0 without): without
    checkpointing, GPipe's own closed form."""
    schedule = SCHEDULES[registered](m, n, checkpoint)
    timeline = simulate(schedule, CostModel.uniform(n, 1.0, 2.0))
    recompute = m * 1.0 if checkpoint == "always" else 0.0
    assert timeline.makespan == (m + n - 1) * (1.0 + 2.0) + recompute
    for d in range(n):
        assert timeline.task_order(d) == list(schedule.tasks[d])
    if checkpoint == "never":
        assert timeline.makespan == simulate(gpipe(m, n, "never"), CostModel.uniform(n, 1.0, 2.0)).makespan
    two_phases = simulate(schedule, CostModel.uniform(n, 1.0, 2.0), SimConfig(backward_after_forward=True))
    assert two_phases.makespan >= timeline.makespan  # its forwards come first: two phases accept it


def test_the_cli_reads_the_registry(registered: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", "--schedule", registered, "--stages", "3", "--chunks", "4", "--checkpoint", "never",
                 "--json", "--out", str(tmp_path / "out")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schedule"] == registered and doc["makespan"] == (4 + 3 - 1) * 3.0
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    described = f"{registered} (GPipe's fill-drain with the backwards in forward micro-batch order)"
    assert "".join(described.split()) in "".join(capsys.readouterr().out.split())  # however argparse wraps it


def _grads(model: nn.Module) -> list[Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("build", [mlp, skipnet], ids=["mlp", "skipnet"])
def test_the_executor_trains_it_like_the_plain_model(registered: str, checkpoint: str,
                                                     build: Callable[[], nn.Sequential]) -> None:
    """``step()`` and ``forward()`` + ``backward()`` both run it, with the plain model's loss and gradients."""
    torch.manual_seed(0)
    model = build()
    reference = copy.deepcopy(model)
    x, y = torch.randn(9, 6), torch.randn(9, 3)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()

    pipe = GPipe(model, [2, 2, 1], devices=["cpu"] * 3, chunks=4, checkpoint=checkpoint, schedule=registered,
                 record=True)
    assert pipe.schedule.name == registered and pipe.schedule == forward_order(4, 3, checkpoint)  # type: ignore[arg-type]
    loss = pipe.step(x, y, nn.functional.mse_loss)
    torch.testing.assert_close(loss, expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert pipe.timeline is not None and pipe.timeline.meta["schedule"] == registered
    for d in range(3):
        assert pipe.timeline.task_order(d) == list(pipe.schedule.tasks[d])

    model.zero_grad()
    nn.functional.mse_loss(pipe(x), y).backward()  # its forwards come first: the two-phase path runs it too
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert pipe.timeline is not None and pipe.timeline.meta["schedule"] == registered
    with torch.no_grad():
        torch.testing.assert_close(pipe(x), reference(x))


def test_the_planner_sweeps_it(registered: str) -> None:
    profile = count_layers(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), torch.randn(2, 64))
    device = DeviceSpec("small", {"fp32": 10e12}, 500e9, 2**30, efficiency=0.5)
    def sweep(schedules: list[str] | None) -> set[str]:
        result = plan(PlanRequest(profile=profile, batch=16, device=device, gpus=[2], link="pcie4-x16",
                                  training="fp32-adam", chunks=[4], stages=[2], checkpoints=["never"],
                                  schedules=schedules))
        return {r.schedule for r in result.rows}

    assert sweep([registered]) == {registered}
    assert sweep(None) == set(SCHEDULES) and registered in SCHEDULES  # by default, every registered schedule


def test_random_draws_match_gpipe(registered: str) -> None:
    """A checkpointed task's draws are a function of the task, not of the order: recompute is exact whatever
    order the backwards run in, so the gradients equal GPipe's."""
    def grads(schedule: str) -> list[Tensor]:
        torch.manual_seed(0)
        model = dropnet()
        pipe = GPipe(model, [2, 3], devices=["cpu"] * 2, chunks=4, checkpoint="always", schedule=schedule)
        torch.manual_seed(1)
        pipe.step(torch.randn(8, 6), torch.randn(8, 8), nn.functional.mse_loss)
        return _grads(model)

    for ours, theirs in zip(grads(registered), grads("gpipe"), strict=True):
        torch.testing.assert_close(ours, theirs)
