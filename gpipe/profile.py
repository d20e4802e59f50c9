"""Measure blocks of layers: forward, backward and no-grad forward seconds, and the bytes each keeps and sends.

One profiler serves both :func:`gpipe.balance.balance_by_time` (blocks are single layers) and
``sim.calibrate`` (blocks are whole partitions). A sample flows through the blocks in order, block ``k``
receiving block ``k - 1``'s output, and each block is measured alone on a detached copy of its input::

    sample -> [block 0] -> y0 -> [block 1] -> y1 -> ...
                 |                  |
        measured on x0        measured on y0.detach() (requires grad iff y0 did)

Per block, :class:`BlockProfile` holds:

- ``forward_seconds``: forward with grad enabled (it records the graph): an ``F`` that is not
  checkpointed, and every ``R`` (a recompute is exactly this forward);
- ``forward_nograd_seconds``: forward under ``no_grad`` (with :func:`gpipe.phase.checkpointing` set):
  the ``F`` of a checkpointed micro-batch, cheaper because nothing is saved;
- ``backward_seconds``: ``torch.autograd.backward`` of this block's outputs alone, with a gradient of
  ones, into its parameters and (when it requires grad) its input;
- with ``recorded=True``, ``forward_recorded_seconds`` and ``backward_recorded_seconds``: the same
  forward and backward while a recording executor's saved-tensor hooks count the bytes (Note [recorded
  runs]);
- ``output_bytes`` (sent to the next block), ``input_bytes`` (what checkpointing keeps),
  ``saved_bytes`` (kept for backward, from ``torch.autograd.graph.saved_tensors_hooks``),
  ``parameter_bytes`` (parameters and buffers) and ``gradient_bytes`` (trainable parameters).

Times are medians over ``repeats`` passes after ``warmup`` untimed ones; a pass runs every block once,
so a burst of noise from a busy machine spoils one sample of each block rather than all samples of one.
The clock is ``time.perf_counter`` on CPU and CUDA events on CUDA (after a device synchronise, so
earlier work is not billed to the block).

Note [issue seconds]: on CUDA the host only launches kernels, and returns before they end; every run is
also timed on the host, from the call to its return (``..._issue_seconds``). That is the host's share of
a task, which an executor's worker cannot overlap with its next task, while the kernels' seconds can
overlap the host's next work (``sim.engine``, Note [asynchronous devices]). Where the host sets the pace
(many small kernels) the two are about equal; where the kernels do, the issue seconds are far smaller. On
CPU the host runs the work itself, and the issue seconds equal the seconds.

Note [saved bytes per block]: each block's saved bytes are counted by :class:`gpipe.saved.SavedBytes`
(Note [saved bytes] there), each block on its own, as if it ran on its own device: summing single layers
may count a boundary tensor twice, once in each layer that keeps it.

Note [recorded runs]: a recording :class:`gpipe.GPipe` counts the bytes each grad-enabled forward
saves with a Python pack hook (:class:`gpipe.saved.SavedBytes`, the very hook that measures ``saved_bytes``), and
its backward takes every saved tensor back through an unpack hook. For a block of many small layers
that is a large share of its time, and how large depends on what the layers save (a Linear's input
and weight, a ReLU's output): it is measured on the block itself, not estimated per tensor. The hooks
are installed outside the timed region, so what they add is their per-tensor calls.

Note [run order]: a pass runs the blocks as a training step does: every grad-enabled forward in block
order (graphs kept), then every backward in reverse order; then every no-grad forward; then, with
``recorded``, the recorded forwards and backwards in the same order. Between two runs of a block the
other blocks ran, as in a pipeline step, where a partition's next task follows other work. Timed
back to back instead (forward, its backward at once, the same block again), a block of many small
layers ran 10-20% faster than it does in a step (what it just used is still in the caches and on
the allocator's free lists).

Note [streaks]: a worker of a pipeline of many micro-batches does run its stage back to back: the
forward of every micro-batch in a row, then (checkpointed) a recompute and a backward per micro-batch,
on one core that stays busy. A pass that alternates blocks (and moves the profiling thread between
their cores) times each run colder than that. ``streak=k`` runs each kind of run ``k`` times in a row
per block (the backwards in the reverse order of the forwards, as GPipe's are), inside the order
above; untimed passes run once each. On fidelity.py's ``conv`` model in two stages, micro-batches of
4 samples, 22 recorded steps of 16 micro-batches: timed one at a time, stage 1's checkpointed forward
took 25% longer than its median span in the steps and the recorded forwards 9-15% longer, so the
prediction, which adds the stages' slowdowns of each other, came out 5-10% over; in streaks of 8
every run took 3-9% less than its span in the steps, the room those slowdowns and the executor's
host extras fill.

Note [no side effects]: blocks are profiled in place, in training mode, and left as found: gradients,
buffers (BatchNorm's running statistics), plain numeric attributes (counters such as
``DeferredBatchNorm``'s pending micro-batches), every module's training flag, and the CPU and CUDA
random state are saved first and restored after. Every run gets a fresh clone of its input (made
outside the timed region), so in-place layers neither fail on a leaf nor change the next run's input.
A block that is not on the requested ``device`` is profiled as a deep copy moved there, held until
the profile is done.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gpipe.affinity import Cores, check_affinity, pinned
from gpipe.checks import check_positive
from gpipe.phase import checkpointing
from gpipe.saved import SavedBytes
from gpipe.skip.skippable import SkipKey, use_tracker

__all__ = ["BlockProfile", "BlockSizes", "Device", "RecordedSeconds", "TensorOrTensors", "preserved", "profile_blocks",
           "profile_sizes", "time_recorded"]

Device = torch.device | str | int
TensorOrTensors = Tensor | tuple[Tensor, ...]
Clock = Callable[[Callable[[], Any]], tuple[float, float, Any]]  # runs a thunk: (seconds, issue seconds, result)


@dataclass(frozen=True)
class BlockSizes:
    """Bytes of one block for one input (see the module docstring for what each counts)."""

    output_bytes: int
    saved_bytes: int
    input_bytes: int
    parameter_bytes: int
    gradient_bytes: int


@dataclass(frozen=True)
class BlockProfile(BlockSizes):
    """Bytes and median seconds of one block for one input."""

    forward_seconds: float
    forward_nograd_seconds: float
    backward_seconds: float
    forward_recorded_seconds: float | None = None
    backward_recorded_seconds: float | None = None
    forward_issue_seconds: float | None = None
    forward_nograd_issue_seconds: float | None = None
    backward_issue_seconds: float | None = None
    forward_recorded_issue_seconds: float | None = None
    backward_recorded_issue_seconds: float | None = None

    @property
    def recompute_seconds(self) -> float:
        """A recompute is a grad-enabled forward."""
        return self.forward_seconds

    @property
    def train_seconds(self) -> float:
        """Forward plus backward without checkpointing: what ``balance_by_time`` balances."""
        return self.forward_seconds + self.backward_seconds


def profile_blocks(blocks: Sequence[nn.Module], sample: TensorOrTensors, *,
                   device: Device | Sequence[Device] | None = None, warmup: int = 2,
                   repeats: int = 5, recorded: bool = False,
                   affinity: Sequence[Cores | None] | None = None) -> list[BlockProfile]:
    """Time and size each block, the sample flowing through the blocks in sequence.

    Args:
        blocks: the blocks, in order; each takes the previous one's output (a tensor, or a tuple of
            tensors passed as one argument, as ``nn.Sequential`` does).
        sample: the first block's input (a micro-batch); its ``requires_grad`` is respected.
        device: where to run: one device for all blocks or one per block; a block elsewhere is
            profiled as a copy moved there. ``None``: each block where its parameters are (a block
            without any where its input is).
        warmup: untimed passes over the blocks before timing.
        repeats: timed passes; each time is the median over them.
        recorded: also time the forward and backward with a recording executor's hooks
            (Note [recorded runs]); otherwise those two times are ``None``.
        affinity: one set of CPU cores per block (or ``None``): each block runs on the calling thread
            moved to its cores, as a pinned worker runs it (:mod:`gpipe.affinity`); restored after.

    Returns:
        One :class:`BlockProfile` per block.

    Raises:
        ValueError: no blocks, ``warmup < 0``, ``repeats < 1``, a device or affinity list of the
            wrong length, or cores this process cannot use.
        TypeError: an input or output that is not a tensor or a tuple of tensors.
    """
    cores = check_affinity(affinity, len(blocks)) or [None] * len(blocks)
    _check_counts(warmup, repeats)
    with _session(blocks, sample, device) as steps:
        runs = _timed_runs(steps, cores, warmup, repeats, plain=True, recorded=recorded)
    return [BlockProfile(**vars(step.sizes), forward_seconds=t["forward"], forward_nograd_seconds=t["nograd"],
                         backward_seconds=t["backward"], forward_recorded_seconds=t.get("forward_recorded"),
                         backward_recorded_seconds=t.get("backward_recorded"),
                         forward_issue_seconds=t["forward_issue"], forward_nograd_issue_seconds=t["nograd_issue"],
                         backward_issue_seconds=t["backward_issue"],
                         forward_recorded_issue_seconds=t.get("forward_recorded_issue"),
                         backward_recorded_issue_seconds=t.get("backward_recorded_issue"))
            for step, t in zip(steps, runs, strict=True)]


@dataclass(frozen=True)
class RecordedSeconds:
    """Median seconds of the runs a recording executor's tasks are predicted from, for one block.

    Attributes:
        forward: grad-enabled forward under the recorder's hooks (Note [recorded runs]): an ``F`` that
            is not checkpointed, and every ``R``.
        backward: its backward, every saved tensor back through the unpack hook: a ``B``.
        forward_nograd: forward under ``no_grad`` with checkpointing set: a checkpointed ``F``.
    """

    forward: float
    backward: float
    forward_nograd: float


def time_recorded(blocks: Sequence[nn.Module], sample: TensorOrTensors, *,
                  device: Device | Sequence[Device] | None = None, warmup: int = 1, repeats: int = 1,
                  affinity: Sequence[Cores | None] | None = None, streak: int = 1) -> list[RecordedSeconds]:
    """Only the seconds a recording executor's tasks take: :func:`profile_blocks` with ``recorded=True``
    less its plain (hook-free) forward and backward, which such an executor never runs; about half the
    cost, for sampling a machine between training steps (Note [interleaved calibration] in
    ``sim.experiment``). The runs that remain run in the same order (Note [run order]): every no-grad
    forward, then the recorded forwards and backwards. Bytes are not returned: they do not change from
    pass to pass (:func:`profile_sizes`).

    Args:
        blocks: as for :func:`profile_blocks`.
        sample: as for :func:`profile_blocks`.
        device: as for :func:`profile_blocks`.
        warmup: untimed passes first.
        repeats: timed passes; each time is the median over them.
        affinity: as for :func:`profile_blocks`.
        streak: runs of each kind a block makes in a row within a pass (Note [streaks]); each time
            is the median over every timed run.

    Returns:
        One :class:`RecordedSeconds` per block.

    Raises:
        ValueError: as :func:`profile_blocks`.
        TypeError: as :func:`profile_blocks`.
    """
    cores = check_affinity(affinity, len(blocks)) or [None] * len(blocks)
    _check_counts(warmup, repeats)
    check_positive("streak", streak)
    with _session(blocks, sample, device) as steps:
        runs = _timed_runs(steps, cores, warmup, repeats, plain=False, recorded=True, streak=streak)
    return [RecordedSeconds(forward=t["forward_recorded"], backward=t["backward_recorded"], forward_nograd=t["nograd"])
            for t in runs]


def _check_counts(warmup: int, repeats: int) -> None:
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")


def _timed_runs(steps: Sequence[_Step], cores: Sequence[Cores | None], warmup: int, repeats: int, *,
                plain: bool, recorded: bool, streak: int = 1) -> list[dict[str, float]]:
    """Per block, the median seconds over ``repeats`` timed passes after ``warmup`` untimed ones: with
    ``plain`` the ``forward`` and the ``backward``, then the no-grad forward (``nograd``), then with
    ``recorded`` the ``forward_recorded`` and ``backward_recorded`` (Note [run order]: one kind of run
    over every block, then the next; ``streak`` runs of it in a row, Note [streaks]); each with its
    ``..._issue`` seconds (Note [issue seconds])."""
    clocks = [_clock(step.device) for step in steps]
    runs: list[list[list[dict[str, float]]]] = [[] for _ in steps]  # per block, per pass, per run of the streak
    for k in range(warmup + repeats):  # passes over all blocks, so a burst of noise hits one pass
        row = streak if k >= warmup else 1  # an untimed pass only warms up (Note [streaks])
        times: list[list[dict[str, float]]] = [[{} for _ in range(row)] for _ in steps]
        if plain:
            for t, block in zip(times, _train_pass(steps, clocks, cores, streak=row), strict=True):
                for s, (f, b, fi, bi) in zip(t, block, strict=True):
                    s.update(forward=f, backward=b, forward_issue=fi, backward_issue=bi)
        for t, step, clock, where in zip(times, steps, clocks, cores, strict=True):
            for s, (n, ni) in zip(t, _nograd_runs(step, clock, where, row), strict=True):
                s["nograd"], s["nograd_issue"] = n, ni
        if recorded:
            for t, block in zip(times, _train_pass(steps, clocks, cores, recorded=True, streak=row), strict=True):
                for s, (f, b, fi, bi) in zip(t, block, strict=True):
                    s.update(forward_recorded=f, backward_recorded=b, forward_recorded_issue=fi,
                             backward_recorded_issue=bi)
        for block_runs, t in zip(runs, times, strict=True):
            block_runs.append(t)
    return [{key: statistics.median(s[key] for t in block_runs[warmup:] for s in t) for key in block_runs[0][0]}
            for block_runs in runs]


def profile_sizes(blocks: Sequence[nn.Module], sample: TensorOrTensors, *,
                  device: Device | Sequence[Device] | None = None) -> list[BlockSizes]:
    """Only the bytes of :func:`profile_blocks`: one forward per block, nothing timed.

    Args:
        blocks: as for :func:`profile_blocks`.
        sample: as for :func:`profile_blocks`.
        device: as for :func:`profile_blocks`.

    Returns:
        One :class:`BlockSizes` per block.

    Raises:
        ValueError: no blocks, or a device list of the wrong length.
        TypeError: an input or output that is not a tensor or a tuple of tensors.
    """
    with _session(blocks, sample, device) as steps:
        return [step.sizes for step in steps]


# --- the walk through the blocks ------------------------------------------------------------------

@dataclass(frozen=True)
class _Step:
    """One block ready to run: placed on its device, with its leaf inputs and its measured sizes."""

    block: nn.Module
    device: torch.device
    inputs: tuple[Tensor, ...]
    atomic: bool  # the input is one tensor, not a tuple
    sizes: BlockSizes


@contextmanager
def _session(blocks: Sequence[nn.Module], sample: TensorOrTensors,
             device: Device | Sequence[Device] | None) -> Iterator[list[_Step]]:
    """Place, size and chain every block; on exit leave every block as found (:func:`preserved`)."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("nothing to profile: no blocks")
    devices = _devices(len(blocks), device)
    atomic, inputs = _as_tuple(sample, "the sample")
    inputs = tuple(t.detach().requires_grad_(t.requires_grad and t.is_floating_point()) for t in inputs)
    cuda = sorted({d for d in devices if d is not None and d.type == "cuda"} |
                  {t.device for b in blocks for t in _state(b) if t.device.type == "cuda"}, key=str)
    with ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=cuda, enabled=True))
        stack.enter_context(use_tracker(_ProfileTracker()))
        steps = []
        for block, wanted in zip(blocks, devices, strict=True):
            if wanted is not None and not {t.device for t in _state(block)} <= {wanted}:
                block = copy.deepcopy(block).to(wanted)
            dev = wanted or _device_of(block) or (inputs[0].device if inputs else torch.device("cpu"))
            inputs = tuple(t.detach().to(dev).requires_grad_(t.requires_grad) for t in inputs)
            stack.enter_context(preserved(block))
            sizes, (out_atomic, outputs) = _measure_sizes(block, inputs, atomic)
            steps.append(_Step(block, dev, inputs, atomic, sizes))
            atomic = out_atomic
            inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in outputs)
        yield steps


