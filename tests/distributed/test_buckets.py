"""The gradient buckets of a stage and a replica's share of the loss, in one process (no ranks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpipe.distributed.reduction import buckets
from gpipe.distributed.replicas import replica_share
from gpipe.loss import loss_plan


def test_buckets_fill_in_reverse_up_to_the_cap_and_number_units_in_forward_order() -> None:
    # 4-byte floats: Linear(4, 4) is a 64-byte weight and a 16-byte bias; Linear(4, 16) a 256-byte weight
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 16))
    params = list(model.parameters())
    at = {id(p): k for k, p in enumerate(params)}
    got = buckets(3, params, cap_bytes=100)
    # reduced first: the last bias (64 B); its weight (256 B) alone, over the cap; 16 + 64 + 16 B; the first weight
    assert [[at[id(p)] for p in b.params] for b in got] == [[5], [4], [3, 2, 1], [0]]
    assert [b.unit for b in got] == [3, 2, 1, 0] and {b.stage for b in got} == {3}
    assert [b.nbytes for b in got] == [64, 256, 96, 64]
    assert [[at[id(p)] for p in b.params] for b in buckets(0, params, cap_bytes=2**20)] == [[5, 4, 3, 2, 1, 0]]


def test_a_replica_shares_a_mean_loss_and_refuses_a_mean_over_counted_classes() -> None:
    target = [torch.zeros(8)]
    mean = loss_plan(nn.functional.mse_loss, "mean", target, [4, 4])
    assert replica_share(mean, "mean", target, 2).scales == (0.25, 0.25)
    summed = loss_plan(nn.functional.mse_loss, "sum", target, [4, 4])
    assert replica_share(summed, "sum", target, 2).scales == (1.0, 1.0)
    classes = [torch.zeros(8, dtype=torch.long)]
    weighted = loss_plan(nn.CrossEntropyLoss(), "class-weighted", classes, [4, 4])
    with pytest.raises(ValueError, match="reduction='sum'"):
        replica_share(weighted, "class-weighted", classes, 2)
