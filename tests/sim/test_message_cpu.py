"""Note [a message's CPU]: on CPU ranks each stage's messages to and from other ranks are priced on the tasks that
send and receive them, at what the ranks' probe found one end of a message of that size costs, for ``F`` and ``B``
only; stages on one rank exchange none."""

from __future__ import annotations

import pytest

from gpipe.schedule import Op
from sim.calibration.host import executor_costs
from sim.calibration.wire_cost import MessageCpu, message_sizes, with_wire
from sim.core.cost import CostModel, StageCost

PRICE = MessageCpu((1000, 2000, 3000, 4000), (1e-6, 3e-6, 5e-6, 7e-6))


def _cost(n: int) -> CostModel:
    return CostModel(tuple(StageCost(forward=1.0, backward=2.0, send_bytes=1000 * (j + 1)) for j in range(n)))


def test_one_stage_per_rank_pays_for_each_boundary_it_touches() -> None:
    stages = executor_costs(with_wire(_cost(2), (0, 1), PRICE)).stages
    # stage 0 sends its 1000-byte activation (F) and receives its gradient (B); stage 1 the other ends
    assert [(s.wire_forward, s.wire_backward) for s in stages] == [(1e-6, 1e-6), (1e-6, 1e-6)]


def test_stages_on_one_rank_exchange_nothing_between_them() -> None:
    looped = executor_costs(with_wire(_cost(4), (0, 1, 0, 1), PRICE)).stages
    assert [s.wire_forward for s in looped] == pytest.approx([1e-6, 4e-6, 8e-6, 5e-6])
    v_shape = executor_costs(with_wire(_cost(4), (0, 1, 1, 0), PRICE)).stages  # stages 1 and 2 share rank 1
    assert [s.wire_forward for s in v_shape] == pytest.approx([1e-6, 1e-6, 5e-6, 5e-6])
    assert [s.wire_backward for s in v_shape] == [s.wire_forward for s in v_shape]


def test_only_forwards_and_backwards_pay_for_messages() -> None:
    runner = executor_costs(with_wire(_cost(2), (0, 1), PRICE))
    base = executor_costs(_cost(2))
    for op, paid in ((Op.F, 1e-6), (Op.B, 1e-6), (Op.R, 0.0), (Op.W, 0.0)):
        assert runner.host_seconds(op, 1, False) - base.host_seconds(op, 1, False) == pytest.approx(paid), op
    assert runner.host_seconds(Op.F, 1, True) - base.host_seconds(Op.F, 1, True) == pytest.approx(1e-6)  # no-grad F


def test_the_probe_times_each_size_that_crosses_between_ranks_once() -> None:
    assert message_sizes(_cost(4), (0, 1, 0, 1)) == (1000, 2000, 3000)
    assert message_sizes(_cost(4), (0, 1, 1, 0)) == (1000, 3000)  # 2000 bytes stay on rank 1
    assert message_sizes(_cost(2), (0, 0)) == ()


def test_a_price_between_probed_sizes_is_interpolated_and_beyond_them_extended() -> None:
    assert PRICE(1500) == pytest.approx(2e-6)
    assert PRICE(500) == 1e-6  # a message costs at least what the smallest probed one did
    assert PRICE(5000) == pytest.approx(9e-6)  # the last two sizes' slope
    assert PRICE(0) == 0.0
    assert MessageCpu((1000,), (2e-6,))(3000) == pytest.approx(6e-6)  # one size: in proportion
    assert MessageCpu((), ())(1000) == 0.0  # nothing crosses: nothing probed, nothing paid


@pytest.mark.parametrize("sizes,seconds", [((2000, 1000), (1e-6, 1e-6)), ((0,), (1e-6,)), ((1000,), (-1e-6,)),
                                            ((1000, 2000), (1e-6,))])
def test_a_malformed_price_table_is_refused(sizes: tuple[int, ...], seconds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        MessageCpu(sizes, seconds)