class _ProfileTracker:
    """Skip connections while blocks are profiled one at a time, each run many times.

    A pop returns the latest stash of its name as a fresh leaf, every time it runs: the popping block is
    timed with its skip input (and the gradient it sends back) but apart from the stashing block's graph.
    """

    def __init__(self) -> None:
        self.table: dict[SkipKey, Tensor] = {}

    def save(self, key: SkipKey, tensor: Tensor) -> None:
        self.table[key] = tensor.detach()

    def load(self, key: SkipKey) -> Tensor:
        if key not in self.table:
            raise RuntimeError(f"pop({key[1]!r}) before any stash({key[1]!r}): the layer that stashes it must come "
                               "first in the module")
        value = self.table[key]
        return value.detach().requires_grad_(value.is_floating_point())


def _devices(count: int, device: Device | Sequence[Device] | None) -> list[torch.device | None]:
    if device is None:
        return [None] * count
    if isinstance(device, (torch.device, str, int)):
        return [_normalize(device)] * count
    devices: list[torch.device | None] = [_normalize(d) for d in device]
    if len(devices) != count:
        raise ValueError(f"{len(devices)} devices for {count} blocks; give one per block, or one")
    return devices


def _normalize(device: Device) -> torch.device:
    """``"cuda"`` means the current CUDA device, so that it compares equal to a tensor's ``cuda:0``."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _device_of(block: nn.Module) -> torch.device | None:
    return next((t.device for t in _state(block)), None)


def _state(block: nn.Module) -> Iterator[Tensor]:
    yield from block.parameters()
    yield from block.buffers()


def _as_tuple(value: Any, what: str) -> tuple[bool, tuple[Tensor, ...]]:
    if isinstance(value, Tensor):
        return True, (value,)
    if isinstance(value, tuple) and all(isinstance(t, Tensor) for t in value):
        return False, value
    raise TypeError(f"{what} must be a tensor or a tuple of tensors, got {type(value).__name__}")


def _fresh(leaves: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Clones to feed a block: an in-place first layer then neither fails on a leaf nor edits ``leaves``."""
    return tuple(t.clone() for t in leaves)


