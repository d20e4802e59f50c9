"""What crosses between stages: messages of tensors with their structure, sent and received through a transport.

Everything one worker hands another goes through a :class:`Transport`: activations downstream, gradients upstream,
skip tensors and their gradients, and what the caller (the *driver*) exchanges with the first and last stages:
the micro-batches, the targets, the output gradients coming in, the outputs, losses and input gradients going
out. A message is keyed by the task that produced it and a channel, and carries its own structure::

    key = (Task, channel)       F1@0 ""          activation of F(1, 0), to stage 1
                                B1@2 ""          input gradient of B(1, 2), to stage 1
                                F1@0 skip key    a skip tensor stashed in F(1, 0), to the popping stage
                                B1@2 skip key    its gradient, from the popping stage's B back to the stashing one
                                F1@0 "input"     micro-batch 1 from the driver       (and "target", "grad")
                                F1@3 "output"    the last stage's output to the driver (and "loss"; B1@0 "input-grad")

Note [no shared state between workers]: a worker keeps only what its own tasks need (leaves, graphs, stashed
tensors, popped leaves); anything another worker or the driver needs travels as a message, so a process per
device (torch.distributed) is another :class:`Transport`, not another interpreter. The in-process transport is
:class:`gpipe.transport.inprocess.InProcess`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import NamedTuple

from torch import Tensor

from gpipe.schedule import Task

__all__ = ["DRIVER", "Key", "Message", "Stopped", "Transport"]

DRIVER = -1
"""The stage number of the caller's side: inputs come from it, outputs and input gradients go back to it."""

Key = tuple[Task, Hashable]
"""A message's key: the task that produced it and a channel (``""``, a skip key, or a driver channel)."""


class Message(NamedTuple):
    """Tensors that cross between stages, with the structure the receiver rebuilds."""

    tensors: tuple[Tensor | None, ...]
    is_tuple: bool = False  # the sender's value was a tuple (else the one tensor)


class Stopped(Exception):
    """Raised inside a worker waiting for a message when another worker failed (:meth:`Transport.stop`)."""


class Transport(ABC):
    """Sends messages to the worker that runs a stage (or to the driver) and receives them there."""

    @abstractmethod
    def send(self, stage: int, key: Key, message: Message) -> None:
        """Hand ``message`` to the worker of ``stage`` (:data:`DRIVER`: to the caller); never waits for it."""

    @abstractmethod
    def receive(self, stage: int, key: Key) -> Message:
        """The message ``key`` sent to ``stage``, its tensors on that stage's device; waits for it.

        The driver (``stage`` :data:`DRIVER`) receives only after the workers ended, as they were sent.

        Raises:
            Stopped: :meth:`stop` was called (another worker failed).
        """

    @abstractmethod
    def stop(self) -> None:
        """Wake every worker waiting in :meth:`receive` with :class:`Stopped`."""
