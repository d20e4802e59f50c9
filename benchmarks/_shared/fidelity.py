"""The fidelity experiments' grid: their two CPU models, the stages a schedule runs on the workers, the shapes a
generator refuses, and the statistics of a grid's errors (``fidelity.py`` and the benchmarks built on its grid).

Note [schedule axis]: every schedule runs on the same workers. One registered with a layout (several stages per
device: interleaved, V-shapes) gets two stages per worker, or the fewest its layout takes (:func:`stages_for`); any
other one stage per worker. A shape the generator refuses (e.g. too few micro-batches for its warm-up) is skipped and
listed as such (:func:`refusal`), never guessed around.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpipe import microbatch
from gpipe.schedule import Checkpoint, schedule_kind

__all__ = ["BATCH", "DEVICES", "MODELS", "TRIM", "conv_model", "mlp_model", "refusal", "stages_for", "summary",
           "trimmed_mean"]

BATCH = 64
DEVICES = 2  # CPU workers, one core each
TRIM = 0.2  # Note [trimmed means] in fidelity.py


def conv_model(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    """Compute-heavy: ten 3x3 convolutions of 48 channels (two halve the image), a linear head."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Conv2d(3, 48, 3, padding=1), nn.ReLU()]
    for k in range(9):
        layers += [nn.Conv2d(48, 48, 3, stride=2 if k in (3, 6) else 1, padding=1), nn.ReLU()]
    layers += [nn.Flatten(), nn.Linear(48 * 8 * 8, 10)]
    return nn.Sequential(*layers), torch.randn(BATCH, 3, 32, 32)


def mlp_model(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    """Many small layers: 64 x (Linear(64, 64), ReLU); each task is mostly per-layer host time."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(64):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(BATCH, 64)


MODELS: dict[str, Callable[[int], tuple[nn.Sequential, torch.Tensor]]] = {"conv": conv_model, "mlp": mlp_model}


def stages_for(schedule: str, devices: int = DEVICES) -> int:
    """Note [schedule axis]: the stages ``schedule`` runs on ``devices`` workers: two per worker for one registered
    with a layout (else the fewest its layout takes, up to four per worker), one per worker otherwise.

    Raises:
        ValueError: the schedule's layout takes none of those (the last refusal's message).
    """
    kind = schedule_kind(schedule)
    if kind.place is None:
        return devices
    error = ValueError(f"schedule {schedule!r} places no stage count it was offered")
    for n in (2 * devices, devices, 3 * devices, 4 * devices):
        try:
            kind.layout(n, devices)
        except ValueError as refused:
            error = refused
            continue
        return n
    raise error


def refusal(schedule: str, chunks: int, stages: int, checkpoint: Checkpoint, devices: int = DEVICES,
            batch: int = BATCH) -> str | None:
    """Why the generator refuses this shape (Note [schedule axis]), or ``None`` when it builds a valid schedule."""
    m = len(microbatch.sizes(batch, chunks))
    try:
        schedule_kind(schedule)(m, stages, checkpoint, devices=devices).validate()
    except ValueError as refused:  # a ScheduleError is a ValueError too
        return str(refused).splitlines()[0]
    return None


def summary(rows: list[dict[str, Any]],
            keys: Sequence[str] = ("error", "paired_error", "trimmed_error")) -> dict[str, float]:
    """Mean and max |error| of the rows, by each of the errors named in ``keys``."""
    out = {}
    for key in keys:
        values = [abs(r[key]) for r in rows]
        out[f"mean_abs_{key}"], out[f"max_abs_{key}"] = statistics.mean(values), max(values)
    return out


def trimmed_mean(values: Sequence[float], cut: float = TRIM) -> float:
    """The mean of ``values`` without the ``cut`` fraction of the lowest and of the highest (Note [trimmed means] in
    fidelity.py)."""
    ordered = sorted(values)
    drop = int(len(ordered) * cut)
    return statistics.mean(ordered[drop:len(ordered) - drop])
