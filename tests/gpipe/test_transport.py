"""The in-process transport: messages keyed by (producing task, channel), kept until asked for, a stop that wakes."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from gpipe.interpreter.pipeline import Pipeline
from gpipe.schedule import Op, Task, gpipe
from gpipe.skip.layout import SkipLayout
from gpipe.transport.base import DRIVER, Message, Stopped, Transport
from gpipe.transport.inprocess import InProcess


def _transport() -> Transport:
    parts = [nn.Sequential(nn.Linear(2, 2)) for _ in range(4)]
    pipeline = Pipeline.of(parts, [torch.device("cpu")] * 4, SkipLayout.of([p[0] for p in parts], [1, 1, 1, 1]))
    return InProcess(pipeline, gpipe(2, 4, "never", placement=[0, 1, 0, 1]), None)


def test_messages_wait_for_the_receiver_that_asks_for_them() -> None:
    transport = _transport()
    a, b = torch.ones(1), torch.zeros(1)
    transport.send(2, (Task(Op.F, 1, 1), ""), Message((a,), True))
    transport.send(2, (Task(Op.F, 0, 1), ""), Message((b,)))
    transport.send(0, (Task(Op.B, 0, 1), ""), Message((None,)))  # stage 0 shares device 0 with stage 2
    first = transport.receive(2, (Task(Op.F, 0, 1), ""))
    assert first.tensors[0] is b and not first.is_tuple  # on its device already: no copy
    assert transport.receive(0, (Task(Op.B, 0, 1), "")).tensors == (None,)
    assert transport.receive(2, (Task(Op.F, 1, 1), "")) == ((a,), True)


def test_the_driver_gets_what_was_sent_and_an_error_for_what_was_not() -> None:
    transport = _transport()
    transport.send(DRIVER, (Task(Op.F, 0, 3), "output"), Message((torch.ones(2),)))
    assert transport.receive(DRIVER, (Task(Op.F, 0, 3), "output")).tensors[0].shape == (2,)
    with pytest.raises(RuntimeError, match="no worker sent F1@3 'output'"):
        transport.receive(DRIVER, (Task(Op.F, 1, 3), "output"))


def test_stop_wakes_a_waiting_worker() -> None:
    transport = _transport()
    caught: list[BaseException] = []

    def wait() -> None:
        try:
            transport.receive(1, (Task(Op.F, 0, 0), ""))
        except Stopped as error:
            caught.append(error)

    thread = threading.Thread(target=wait)
    thread.start()
    transport.stop()
    thread.join(timeout=10)
    assert not thread.is_alive() and len(caught) == 1
