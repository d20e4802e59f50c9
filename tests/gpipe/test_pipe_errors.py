"""Bad input gets a clear error; an exception in a partition reaches the caller and leaves no thread behind."""

from __future__ import annotations

import threading
import traceback

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.distributed import DistributedGPipe
from gpipe.schedule import CHECKPOINT_MODES
from gpipe.skip import skippable, stash
from tests.gpipe.models import mlp


class Boom(Exception):
    pass


class Explode(nn.Module):
    """Raises on micro-batch ``at`` (its rows hold the micro-batch index), in forward or in backward."""

    def __init__(self, at: int = 0, in_backward: bool = False) -> None:
        super().__init__()
        self.at, self.in_backward = at, in_backward

    def forward(self, x: Tensor) -> Tensor:
        if int(x[0, 0].round().item()) == self.at:
            if not self.in_backward:
                explode_here()
            x.register_hook(lambda g: explode_here())
        return x * 1.0


def explode_here() -> None:
    raise Boom("raised inside a partition")


class Count(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: Tensor) -> Tensor:
        self.seen.append(int(x[0, 0].round().item()))
        return x


def _marked(m: int) -> Tensor:
    return torch.arange(m, dtype=torch.float32).repeat_interleave(2).unsqueeze(1).repeat(1, 3)


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gpipe-worker")]


@pytest.mark.parametrize("where", [0, 1, 2], ids=["first", "middle", "last"])
def test_exception_in_forward_reaches_caller(where: int) -> None:
    counts = [Count() for _ in range(3)]
    layers: list[nn.Module] = []
    for j in range(3):
        layers += [Explode(at=0) if j == where else nn.Identity(), counts[j]]
    pipe = GPipe(nn.Sequential(*layers), [2, 2, 2], chunks=4)
    with pytest.raises(Boom, match="raised inside a partition") as info:
        pipe(_marked(4))
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "explode_here" in frames and "forward" in frames  # the original traceback, from the worker
    assert counts[where].seen == []  # the failing partition computed nothing after the failure
    for later in counts[where + 1:]:
        assert later.seen == []  # nor did any later partition
    assert _workers() == []


@pytest.mark.parametrize("where", [0, 1, 2], ids=["first", "middle", "last"])
def test_exception_in_backward_reaches_caller(where: int) -> None:
    layers: list[nn.Module] = []
    for j in range(3):
        layers += [nn.Linear(3, 3), Explode(at=1, in_backward=True) if j == where else nn.Identity()]
    pipe = GPipe(nn.Sequential(*layers), [2, 2, 2], chunks=4, checkpoint="never")
    with torch.no_grad():
        for layer in pipe:
            if isinstance(layer, nn.Linear):
                layer.weight.copy_(torch.eye(3))
                layer.bias.zero_()
    out = pipe(_marked(4))
    with pytest.raises(Boom) as info:
        out.sum().backward()
    assert "explode_here" in [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert _workers() == []


@pytest.mark.timeout(120)
def test_fifty_failures_without_a_hang() -> None:
    pipe = GPipe(nn.Sequential(nn.Identity(), Explode(at=2), nn.Linear(3, 3), nn.Linear(3, 3)), [1, 2, 1],
                 chunks=4)
    for _ in range(50):
        with pytest.raises(Boom):
            pipe(_marked(4))
    assert _workers() == []
    # and the pipeline still works afterwards
    ok = GPipe(mlp(), [2, 3], chunks=4)
    ok(torch.randn(8, 6)).sum().backward()


class NotSequential(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class ReturnsDict(nn.Module):
    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"x": x}


@skippable(stash=["lost"])
class StashOnly(nn.Module):
    def forward(self, x: Tensor):  # type: ignore[no-untyped-def]
        yield stash("lost", x)
        return x


def _two() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU())


