"""sim.calibration.machine: the devices, cores, threads and background load an experiment measures on."""

from __future__ import annotations

import pytest
import torch

import sim.calibration.machine as machine
from gpipe.interpreter.affinity import supported
from sim.calibration.machine import (
    BackgroundLoad,
    cpu_count,
    default_devices,
    intra_op_threads,
    shares_cores,
    worker_affinity,
)


def test_default_devices_take_cuda_only_when_there_is_one_per_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert default_devices(2) == ("cuda:0", "cuda:1")
    assert default_devices(3) == ("cpu", "cpu", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_devices(2) == ("cpu", "cpu")
    with pytest.raises(ValueError, match="at least one partition"):
        default_devices(0)


@pytest.mark.parametrize(("devices", "shared"), [(("cpu", "cpu"), True), (("cpu",), False),
                                                  (("cpu", "cuda:0"), False), (("cuda:0", "cuda:1"), False)])
def test_only_several_cpu_devices_share_cores(devices: tuple[str, ...], shared: bool) -> None:
    assert shares_cores(devices) is shared


@pytest.mark.skipif(not supported(), reason="pinning threads needs Linux")
def test_worker_affinity_deals_the_cores_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "available_cores", lambda: [3, 5])
    assert worker_affinity(["cpu", "cpu"]) == [frozenset({3}), frozenset({5})]
    assert worker_affinity(["cpu", "cpu", "cpu"]) == [frozenset({3}), frozenset({5}), frozenset({3})]


def test_worker_affinity_is_none_off_the_cpu_or_without_devices() -> None:
    assert worker_affinity(["cpu", "cuda:0"]) is None
    assert worker_affinity([]) is None


def test_intra_op_threads_are_restored_after_the_block() -> None:
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(KeyError), intra_op_threads(1):
        raise KeyError("restored on error too")
    assert torch.get_num_threads() == before
    with intra_op_threads(None):
        assert torch.get_num_threads() == before


def test_background_load_and_cpu_count_read_the_machine() -> None:
    load = BackgroundLoad().cores()
    assert load is None or load >= 0.0
    count = cpu_count()
    assert count is None or count >= 1
