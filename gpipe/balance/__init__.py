"""Choose a balance (layers per partition) for a sequential model, by measured time or by memory.

Both functions profile each layer with :mod:`gpipe.profiling.profile` (the profiler that calibration uses too),
turn each layer into one cost, and hand the costs to the exact solver in
:mod:`gpipe.balance.blockpartition`, which minimises the cost of the most expensive partition::

    from gpipe import GPipe
    from gpipe.balance import balance_by_time

    balance = balance_by_time(2, model, torch.randn(32, 3, 32, 32), device="cpu")
    pipe = GPipe(model, balance, chunks=4)

Note [device]: as in torchgpipe, layers are profiled on ``device`` (by default the current CUDA device,
or the CPU without one). Layers already there are profiled in place and left exactly as found; the
others are profiled as copies moved there (held until profiling ends), so the model itself is never
moved or changed. To profile a CPU model on the CPU of a machine with a GPU, pass ``device="cpu"``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from torch import nn

from gpipe.balance import blockpartition

if TYPE_CHECKING:  # the profiler loads when a balance is measured: the planner imports blockpartition alone
    from gpipe.profiling.profile import Device, TensorOrTensors

__all__ = ["balance_by_size", "balance_by_time", "blockpartition"]

_MIN_REPEATS = 3  # a median of three survives one outlier (the first backward of a process is slow)
_MAX_REPEATS = 100


def balance_by_time(partitions: int, module: nn.Sequential, sample: TensorOrTensors, *,
                    timeout: float = 1.0, device: Device | None = None) -> list[int]:
    """Balance by forward plus backward seconds per layer.

    Args:
        partitions: how many partitions (stages).
        module: the model, an ``nn.Sequential``; each child is one layer.
        sample: an input, of the micro-batch size the pipeline will run.
        timeout: about how many seconds to spend: after a warm-up and three timed passes over the
            layers (always done), more passes are timed while they fit, up to 100 (each cost is the
            median over the passes).
        device: where to profile (see Note [device]); ``None``: CUDA if available, else the CPU.

    Returns:
        The number of layers in each partition, summing to ``len(module)``.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: ``partitions`` is not between 1 and ``len(module)``, or ``timeout`` is negative.
    """
    from gpipe.profiling.profile import profile_blocks

    _check(partitions, module)
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    dev = _default_device(device)
    begun = time.perf_counter()
    profiles = profile_blocks(list(module), sample, device=dev, warmup=1, repeats=_MIN_REPEATS)
    elapsed = time.perf_counter() - begun
    per_repeat = elapsed / (_MIN_REPEATS + 2)  # the first call also sized and warmed up every layer
    more = min(int((timeout - elapsed) / max(per_repeat, 1e-9)), _MAX_REPEATS)
    if more > _MIN_REPEATS:
        profiles = profile_blocks(list(module), sample, device=dev, warmup=0, repeats=more)
    return blockpartition.solve([p.train_seconds for p in profiles], partitions)


def balance_by_size(partitions: int, module: nn.Sequential, input: TensorOrTensors, *, chunks: int = 1,
                    param_scale: float = 2.0, device: Device | None = None) -> list[int]:
    """Balance by the bytes each layer keeps: saved for backward, plus model state.

    A layer costs the bytes autograd saves for its backward on one micro-batch (the first chunk of
    ``input``, as the pipeline will cut it), measured with saved-tensor hooks so it works on any
    device, plus ``param_scale`` times its parameter and buffer bytes. ``param_scale`` counts the
    copies of the parameters that training holds: 2 for the parameters and their gradients (plain
    SGD), 3 with momentum, 4 for Adam's two moments.

    Args:
        partitions: how many partitions (stages).
        module: the model, an ``nn.Sequential``; each child is one layer.
        input: a whole mini-batch, as it will be trained.
        chunks: the micro-batches it will be cut into.
        param_scale: copies of the parameters held for training.
        device: where to profile (see Note [device]); ``None``: CUDA if available, else the CPU.

    Returns:
        The number of layers in each partition, summing to ``len(module)``.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: ``partitions`` is not between 1 and ``len(module)``, ``chunks < 1``, or
            ``param_scale < 0``.
    """
    from gpipe.profiling.profile import profile_sizes

    _check(partitions, module)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a positive integer, got {chunks!r}")
    if not param_scale >= 0:
        raise ValueError(f"param_scale must be >= 0, got {param_scale!r}")
    if isinstance(input, torch.Tensor):
        micro: TensorOrTensors = input.chunk(chunks)[0]
    else:
        micro = tuple(t.chunk(chunks)[0] for t in input)
    sizes = profile_sizes(list(module), micro, device=_default_device(device))
    return blockpartition.solve([s.saved_bytes + param_scale * s.parameter_bytes for s in sizes], partitions)


def _check(partitions: int, module: nn.Module) -> None:
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"module must be an nn.Sequential, got {type(module).__name__}")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= len(module):
        raise ValueError(f"partitions must be between 1 and the {len(module)} layers of the module, "
                         f"got {partitions!r}")


def _default_device(device: Device | None) -> Device:
    if device is not None:
        return device
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