@pytest.mark.parametrize(("build", "error", "fix"), [
    (lambda: GPipe(NotSequential(), [1]), TypeError, "nn.Sequential"),  # type: ignore[arg-type]
    (lambda: GPipe(nn.Sequential(*[nn.ReLU()] * 2), [1, 1]), ValueError, "deepcopy"),
    (lambda: GPipe(_two()), ValueError, "balance is required"),
    (lambda: GPipe(_two(), []), ValueError, "at least one partition"),
    (lambda: GPipe(_two(), [2, 0]), ValueError, "positive number of layers"),
    (lambda: GPipe(_two(), [-1, 3]), ValueError, "positive number of layers"),
    (lambda: GPipe(_two(), [1, 2]), ValueError, "sums to 3 but the module has 2 layers"),
    (lambda: GPipe(_two(), [2], chunks=0), ValueError, "positive integer"),
    (lambda: GPipe(_two(), [2], chunks=-2), ValueError, "positive integer"),
    # a size whose schedule the machine cannot hold: refused at once, before a task is built (gpipe.schedule.size)
    (lambda: GPipe(_two(), [1, 1], chunks=10**12), ValueError, r"chunks=1000000000000 on 2 stages: .*lower chunks=$"),
    (lambda: DistributedGPipe(_two(), [1, 1], chunks=10**12), ValueError, "chunks=1000000000000 on 2 stages"),
    (lambda: GPipe(_two(), [2], checkpoint="sometimes"), ValueError, "always, except_last, never"),
    (lambda: GPipe(_two(), [1, 1], devices=["cpu"]), ValueError, "too few devices"),
    (lambda: GPipe(_two(), [1, 1], devices=["cpu", "cuda:7"]), ValueError, "does not exist"),
    (lambda: GPipe(_two(), [1, 1], devices=["cpu", "tpu"]), ValueError, "not a device"),
    (lambda: GPipe(_two(), [1, 1], devices="cpu"), TypeError, "one device per partition"),
    (lambda: GPipe(nn.Sequential(StashOnly(), nn.ReLU()), [1, 1]), RuntimeError, "no later layer pops it"),
])
def test_invalid_arguments(build, error: type[Exception], fix: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=fix):
        build()


def test_empty_batch_says_so() -> None:
    with pytest.raises(ValueError, match="the batch is empty"):
        GPipe(_two(), [1, 1], chunks=2)(torch.randn(0, 3))


@pytest.mark.parametrize("bad", [torch.randn(4, 3).to_sparse(), torch.randn(4, 3, device="meta")],
                         ids=["sparse", "meta"])
def test_sparse_and_meta_inputs_are_refused_before_the_workers(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="dense tensors|meta device"):
        GPipe(_two(), [1, 1], chunks=2)(bad)


def test_too_few_devices_is_an_index_error_as_in_torchgpipe_and_a_value_error() -> None:
    for error in (IndexError, ValueError):
        with pytest.raises(error, match="too few devices"):
            GPipe(_two(), [1, 1], devices=["cpu"])


def test_numpy_integers_for_balance_and_chunks() -> None:
    import numpy as np

    pipe = GPipe(_two(), np.array([1, 1]), chunks=np.int64(2))
    assert pipe.balance == [1, 1] and pipe.chunks == 2 and type(pipe.chunks) is int
    assert pipe(torch.randn(4, 3)).shape == (4, 3)


@pytest.mark.parametrize("bad", [[1.0, 2.0], (torch.randn(2, 3), "text"), 3])
def test_non_tensor_input(bad: object) -> None:
    with pytest.raises(TypeError, match="tensor or a tuple of tensors"):
        GPipe(_two(), [1, 1], chunks=1)(bad)


def test_non_tensor_output() -> None:
    pipe = GPipe(nn.Sequential(nn.Linear(3, 3), ReturnsDict()), [1, 1], chunks=2)
    with pytest.raises(TypeError, match="output of partition 1 must be a tensor or a tuple of tensors"):
        pipe(torch.randn(4, 3))
    assert _workers() == []


class WritesLater(nn.Module):
    """Writes its input in place only once switched on: after the first step learnt that it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu_() if self.on else x.relu()


def test_a_partition_that_starts_writing_its_input_later_is_refused() -> None:
    later = WritesLater()
    pipe = GPipe(nn.Sequential(nn.Linear(3, 3), later, nn.Linear(3, 3)), [1, 2], chunks=2, checkpoint="always")
    pipe(torch.randn(4, 3)).sum().backward()
    later.on = True
    with pytest.raises(RuntimeError, match="modified its input in place.*inplace=False"):
        pipe(torch.randn(4, 3))


def test_in_place_layer_is_fine_without_checkpointing() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 3))
    GPipe(model, [1, 2], chunks=2, checkpoint="never")(torch.randn(4, 3)).sum().backward()


def test_checkpoint_modes_listed() -> None:
    assert CHECKPOINT_MODES == ("always", "except_last", "never")
