"""The profiler: exact bytes for known layers, the sample chained through blocks, and no side effects."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpipe.autograd.saved import SavedBytes
from gpipe.batchnorm import DeferredBatchNorm
from gpipe.profiling.profile import BlockProfile, RecordedSeconds, profile_blocks, profile_sizes, time_recorded

F32 = 4  # bytes per float32


def test_linear_relu_bytes_are_exact() -> None:
    batch, d_in, d_out = 8, 16, 32
    block = nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU())
    (p,) = profile_blocks([block], torch.randn(batch, d_in), warmup=0, repeats=1)
    assert p.input_bytes == batch * d_in * F32
    assert p.output_bytes == batch * d_out * F32
    # Linear keeps its input (for the weight gradient), ReLU its output; the weight is model state.
    assert p.saved_bytes == batch * d_in * F32 + batch * d_out * F32
    assert p.parameter_bytes == p.gradient_bytes == (d_in * d_out + d_out) * F32


def test_recorded_runs_are_timed_only_when_asked_and_count_what_the_recorder_counts() -> None:
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 2))]
    plain = profile_blocks(blocks, torch.randn(4, 8), warmup=0, repeats=1)
    assert all(p.forward_recorded_seconds is None and p.backward_recorded_seconds is None for p in plain)
    recorded = profile_blocks(blocks, torch.randn(4, 8), warmup=0, repeats=3, recorded=True)
    for p in recorded:
        assert p.forward_recorded_seconds is not None and p.forward_recorded_seconds > 0
        assert p.backward_recorded_seconds is not None and p.backward_recorded_seconds > 0
    # the recorder's counter, the profiler's bytes: one class
    counter = SavedBytes(blocks[0])
    with torch.enable_grad(), counter.hooks():
        blocks[0](torch.randn(4, 8))
    assert counter.nbytes == recorded[0].saved_bytes == plain[0].saved_bytes


class Counted(nn.Module):
    """Counts its forwards, with and without grad."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.calls = {"grad": 0, "nograd": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls["grad" if torch.is_grad_enabled() else "nograd"] += 1
        return self.linear(x)


def test_time_recorded_runs_only_what_a_recording_executor_runs() -> None:
    """No plain train pass: per pass one recorded forward and one no-grad forward of each block (and one
    forward that sizes the blocks), against profile_blocks' two grad-enabled forwards and one no-grad."""
    blocks = [Counted(), Counted()]
    times = time_recorded(blocks, torch.randn(4, 8), warmup=1, repeats=2)
    assert all(isinstance(t, RecordedSeconds) for t in times) and len(times) == 2
    assert all(t.forward > 0 and t.backward > 0 and t.forward_nograd > 0 for t in times)
    assert [b.calls for b in blocks] == [{"grad": 1 + 3, "nograd": 3}] * 2
    for b in blocks:
        b.calls = {"grad": 0, "nograd": 0}
    profile_blocks(blocks, torch.randn(4, 8), warmup=1, repeats=2, recorded=True)
    assert [b.calls for b in blocks] == [{"grad": 1 + 2 * 3, "nograd": 3}] * 2
    assert all(p.grad is None for b in blocks for p in b.parameters())  # left as found


def test_time_recorded_streaks_run_each_block_in_a_row() -> None:
    """Note [streaks]: a timed pass runs each block's forwards ``streak`` times in a row, then the backwards
    blocks in reverse, each block's in a row; untimed passes run once each."""
    order: list[tuple[int, str]] = []

    class Logged(nn.Module):
        def __init__(self, k: int) -> None:
            super().__init__()
            self.k, self.linear = k, nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            order.append((self.k, "F" if torch.is_grad_enabled() else "Fc"))
            y = self.linear(x)
            if y.requires_grad:
                y.register_hook(lambda g: order.append((self.k, "B")) or g)
            return y

    blocks = [Logged(0), Logged(1)]
    times = time_recorded(blocks, torch.randn(4, 8), warmup=1, repeats=1, streak=3)
    assert all(t.forward > 0 and t.backward > 0 and t.forward_nograd > 0 for t in times)
    timed = order[-18:]
    assert timed == ([(0, "Fc")] * 3 + [(1, "Fc")] * 3 + [(0, "F")] * 3 + [(1, "F")] * 3
                     + [(1, "B")] * 3 + [(0, "B")] * 3)
    assert order[-24:-18] == [(0, "Fc"), (1, "Fc"), (0, "F"), (1, "F"), (1, "B"), (0, "B")]  # the untimed pass
    assert all(p.grad is None for b in blocks for p in b.parameters())
    with pytest.raises(ValueError, match="streak"):
        time_recorded(blocks, torch.randn(4, 8), streak=0)


