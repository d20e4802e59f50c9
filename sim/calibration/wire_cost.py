"""What a message between two ranks takes from their compute: probed in the ranks, charged to the tasks.

Note [a message's CPU]: between processes on one machine, gloo moves a message with the ranks' own cores (the
sender's write into the socket, gloo's thread reading it out in the receiver), and the copies evict what the
computing thread had cached. So each end of a message costs its rank compute time, charged to the task that
sends or receives it (``ExecutorStage.wire_forward``, ``wire_backward``; skip tensors' messages uncounted); when
it arrives is the busy link's price (Note [a busy link] in :mod:`sim.calibration.processes`). The ranks probe it
as a step pays it (:func:`measure_message_cpu`): rounds of compute with a message each way, against the same
rounds without. An idle ping-pong's copy is no price for it: it leaves out the caches and the core that busy
ranks lose, and prices a step's messages well under what they take (the prediction's error on two processes:
benchmarks/fidelity_processes.py; docs/benchmarks.md).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from sim.calibration.host import executor_costs
from sim.core.cost import CostModel

__all__ = ["MessageCpu", "measure_message_cpu", "message_sizes", "with_wire"]


@dataclass(frozen=True)
class MessageCpu:
    """Seconds one end of a message of each probed size takes from its rank's compute (Note [a message's CPU]).

    Between two probed sizes the price is interpolated linearly; below the smallest it is the smallest's (a message
    has a cost of its own whatever its size); above the largest it grows with the last two sizes' slope, or in
    proportion to the size where one was probed. No sizes: messages are free (no rank sends to another).
    """

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.seconds):
            raise ValueError(f"one price per probed size: sizes {self.sizes}, seconds {self.seconds}")
        if list(self.sizes) != sorted(set(self.sizes)) or any(s <= 0 for s in self.sizes):
            raise ValueError(f"probed sizes must be positive bytes, increasing, got {self.sizes}")
        if any(not s >= 0 for s in self.seconds):
            raise ValueError(f"prices must be seconds >= 0, got {self.seconds}")

    def __call__(self, nbytes: int) -> float:
        """The price of one end of a message of ``nbytes`` (0 for no message)."""
        if nbytes <= 0 or not self.sizes:
            return 0.0
        sizes, seconds = self.sizes, self.seconds
        k = bisect.bisect_left(sizes, nbytes)
        if k < len(sizes) and sizes[k] == nbytes:
            return seconds[k]
        if k == 0 or len(sizes) == 1:
            return seconds[0] if k == 0 else seconds[0] * nbytes / sizes[0]
        k = min(k, len(sizes) - 1)
        a, b = sizes[k - 1], sizes[k]
        return max(0.0, seconds[k - 1] + (seconds[k] - seconds[k - 1]) * (nbytes - a) / (b - a))

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "seconds": list(self.seconds)}


def message_sizes(cost: CostModel, placement: Sequence[int]) -> tuple[int, ...]:
    """The sizes of the activations (and so their gradients) that cross between ranks, each once, increasing."""
    n = len(placement)
    return tuple(sorted({cost.stages[j].send_bytes for j in range(n - 1)
                         if placement[j] != placement[j + 1] and cost.stages[j].send_bytes > 0}))


def with_wire(cost: CostModel, placement: Sequence[int], price: MessageCpu) -> CostModel:
    """``cost`` with each stage's messages to and from other ranks priced on its tasks (Note [a message's CPU]):
    an ``F`` pays for the activation it receives and the one it sends, a ``B`` for the two gradients."""
    executor, n = executor_costs(cost), len(placement)
    stages = []
    for j, extra in enumerate(executor.stages):
        received = cost.stages[j - 1].send_bytes if j > 0 and placement[j - 1] != placement[j] else 0
        sent = cost.stages[j].send_bytes if j < n - 1 and placement[j + 1] != placement[j] else 0
        seconds = price(received) + price(sent)
        stages.append(replace(extra, wire_forward=seconds, wire_backward=seconds))
    return replace(cost, runner=replace(executor, stages=tuple(stages)))


def measure_message_cpu(group: Any, rank: int, sizes: Sequence[int], rounds: int = 10,
                        repeats: int = 9) -> MessageCpu | None:
    """Price one end of a message of each size (Note [a message's CPU]) between ranks 0 and 1 of ``group``.

    Each size is timed in ``repeats`` pairs of ``rounds`` rounds of compute, one with one message each way a round
    (receives posted ahead, sends waited for at the end) and one without, back to back; the price is half the
    median over the pairs of what a round gained, averaged over the two ranks. Every rank may call it; rank 0
    returns the prices, the others ``None``.
    """
    if rank > 1 or not sizes:
        return None if rank else MessageCpu((), ())
    peer = 1 - rank
    generator = torch.Generator().manual_seed(0)
    a, w = torch.randn(256, 256, generator=generator), torch.randn(256, 256, generator=generator) * 0.01

    def compute() -> None:
        x = a
        for _ in range(8):
            x = torch.tanh(x @ w)

    prices = []
    for size in sizes:
        message = torch.zeros(max(1, size // 4), dtype=torch.float32)
        gains = []
        for k in range(repeats + 1):  # the first pair is a warm-up
            seconds = {}
            for with_messages in (k % 2 == 0, k % 2 == 1):  # each order alike, a drift cancels
                _meet(group, rank, peer)
                start = time.perf_counter()
                works = [dist.irecv(torch.empty_like(message), group=group, group_src=peer)
                         for _ in range(rounds)] if with_messages else []
                for _ in range(rounds):
                    compute()
                    if with_messages:
                        works.append(dist.isend(message, group=group, group_dst=peer))
                for work in works:
                    if work is not None:  # None only on a rank outside the group
                        work.wait()
                seconds[with_messages] = time.perf_counter() - start
            gains += [seconds[True] - seconds[False]] if k else []
        prices.append(statistics.median(gains) / rounds / 2)
    both = torch.tensor(prices, dtype=torch.float64)  # each rank's view: their mean halves the machine's noise
    if rank == 1:
        dist.send(both, group=group, group_dst=0)
        return None
    other = torch.empty_like(both)
    dist.recv(other, group=group, group_src=1)
    return MessageCpu(tuple(sizes), tuple(max(0.0, float(v)) for v in (both + other) / 2))


def _meet(group: Any, rank: int, peer: int) -> None:
    """Ranks 0 and 1 start a timing together (a barrier would need every rank of the group)."""
    token = torch.zeros(1)
    if rank == 0:
        dist.send(token, group=group, group_dst=peer)
        dist.recv(token, group=group, group_src=peer)
    else:
        dist.recv(token, group=group, group_src=peer)
        dist.send(token, group=group, group_dst=peer)
