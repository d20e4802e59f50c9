"""ZeRO-3 in DistributedGPipe, in one process (no ranks): what it refuses before joining a group, a stage's units,
the dry run's meta twins. Sharded runs train on ranks in :mod:`tests.distributed.test_replicas`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpipe.distributed import DistributedGPipe
from gpipe.distributed.sharded import meta_twin, stage_units
from tests.distributed.cases import chain


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"zero": 3}, r"^zero=3 shards each stage over its replicas: give data_parallel >= 2$"),
    ({"zero": 2, "data_parallel": 2}, r"^zero must be one of \(0, 3\) \(0: .*ZeroRedundancyOptimizer.*got 2$"),
    ({"zero": True, "data_parallel": 2}, r"^zero must be one of .*got True$"),
    ({"zero": 3, "data_parallel": 2, "reshard_after_forward": "yes"},
     r"^reshard_after_forward must be True or False, got 'yes'$"),
])
def test_bad_sharding_is_refused_in_one_line_before_any_group(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistributedGPipe(chain(4), [2, 2], chunks=4, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2", "zb-v", "dualpipe-v"])
def test_zero3_refuses_a_schedule_that_splits_the_backward(schedule: str) -> None:
    with pytest.raises(ValueError, match=rf"^zero=3 cannot run schedule '{schedule}': it splits the backward into B "
                                         r"and W, .* \(gpipe, 1f1b, interleaved-1f1b, looped-bfs\)$"):
        DistributedGPipe(chain(4), [1, 1, 1, 1], chunks=4, schedule=schedule, data_parallel=2, zero=3)


def test_a_stage_has_a_unit_per_layer_with_parameters_numbered_in_forward_order() -> None:
    # 4-byte floats: Linear(6, 6) is 36 + 6 parameters, Linear(6, 3) 18 + 3
    partition = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3))
    units = stage_units(2, partition)
    assert [(u.stage, u.unit, u.layer, u.nbytes) for u in units] == [(2, 0, partition[0], 168),
                                                                     (2, 1, partition[2], 84)]


def test_a_meta_twin_copies_no_data_and_leaves_the_layer_alone() -> None:
    layer = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
    before = [t.clone() for t in layer.state_dict().values()]
    twin = meta_twin(layer)
    assert all(t.is_meta for t in twin.state_dict().values())
    assert [p.requires_grad for p in twin.parameters()] == [p.requires_grad for p in layer.parameters()]
    assert twin(torch.empty(2, 6, device="meta")).shape == (2, 6)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.state_dict().values(), strict=True))
