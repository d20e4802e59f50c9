"""A mini-batch's micro-batch sizes: one rule (:func:`gpipe.microbatch.sizes`), which ``scatter`` cuts by."""

from __future__ import annotations

import pytest
import torch

from gpipe.microbatch import scatter, sizes


def test_sizes_follow_tensor_split() -> None:
    assert sizes(10, 4) == [3, 3, 2, 2]
    assert sizes(8, 8) == [1] * 8
    assert sizes(3, 4) == [1, 1, 1]  # a batch smaller than chunks runs fewer micro-batches
    with pytest.raises(ValueError, match="empty"):
        sizes(0, 4)
    with pytest.raises(ValueError, match="chunks"):
        sizes(8, 0)


@pytest.mark.parametrize(("batch", "chunks"), [(10, 4), (8, 8), (3, 4), (1, 1), (7, 3), (64, 5)])
def test_scatter_cuts_by_sizes(batch: int, chunks: int) -> None:
    x, y = torch.arange(batch), torch.randn(batch, 2)
    pieces = scatter((x, y), chunks)
    assert [len(p[0]) for p in pieces] == sizes(batch, chunks) == [len(p[1]) for p in pieces]
    assert [len(t) for t in torch.tensor_split(x, min(chunks, batch))] == sizes(batch, chunks)
    assert torch.equal(torch.cat([p[0] for p in pieces]), x)
