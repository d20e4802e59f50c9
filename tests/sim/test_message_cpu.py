"""Note [a message's CPU]: on CPU ranks each stage's messages to and from other ranks are priced on the tasks that
send and receive them, at the idle link's bandwidth, for ``F`` and ``B`` only; stages on one rank exchange none."""

from __future__ import annotations

import pytest

from gpipe.schedule import Op
from sim.calibration.host import executor_costs
from sim.calibration.processes import with_wire
from sim.core.cost import CostModel, StageCost
from sim.core.link import LinkSpec

IDLE = LinkSpec("idle", 1e-4, 1e9, "1 GB/s")


def _cost(n: int) -> CostModel:
    return CostModel(tuple(StageCost(forward=1.0, backward=2.0, send_bytes=1000 * (j + 1)) for j in range(n)))


def test_one_stage_per_rank_pays_for_each_boundary_it_touches() -> None:
    stages = executor_costs(with_wire(_cost(2), (0, 1), IDLE)).stages
    # stage 0 sends its 1000-byte activation (F) and receives its gradient (B); stage 1 the other ends
    assert [(s.wire_forward, s.wire_backward) for s in stages] == [(1e-6, 1e-6), (1e-6, 1e-6)]


def test_stages_on_one_rank_exchange_nothing_between_them() -> None:
    looped = executor_costs(with_wire(_cost(4), (0, 1, 0, 1), IDLE)).stages
    assert [s.wire_forward for s in looped] == pytest.approx([1e-6, 3e-6, 5e-6, 3e-6])
    v_shape = executor_costs(with_wire(_cost(4), (0, 1, 1, 0), IDLE)).stages  # stages 1 and 2 share rank 1
    assert [s.wire_forward for s in v_shape] == pytest.approx([1e-6, 1e-6, 3e-6, 3e-6])
    assert [s.wire_backward for s in v_shape] == [s.wire_forward for s in v_shape]


def test_only_forwards_and_backwards_pay_for_messages() -> None:
    runner = executor_costs(with_wire(_cost(2), (0, 1), IDLE))
    base = executor_costs(_cost(2))
    for op, paid in ((Op.F, 1e-6), (Op.B, 1e-6), (Op.R, 0.0), (Op.W, 0.0)):
        assert runner.host_seconds(op, 1, False) - base.host_seconds(op, 1, False) == pytest.approx(paid), op
    assert runner.host_seconds(Op.F, 1, True) - base.host_seconds(Op.F, 1, True) == pytest.approx(1e-6)  # no-grad F