def _call(block: nn.Module, inputs: tuple[Tensor, ...], atomic: bool) -> tuple[bool, tuple[Tensor, ...]]:
    return _as_tuple(block(inputs[0] if atomic else inputs), f"the output of {type(block).__name__}")


def _nbytes(tensors: Sequence[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# --- sizes ----------------------------------------------------------------------------------------

def _measure_sizes(block: nn.Module, inputs: tuple[Tensor, ...], atomic: bool
                   ) -> tuple[BlockSizes, tuple[bool, tuple[Tensor, ...]]]:
    counter = SavedBytes(block)
    # Fresh leaves, as in every timed run, so the hook sees exactly what a timed forward saves.
    leaves = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
    with torch.enable_grad(), counter.hooks():
        output = _call(block, _fresh(leaves), atomic)
    params = list(block.parameters())
    sizes = BlockSizes(
        output_bytes=_nbytes(output[1]),
        saved_bytes=counter.nbytes,
        input_bytes=_nbytes(inputs),
        parameter_bytes=_nbytes(params) + _nbytes(list(block.buffers())),
        gradient_bytes=_nbytes([p for p in params if p.requires_grad]),
    )
    return sizes, output


# --- times ----------------------------------------------------------------------------------------

def _train_pass(steps: Sequence[_Step], clocks: Sequence[Clock], cores: Sequence[Cores | None],
                recorded: bool = False, streak: int = 1) -> list[list[tuple[float, float, float, float]]]:
    """Per block, ``streak`` times (Note [streaks]): the seconds of a grad-enabled forward and of its backward,
    in a step's order (Note [run order]), then the issue seconds of each (Note [issue seconds]).

    Every forward first, in block order (each block's ``streak`` forwards in a row), keeping the graphs;
    then every backward, blocks in reverse order, each block's in the reverse of its forwards'. With
    ``recorded``, under a recording executor's hooks (Note [recorded runs]).
    """
    graphs: list[list[tuple[float, float, list[Tensor], list[Tensor]]]] = []
    for step, clock, where in zip(steps, clocks, cores, strict=True):
        built = []
        with pinned(where):
            for _ in range(streak):
                leaves = tuple(t.detach().requires_grad_(t.requires_grad) for t in step.inputs)
                with torch.enable_grad(), (SavedBytes(step.block).hooks() if recorded else nullcontext()):
                    fresh = _fresh(leaves)
                    forward, issue, (_, outputs) = clock(lambda: _call(step.block, fresh, step.atomic))  # noqa: B023
                tensors = [t for t in outputs if t.requires_grad]
                built.append((forward, issue, tensors, [torch.ones_like(t) for t in tensors]))
        graphs.append(built)
    times: list[list[tuple[float, float, float, float]]] = []
    for step, clock, where, built in reversed(list(zip(steps, clocks, cores, graphs, strict=True))):
        block: list[tuple[float, float, float, float]] = []
        with pinned(where):
            for forward, issue, tensors, grads in reversed(built):
                backward = backward_issue = 0.0
                if tensors:
                    backward, backward_issue, _ = clock(lambda: torch.autograd.backward(tensors, grads))  # noqa: B023
                for p in step.block.parameters():
                    p.grad = None
                block.append((forward, backward, issue, backward_issue))
        built.clear()  # the graphs die here
        times.append(block[::-1])
    return times[::-1]


def _nograd_runs(step: _Step, clock: Clock, cores: Cores | None = None, streak: int = 1) -> list[tuple[float, float]]:
    """Seconds and issue seconds of ``streak`` forwards in a row as a checkpointed micro-batch runs them."""
    out = []
    with pinned(cores), torch.no_grad(), checkpointing():
        for _ in range(streak):
            fresh = _fresh(step.inputs)
            seconds, issue, _ = clock(lambda: _call(step.block, fresh, step.atomic))  # noqa: B023
            out.append((seconds, issue))
    return out


def _clock(dev: torch.device) -> Clock:
    """A function that runs a thunk and returns (seconds, issue seconds, its result): Note [issue seconds]."""
    if dev.type == "cuda":
        def cuda_clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
            with torch.cuda.device(dev):
                torch.cuda.synchronize(dev)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                tick = time.perf_counter()
                result = fn()
                issue = time.perf_counter() - tick
                end.record()
                end.synchronize()
                return start.elapsed_time(end) / 1000.0, issue, result
        return cuda_clock

    def host_clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
        tick = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - tick
        return seconds, seconds, result
    return host_clock


# --- leaving the block as found -------------------------------------------------------------------

@contextmanager
def preserved(block: nn.Module) -> Iterator[None]:
    """Run ``block`` in training mode and leave it as found (Note [no side effects]).

    On entry the gradients, buffers, plain numeric attributes and training flags of ``block`` and its
    submodules are saved, its parameters' gradients cleared and ``block.train()`` called; on exit, even
    after an error, all of them are restored in place. The random state is not this context's: callers
    that draw fork it themselves. Used by the profiler and by the simulator's calibration (``sim.extras``,
    ``sim.pairs``, ``sim.primitives``), which run the same partitions again and again.
    """
    grads = [(p, p.grad) for p in block.parameters()]
    modules = list(block.modules())
    scalars = [(m, {k: v for k, v in vars(m).items() if isinstance(v, (bool, int, float))}) for m in modules]
    buffers = [(m, {k: (b, None if b is None else b.detach().clone()) for k, b in m._buffers.items()})
               for m in modules]
    for p, _ in grads:
        p.grad = None
    block.train()
    try:
        yield
    finally:
        with torch.no_grad():
            for m, saved in buffers:
                for name, (original, value) in saved.items():
                    if original is not None and value is not None:
                        original.copy_(value)
                    m._buffers[name] = original
        for m, attrs in scalars:
            for k, v in attrs.items():
                setattr(m, k, v)
        for p, g in grads:
            p.grad = g
