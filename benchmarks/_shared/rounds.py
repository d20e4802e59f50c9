"""Timing in-process configurations against each other on a shared machine: shuffled rounds, medians, paired ratios.

Note [interleaving]: the machine is shared, so the in-process configurations are timed round-robin (one step of
each per round, in an order shuffled anew each round) and every time is the median over rounds; a slow spell then
spoils one sample of each configuration instead of every sample of one. A ratio between two of them is the median
of the per-round ratios (each pair timed within the same fraction of a second), which a machine whose speed drifts
during the run distorts far less than a ratio of medians.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Runner", "alternated", "block", "interleaved", "ms", "ratio"]


@dataclass
class Runner:
    """One in-process configuration: a name and the zero-argument step it times."""

    name: str
    step: Callable[[], object]
    samples: list[float]


def interleaved(runners: Sequence[Runner], warmup: int, repeats: int) -> None:
    """Time one step of every runner per round, in a seeded random order (Note [interleaving])."""
    for _ in range(warmup):
        for r in runners:
            r.step()
    gc.collect()
    # shuffled, not rotated: under rotation each runner always follows the same one and inherits what it leaves
    # (caches, the allocator's state); a runner timed right after the plain model read 13-23% slower than itself
    order = random.Random(0)
    for _ in range(repeats):
        for r in order.sample(list(runners), len(runners)):
            start = time.perf_counter()
            r.step()
            r.samples.append(time.perf_counter() - start)


def block(step: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """Time ``repeats`` steps in a row after ``warmup`` untimed ones: a configuration that cannot share rounds."""
    for _ in range(warmup):
        step()
    gc.collect()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return samples


def alternated(a: Callable[[], object], b: Callable[[], object], pairs: int, seed: int = 1) -> float:
    """``a`` over ``b`` timed back to back, ``pairs`` times, each pair in a seeded random order: the median of the
    per-pair ratios, for two configurations too close for shuffled rounds of many to tell apart."""
    order = random.Random(seed)
    ratios = []
    for _ in range(pairs):
        seconds = {}
        for name, fn in order.sample([("a", a), ("b", b)], 2):
            start = time.perf_counter()
            fn()
            seconds[name] = time.perf_counter() - start
        ratios.append(seconds["a"] / seconds["b"])
    return statistics.median(ratios)


def ms(samples: Sequence[float]) -> float:
    """The median of ``samples`` (seconds), in milliseconds."""
    return statistics.median(samples) * 1e3


def ratio(a: Sequence[float], b: Sequence[float], paired: bool) -> float:
    """``a`` over ``b``: the median of per-round ratios when both were timed in the same rounds, else of medians."""
    if paired and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b, strict=True))
    return statistics.median(a) / statistics.median(b)