def test_time_recorded_refuses_bad_counts() -> None:
    with pytest.raises(ValueError, match="repeats"):
        time_recorded([nn.Linear(2, 2)], torch.randn(1, 2), repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        time_recorded([nn.Linear(2, 2)], torch.randn(1, 2), warmup=-1)
    with pytest.raises(ValueError, match="nothing to profile"):
        time_recorded([], torch.randn(1, 2))


def test_a_counted_graph_that_never_runs_backward_is_freed() -> None:
    # Note [no cycle through the hook]: ReLU saves its own output; handing it back as-is from the pack
    # hook made a cycle the collector cannot see, and every abandoned graph leaked
    import gc
    import weakref

    block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    counter = SavedBytes(block)
    with torch.enable_grad(), counter.hooks():
        out = block(torch.randn(2, 4))
    alive = weakref.ref(out)
    del out
    gc.collect()
    assert alive() is None and counter.nbytes > 0
    with torch.enable_grad(), counter.hooks():  # and a graph that does run backward still computes gradients
        block(torch.randn(2, 4)).sum().backward()
    assert block[0].weight.grad is not None


def test_a_tensor_saved_twice_counts_once() -> None:
    # ReLU keeps its output; the Linear after it keeps the same tensor as its input.
    block = nn.Sequential(nn.ReLU(), nn.Linear(4, 2, bias=False))
    (s,) = profile_sizes([block], torch.randn(3, 4, requires_grad=True))
    assert s.saved_bytes == 3 * 4 * F32


def test_buffers_count_as_state_and_frozen_params_have_no_gradient() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    block[0].bias.requires_grad_(False)
    (s,) = profile_sizes([block], torch.randn(5, 4))
    buffers = (4 + 4) * F32 + 8  # running mean and var (float32), num_batches_tracked (int64)
    assert s.parameter_bytes == (16 + 4 + 4 + 4) * F32 + buffers
    assert s.gradient_bytes == (16 + 4 + 4) * F32


def test_the_sample_flows_through_the_blocks() -> None:
    blocks = [nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)]
    profiles = profile_blocks(blocks, torch.randn(3, 4), warmup=0, repeats=2)
    assert [p.input_bytes for p in profiles] == [3 * 4 * F32, 3 * 8 * F32, 3 * 8 * F32]
    assert [p.output_bytes for p in profiles] == [3 * 8 * F32, 3 * 8 * F32, 3 * 2 * F32]
    assert all(isinstance(p, BlockProfile) for p in profiles)
    for p in profiles:
        assert p.forward_seconds > 0 and p.forward_nograd_seconds > 0 and p.backward_seconds > 0
        assert p.recompute_seconds == p.forward_seconds
        assert p.train_seconds == p.forward_seconds + p.backward_seconds


def test_nothing_to_differentiate_has_no_backward() -> None:
    # An integer input and no parameters: the block's output does not require grad.
    (p,) = profile_blocks([nn.Flatten()], torch.arange(6).view(2, 3), warmup=0, repeats=1)
    assert p.backward_seconds == 0.0 and p.saved_bytes == 0


class Split(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, :2] * 2, x[:, 2:] * 3


class Join(nn.Module):
    def forward(self, xs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, dim=1)


def test_tuple_outputs_and_inputs() -> None:
    profiles = profile_blocks([nn.Linear(5, 5), Split(), Join()], torch.randn(2, 5), warmup=0, repeats=1)
    assert profiles[1].output_bytes == 2 * 5 * F32
    assert profiles[2].input_bytes == 2 * 5 * F32 and profiles[2].output_bytes == 2 * 5 * F32
    (s,) = profile_sizes([Join()], (torch.randn(2, 1), torch.randn(2, 3)))
    assert s.input_bytes == 2 * 4 * F32


def test_in_place_first_layer() -> None:
    x = torch.randn(4, 4, requires_grad=True)
    before = x.detach().clone()
    (p,) = profile_blocks([nn.ReLU(inplace=True)], x, warmup=1, repeats=2)
    assert p.saved_bytes == 4 * 4 * F32  # ReLU keeps its (in-place) output
    assert torch.equal(x.detach(), before) and x.grad is None


