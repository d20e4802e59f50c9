"""The front-end (:mod:`gpipe.frontend`): one construction for GPipe and DistributedGPipe (Note [one front-end])."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gpipe import DeferredBatchNorm, GPipe
from gpipe.distributed import DistributedGPipe
from gpipe.frontend import Arguments, stage_placement
from gpipe.schedule import Op, Schedule, ScheduleError, one_f_one_b, parse_tasks
from tests.gpipe.models import convnet


def chain(layers: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(3, 3) for _ in range(layers)])


def check(module: nn.Module, balance: Any, **given: Any) -> Arguments:
    options: dict[str, Any] = {"chunks": None, "checkpoint": None, "schedule": "gpipe", "deferred_batch_norm": False}
    return Arguments.check("GPipe", module, balance, **(options | given))  # type: ignore[arg-type]


STUCK = Schedule(2, 2, "never", (0, 1), (parse_tasks("F0@0 F1@0 B1@0 B0@0"), parse_tasks("B0@1 F0@1 F1@1 B1@1")),
                 name="stuck")


@pytest.mark.parametrize(("given", "error", "message"), [
    ({"balance": [1, 2]}, ValueError, "balance [1, 2] sums to 3 but the module has 2 layers"),
    ({"chunks": 0}, ValueError, "must be a positive integer, got 0"),
    ({"checkpoint": "sometimes"}, ValueError, "unknown checkpoint mode 'sometimes'"),
    ({"schedule": "nope"}, ValueError, "unknown schedule 'nope'"),
    ({"schedule": "interleaved-1f1b:turn=2"}, ValueError, "unknown option 'turn'"),
    ({"schedule": one_f_one_b(4, 2), "chunks": 2}, ValueError, "chunks=2, but schedule '1f1b' runs m=4"),
    ({"schedule": STUCK}, ScheduleError, "schedule 'stuck' deadlocks"),
])
def test_both_executors_refuse_a_bad_argument_alike_before_joining_a_group(given: dict[str, Any],
                                                                           error: type[Exception],
                                                                           message: str) -> None:
    """DistributedGPipe checks its arguments where GPipe does, before it joins a process group (there is none here)."""
    arguments = {"balance": [1, 1]} | given
    balance = arguments.pop("balance")
    builds: list[Callable[[], object]] = [lambda: GPipe(chain(2), balance, **arguments),
                                          lambda: DistributedGPipe(chain(2), balance, **arguments)]
    for build in builds:
        with pytest.raises(error) as info:
            build()
        assert message in str(info.value)
    assert not dist.is_initialized()


def test_the_type_error_names_the_executor() -> None:
    for owner in ("GPipe", "DistributedGPipe"):
        with pytest.raises(TypeError, match=f"^{owner} partitions an nn.Sequential, got Linear: wrap the layers"):
            Arguments.check(owner, nn.Linear(3, 3), [1], chunks=None, checkpoint=None,  # type: ignore[arg-type]
                            schedule="gpipe", deferred_batch_norm=False)


def test_the_arguments_take_a_given_schedules_m_and_policy() -> None:
    given = one_f_one_b(4, 2, "always")
    arguments = check(chain(2), [1, 1], schedule=given)
    assert (arguments.chunks, arguments.checkpoint, arguments.schedule_name) == (4, "always", "1f1b")
    assert arguments.given is given and arguments.kind is None
    named = check(chain(2), [1, 1], schedule="interleaved-1f1b:round=2")
    assert named.kind is not None and named.kind.name == named.schedule_name == "interleaved-1f1b:round=2"
    assert (named.chunks, named.checkpoint, named.given) == (1, "except_last", None)


@pytest.mark.parametrize(("schedule", "devices", "layout", "placement"), [
    ("gpipe", None, None, (0, 1, 2, 3)),
    ("gpipe", 4, None, (0, 1, 2, 3)),
    ("interleaved-1f1b", 2, (0, 1, 0, 1), (0, 1, 0, 1)),
    ("interleaved-1f1b", 4, None, (0, 1, 2, 3)),  # as many devices as stages: the generator's own
    ("zb-v", 2, (0, 1, 1, 0), (0, 1, 1, 0)),
    ("zb-v", None, None, (0, 1, 1, 0)),  # the generator's own V
    ("zb-v", 4, None, (0, 1, 1, 0)),
])
def test_gpipe_places_by_the_layout_only_on_fewer_devices(schedule: str, devices: int | None,
                                                          layout: tuple[int, ...] | None,
                                                          placement: tuple[int, ...]) -> None:
    spec = check(chain(4), [1] * 4, chunks=4, schedule=schedule).on_devices(devices)
    assert (spec.layout, spec.placement) == (layout, placement)
    assert spec.schedule(4).placement == placement
    assert stage_placement(schedule, 4, devices, 4, "except_last") == placement


@pytest.mark.parametrize(("schedule", "devices"), [("gpipe", 4), ("interleaved-1f1b", 2), ("looped-bfs", 2),
                                                   ("zb-v", 2), ("dualpipe-v", 2), ("1f1b", 4)])
def test_the_placement_without_a_model_is_gpipes(schedule: str, devices: int) -> None:
    pipe = GPipe(chain(4), [1] * 4, devices=["cpu"] * devices, chunks=4, schedule=schedule)
    assert pipe.schedule.placement == stage_placement(schedule, 4, devices, 4, "except_last")


def test_a_given_schedule_keeps_its_placement_on_any_count() -> None:
    given = one_f_one_b(4, 2)
    for devices in (None, 1, 2, 5):
        spec = check(chain(2), [1, 1], schedule=given).on_devices(devices)
        assert spec.placement == given.placement and spec.schedule(4) is given
    assert stage_placement(given, 2, 1, 4, "except_last") == given.placement


def test_ranks_take_the_layout_for_the_group_size() -> None:
    arguments = check(chain(4), [1] * 4, chunks=4, schedule="zb-v")
    spec = arguments.on_ranks(2)
    assert spec.placement == spec.layout == (0, 1, 1, 0) and spec.stages_on(1) == [1, 2]
    assert spec.schedule(4).placement == (0, 1, 1, 0)
    with pytest.raises(ValueError, match=r"^balance \[1, 1, 1, 1\] makes 4 stages, which schedule 'zb-v' cannot "
                                         r"place on 4 ranks: a V places two stages on each device.*"
                                         r"\(launch 2 processes \(e.g. torchrun --nproc-per-node 2\) or change the "
                                         r"balance\)$"):
        arguments.on_ranks(4)  # the hint is a count the V places four stages on, not the stage count
    with pytest.raises(ValueError, match=r"\(change the balance\)$"):  # no rank count places three stages in a V
        check(chain(3), [1] * 3, schedule="zb-v").on_ranks(2)
    with pytest.raises(ValueError, match="schedule 'gpipe' cannot place on 3 ranks"):
        check(chain(2), [1, 1]).on_ranks(3)


def test_ranks_take_a_given_schedule_of_one_device_each() -> None:
    given = one_f_one_b(4, 3)
    assert check(chain(3), [1] * 3, schedule=given).on_ranks(3).placement == (0, 1, 2)
    with pytest.raises(ValueError, match=r"^schedule '1f1b' runs on 3 devices, a rank each, but the group has 2 "
                                         r"ranks: launch 3 processes"):
        check(chain(3), [1] * 3, schedule=given).on_ranks(2)


def test_a_step_schedule_is_built_once_per_shape() -> None:
    spec = check(chain(2), [1, 1], chunks=4, schedule="1f1b").on_devices(None)
    assert spec.schedule(4) is spec.schedule(4, "except_last")
    assert spec.schedule(2).m == 2 and spec.schedule(4, "never").checkpoint == "never"
    assert spec.schedule(4, name="gpipe").name == "gpipe"


def test_a_given_schedule_is_the_step_and_gpipes_forwards_infer() -> None:
    given = one_f_one_b(4, 2, "always")
    spec = check(chain(2), [1, 1], schedule=given).on_devices(None)
    assert spec.schedule(4) is given
    eval_mode = spec.schedule(4, "never")
    assert eval_mode.checkpoint == "never" and all(t.op is not Op.R for ts in eval_mode.tasks for t in ts)
    with pytest.raises(ValueError, match="this batch splits into 3 micro-batches, but schedule '1f1b' is fixed"):
        spec.schedule(3)
    assert spec.schedule(3, "never", "gpipe").placement == given.placement


def test_the_layers_are_cut_by_the_balance_and_batch_norm_deferred_only_when_asked() -> None:
    module = convnet()
    spec = check(module, [2, 3], chunks=4, deferred_batch_norm=True).on_devices(None)
    assert isinstance(module[1], nn.BatchNorm2d) and not isinstance(module[1], DeferredBatchNorm)  # not yet
    layers = spec.stage_layers()
    assert [list(ls) for ls in layers] == [["0", "1"], ["2", "3", "4"]]
    assert isinstance(layers[0]["1"], DeferredBatchNorm) and layers[0]["1"].chunks == 4
    assert spec.stage_layers()[0]["1"] is layers[0]["1"]  # asked again: the same layers
    plain = check(convnet(), [2, 3]).on_devices(None).stage_layers()
    assert not isinstance(plain[0]["1"], DeferredBatchNorm)


def test_both_executors_hold_the_specs_decisions() -> None:
    pipe = GPipe(chain(4), [2, 1, 1], devices=["cpu"] * 3, chunks=2, schedule="1f1b")
    assert pipe.spec.arguments.balance == (2, 1, 1) and pipe.balance == [2, 1, 1]
    assert pipe.schedule is pipe.spec.schedule(2)
    assert [len(p) for p in pipe.partitions] == [2, 1, 1]
    assert all(p.device == torch.device("cpu") for p in pipe.parameters())
