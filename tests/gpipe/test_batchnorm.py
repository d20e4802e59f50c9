"""DeferredBatchNorm: running statistics equal BatchNorm's over the whole mini-batch, once per mini-batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpipe.autograd.phase import checkpointing, recomputing
from gpipe.batchnorm import DeferredBatchNorm

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _pair(momentum: float | None = 0.1, chunks: int = 1) -> tuple[nn.BatchNorm2d, DeferredBatchNorm]:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3, momentum=momentum)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    dbn = DeferredBatchNorm(3, momentum=momentum, chunks=chunks)
    dbn.load_state_dict(bn.state_dict())
    return bn, dbn


def _minibatches(steps: int, rows: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    # A mean far from zero and a spread per channel: a naive sum-of-squares would lose digits here.
    return [torch.randn(rows, 3, 4, 4, generator=gen) * torch.tensor([1.0, 2.0, 0.5]).view(1, 3, 1, 1) + 3.0
            for _ in range(steps)]


def _run(dbn: DeferredBatchNorm, batch: torch.Tensor, chunks: int) -> torch.Tensor:
    return torch.cat([dbn(x) for x in batch.chunk(chunks)])


def _assert_same_stats(bn: nn.BatchNorm2d, dbn: DeferredBatchNorm) -> None:
    assert dbn.running_mean is not None and dbn.running_var is not None
    torch.testing.assert_close(dbn.running_mean, bn.running_mean, **TOL)
    torch.testing.assert_close(dbn.running_var, bn.running_var, **TOL)
    assert dbn.num_batches_tracked is not None
    assert int(dbn.num_batches_tracked) == int(bn.num_batches_tracked)  # type: ignore[arg-type]


@pytest.mark.parametrize("chunks", [1, 2, 4])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_running_stats_equal_batchnorm_over_the_minibatch(chunks: int, momentum: float | None) -> None:
    bn, dbn = _pair(momentum, chunks)
    for batch in _minibatches(3, 8):
        bn(batch)
        _run(dbn, batch, chunks)
        _assert_same_stats(bn, dbn)
    assert dbn.pending == 0


@pytest.mark.parametrize(("rows", "chunks"), [(7, 3), (5, 2), (10, 4)])  # chunk sizes 3,3,1 / 3,2 / 3,3,3,1
def test_uneven_last_chunk_weighs_by_samples(rows: int, chunks: int) -> None:
    bn, dbn = _pair(0.1, chunks)
    for batch in _minibatches(2, rows):
        assert len(batch.chunk(chunks)) == chunks
        bn(batch)
        _run(dbn, batch, chunks)
    _assert_same_stats(bn, dbn)


def test_each_microbatch_is_normalised_by_its_own_statistics() -> None:
    bn, dbn = _pair(0.1, 2)
    batch = _minibatches(1, 8)[0]
    expected = torch.cat([bn(x) for x in batch.chunk(2)])
    torch.testing.assert_close(_run(dbn, batch, 2), expected)


def test_stats_commit_only_after_the_last_microbatch() -> None:
    _, dbn = _pair(0.1, 4)
    before = dbn.running_mean.clone()  # type: ignore[union-attr]
    for k, x in enumerate(_minibatches(1, 8)[0].chunk(4)):
        dbn(x)
        committed = k == 3
        assert dbn.pending == (0 if committed else k + 1)
        assert torch.equal(dbn.running_mean, before) != committed  # type: ignore[arg-type]
        assert int(dbn.num_batches_tracked) == int(committed)  # type: ignore[arg-type]


def test_recompute_does_not_count_twice() -> None:
    bn, dbn = _pair(0.1, 2)
    batch = _minibatches(1, 8)[0]
    bn(batch)
    outputs = []
    for x in batch.chunk(2):
        with checkpointing(), torch.no_grad():  # the checkpointed forward: counted
            first = dbn(x)
        with recomputing():  # the recompute before backward: not counted
            again = dbn(x.requires_grad_())
        torch.testing.assert_close(first, again, rtol=0, atol=0)
        outputs.append(again)
    _assert_same_stats(bn, dbn)
    torch.cat(outputs).sum().backward()  # the recomputed graph is a real one


def test_fewer_microbatches_than_chunks_commit_all() -> None:
    bn, dbn = _pair(0.1, 4)
    batch = _minibatches(1, 5)[0]
    assert len(batch.chunk(4)) == 3  # torch.chunk: 2, 2, 1
    bn(batch)
    model = nn.Sequential(dbn)
    for x in batch.chunk(4):
        model(x)
    assert dbn.pending == 3
    assert DeferredBatchNorm.commit_all(model) == 1
    assert DeferredBatchNorm.commit_all(model) == 0
    _assert_same_stats(bn, dbn)


def test_eval_uses_running_stats() -> None:
    bn, dbn = _pair(0.1, 2)
    for batch in _minibatches(2, 8):
        bn(batch)
        _run(dbn, batch, 2)
    bn.eval()
    dbn.eval()
    x = _minibatches(1, 4)[0]
    tracked = int(dbn.num_batches_tracked)  # type: ignore[arg-type]
    torch.testing.assert_close(dbn(x), bn(x), **TOL)
    assert dbn.pending == 0 and int(dbn.num_batches_tracked) == tracked  # type: ignore[arg-type]


def test_convert_shares_parameters_and_buffers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, momentum=None),
                          nn.Sequential(nn.BatchNorm1d(2, eps=1e-3)), nn.BatchNorm2d(4, track_running_stats=False))
    bn = model[1]
    assert isinstance(bn, nn.BatchNorm2d)
    bn(torch.randn(4, 4, 2, 2))  # non-trivial running stats
    model[2][0].eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    weight, running_mean = bn.weight, bn.running_mean

    converted = DeferredBatchNorm.convert_deferred_batch_norm(model, chunks=4)

    assert converted is model
    new = converted[1]
    assert isinstance(new, DeferredBatchNorm) and new.chunks == 4 and new.momentum is None
    assert new.weight is weight and new.running_mean is running_mean
    inner = converted[2][0]
    assert isinstance(inner, DeferredBatchNorm) and inner.eps == 1e-3 and not inner.training
    assert not isinstance(converted[3], DeferredBatchNorm)  # no running statistics to defer
    assert converted.state_dict().keys() == state.keys()
    for k, v in converted.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert DeferredBatchNorm.convert_deferred_batch_norm(new, chunks=4) is new


def test_convert_a_single_layer_and_1d_inputs() -> None:
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(5)
    dbn = DeferredBatchNorm.convert_deferred_batch_norm(nn.BatchNorm1d(5), chunks=2)
    assert isinstance(dbn, DeferredBatchNorm)
    batch = torch.randn(6, 5) * 2 + 1
    bn(batch)
    for x in batch.chunk(2):
        dbn(x)
    torch.testing.assert_close(dbn.running_var, bn.running_var, **TOL)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="chunks"):
        DeferredBatchNorm(3, chunks=0)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        DeferredBatchNorm(3)(torch.randn(3))