def test_the_blocks_are_left_as_found() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5),
                          DeferredBatchNorm(4, chunks=3), nn.Linear(4, 2))
    model[4].eval()  # a submodule in eval mode stays in eval mode
    model(torch.randn(6, 4)).sum().backward()  # existing gradients and one pending micro-batch
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    x = torch.randn(6, 4)
    rng = torch.get_rng_state()
    dbn = model[3]
    assert isinstance(dbn, DeferredBatchNorm) and dbn.pending == 1

    profile_blocks(list(model), x, warmup=1, repeats=3)
    profile_blocks([model], x, warmup=0, repeats=1)

    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    for k, p in model.named_parameters():
        assert p.grad is not None and torch.equal(p.grad, grads[k]), k
    assert [m.training for m in model] == [True, True, True, True, False]
    assert dbn.pending == 1
    assert torch.equal(torch.get_rng_state(), rng)


def test_errors() -> None:
    with pytest.raises(ValueError, match="no blocks"):
        profile_blocks([], torch.randn(1))
    with pytest.raises(ValueError, match="repeats"):
        profile_blocks([nn.ReLU()], torch.randn(1), repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        profile_blocks([nn.ReLU()], torch.randn(1), warmup=-1)
    with pytest.raises(ValueError, match="2 devices for 1 blocks"):
        profile_sizes([nn.ReLU()], torch.randn(1), device=["cpu", "cpu"])
    with pytest.raises(TypeError, match="tensor or a tuple of tensors"):
        profile_sizes([nn.ReLU()], [torch.randn(1)])  # type: ignore[arg-type]

    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"x": x}

    with pytest.raises(TypeError, match="the output of Bad"):
        profile_sizes([Bad()], torch.randn(1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copy_leaves_the_cpu_block_alone() -> None:
    block = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    (p,) = profile_blocks([block], torch.randn(32, 64), device="cuda", warmup=1, repeats=3)
    assert block[0].weight.device.type == "cpu"
    assert p.forward_seconds > 0 and p.backward_seconds > 0
    assert p.saved_bytes == 2 * 32 * 64 * F32


def _split_blocks() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(384, 384), nn.Tanh(), nn.Linear(384, 384)), nn.ReLU(),
            nn.Sequential(nn.Linear(384, 384), nn.Tanh(), nn.Linear(384, 384))]


def test_a_split_backward_is_timed_in_its_two_parts() -> None:
    """Note [split runs]: B the inputs' gradient, W the parameters'; nothing to time where there is nothing to do."""
    sample = torch.randn(128, 384)  # milliseconds a backward: a busy machine's time slice stays a fraction of it
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as a pinned worker runs: a thread pool on busy cores times its waits
    try:
        whole = profile_blocks(_split_blocks(), sample, warmup=1, repeats=7)
        split = profile_blocks(_split_blocks(), sample, warmup=1, repeats=7, split=True, recorded=True)
    finally:
        torch.set_num_threads(threads)
    assert all(p.weight_seconds == 0.0 for p in whole)
    first, relu, last = split
    assert first.backward_seconds == 0.0 and first.weight_seconds > 0  # its input (the sample) needs no gradient
    assert relu.backward_seconds > 0 and relu.weight_seconds == 0.0  # no parameters
    assert last.backward_seconds > 0 and last.weight_seconds > 0
    assert first.weight_recorded_seconds is not None and first.weight_recorded_seconds > 0
    for p, q in zip(split, whole, strict=True):  # structure only: a loaded machine stretches one run, not another
        assert q.backward_seconds > 0 and p.backward_seconds + p.weight_seconds > 0
        assert p.train_seconds == p.forward_seconds + p.backward_seconds + p.weight_seconds


def test_time_recorded_splits_the_backward_when_asked() -> None:
    sample = torch.randn(128, 384)
    plain = time_recorded(_split_blocks(), sample, repeats=2)
    assert all(r.weight == 0.0 for r in plain)
    first, relu, last = time_recorded(_split_blocks(), sample, repeats=2, split=True)
    assert first.backward == 0.0 and first.weight > 0 and relu.weight == 0.0 and last.weight > 0 and last.backward > 0
