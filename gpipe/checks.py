"""The checks of :class:`gpipe.GPipe`'s arguments: each error names the fix."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gpipe.schedule.size import Available, check_schedule_size

__all__ = ["TooFewDevices", "check_balance", "check_chunks", "check_count", "check_devices", "check_positive",
           "check_unique"]

Device = torch.device | str | int


class TooFewDevices(IndexError, ValueError):
    """Fewer devices than partitions: an ``IndexError``, as torchgpipe raises, and a ``ValueError``, as any bad
    argument is."""


def check_count(name: str, value: Any) -> int:
    """An integer-like ``value`` (``int``, a NumPy integer; not ``bool``) of at least 1, as an ``int``."""
    try:
        count = operator.index(value)
    except TypeError:
        count = None
    if isinstance(value, bool) or count is None or count < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return count


def check_chunks(value: Any, stages: int, available: Available | None = None) -> int:
    """``chunks`` as an ``int``: a positive integer (:func:`check_count`) whose schedule on ``stages`` stages fits in
    this machine's memory (:func:`gpipe.schedule.check_schedule_size`; ``available``: its memory source), checked
    before any task is built: ``chunks=10**9`` is refused at once, not after a minute of building tasks."""
    chunks = check_count("chunks (micro-batches per mini-batch)", value)
    check_schedule_size(chunks, stages, "chunks=", available)
    return chunks


def check_unique(module: nn.Sequential) -> None:
    seen: dict[int, int] = {}
    for index, layer in enumerate(module):
        if id(layer) in seen:
            raise ValueError(f"module has duplicate children: layer {index} is the same object as layer "
                             f"{seen[id(layer)]}; a layer can live in only one partition, so use a copy "
                             "(copy.deepcopy) or share parameters explicitly")
        seen[id(layer)] = index


def check_balance(balance: Sequence[int] | None, layers: int) -> list[int]:
    if balance is None:
        raise ValueError("balance is required: the number of layers in each partition, e.g. balance=[2, 2], or "
                         "one computed by gpipe.balance.balance_by_time(partitions, module, sample)")
    try:
        values = list(balance)
    except TypeError:
        raise TypeError(f"balance must be a list of layer counts, got {type(balance).__name__}") from None
    if not values:
        raise ValueError("balance is empty: give at least one partition, e.g. balance=[len(module)]")
    try:
        values = [check_count("a partition's layer count", b) for b in values]
    except ValueError:
        raise ValueError(f"every partition needs a positive number of layers, got balance={values}") from None
    if sum(values) != layers:
        raise ValueError(f"balance {values} sums to {sum(values)} but the module has {layers} layers; "
                         "make the counts add up to len(module)")
    return values


def check_devices(devices: Sequence[Device] | None, partitions: int,
                  placement: Sequence[int] | None = None) -> list[torch.device]:
    """The device of each partition: ``devices`` has one per partition, or one per schedule device where the
    schedule's ``placement`` (stage to schedule device) uses fewer; ``None``: CUDA devices when there are enough."""
    slots = list(range(partitions)) if placement is None else list(placement)
    needed = max(slots) + 1
    if devices is None:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count >= needed:
            return [torch.device("cuda", k) for k in slots]
        return [torch.device("cpu")] * partitions
    if isinstance(devices, (str, int, torch.device)):
        raise TypeError(f"devices must be a list with one device per partition, got {devices!r}")
    result = []
    for dev in devices:
        try:
            device = torch.device(dev) if not isinstance(dev, int) else torch.device("cuda", dev)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"not a device: {dev!r} ({error})") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {dev!r} does not exist: CUDA is not available here; use 'cpu'")
            index = device.index if device.index is not None else torch.cuda.current_device()
            if index >= torch.cuda.device_count():
                raise ValueError(f"device {dev!r} does not exist: there are {torch.cuda.device_count()} CUDA devices")
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise ValueError(f"device {dev!r} is not supported: GPipe runs on 'cpu' and 'cuda' devices")
        result.append(device)
    if len(result) >= partitions:
        return result[:partitions]
    if needed < partitions and len(result) >= needed:  # one per schedule device
        return [result[d] for d in slots]
    raise TooFewDevices(f"too few devices: {partitions} partitions need {partitions} devices"
                        + (f" (or {needed}, one per device of the schedule)" if needed < partitions else "")
                        + f", got {len(result)}; list a device per partition (several partitions may share one, "
                        "e.g. ['cpu'] * n)")


def check_positive(name: str, value: int) -> None:
    """Refuse anything but an integer of at least 1 (a ``bool`` too), naming the argument."""
    check_count(name, value)
