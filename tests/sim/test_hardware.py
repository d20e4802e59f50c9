"""The hardware catalog: specs, validation, look-ups."""

from __future__ import annotations

import math

import pytest

from sim.core.link import LinkSpec
from sim.planning.hardware.catalog import DEVICES, LINKS, DeviceSpec, get_device, get_link

GB = 1e9
GiB = 2**30
MiB = 2**20


def test_catalog_has_the_promised_entries() -> None:
    for name in ("tesla-p40", "v100-sxm2-16gb", "v100-sxm2-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "cpu"):
        assert name in DEVICES
    for name in ("pcie3-x16", "pcie4-x16", "pcie5-x16", "nvlink2", "nvlink3", "nvlink4", "infiniband-hdr",
                 "ethernet-100g", "cpu-memcpy"):
        assert name in LINKS


def test_datasheet_figures() -> None:
    p40 = get_device("tesla-p40")
    assert p40.peak_flops["fp32"] == 12e12 and p40.memory_bytes == 24451 * MiB and p40.memory_bandwidth == 346 * GB
    h200 = get_device("h200")
    assert h200.memory_bytes == 143771 * MiB and h200.memory_bandwidth == 4.8e12  # as nvidia-smi reports it
    assert get_device("v100-sxm2-32gb").memory_bytes == 32 * GiB
    assert get_device("a100-80gb").peak_flops["bf16"] == 312e12
    assert get_link("pcie3-x16").bandwidth == pytest.approx(15.75 * GB)
    assert get_link("infiniband-hdr").bandwidth == 25 * GB


def test_every_entry_is_sane() -> None:
    for dev in DEVICES.values():
        assert 0 < dev.efficiency <= 1 and dev.memory_bytes > 0 and dev.memory_bandwidth > 0
        assert all(v > 0 and math.isfinite(v) for v in dev.peak_flops.values())
        assert dev.to_dict()["name"] == dev.name
    for link in LINKS.values():
        assert link.latency >= 0 and link.bandwidth > 0


def test_lookup_is_case_insensitive_and_lists_names_on_error() -> None:
    assert get_device(" A100-80GB ") is DEVICES["a100-80gb"]
    assert get_link("NVLink3") is LINKS["nvlink3"]
    with pytest.raises(KeyError, match="known devices: tesla-p40, .*h200"):
        get_device("tpu-v9")
    with pytest.raises(KeyError, match="known links: pcie3-x16"):
        get_link("carrier-pigeon")


def test_transfer_seconds_is_latency_plus_bytes_over_bandwidth() -> None:
    link = LinkSpec("test", 1e-5, 1e9)
    assert link.transfer_seconds(0) == 1e-5
    assert link.transfer_seconds(2e9) == pytest.approx(2.00001)
    with pytest.raises(ValueError, match="bytes >= 0"):
        link.transfer_seconds(-1)
    with pytest.raises(ValueError, match="bytes >= 0"):
        link.transfer_seconds(float("nan"))


@pytest.mark.parametrize("bandwidth", [0, -1.0, float("nan"), float("inf")])
def test_bad_bandwidth_is_rejected(bandwidth: float) -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        LinkSpec("bad", 0.0, bandwidth)


def test_bad_device_figures_are_rejected() -> None:
    with pytest.raises(ValueError, match="latency"):
        LinkSpec("bad", -1.0, 1e9)
    with pytest.raises(ValueError, match="memory bandwidth"):
        DeviceSpec("bad", {"fp32": 1e12}, 0, 1)
    with pytest.raises(ValueError, match="efficiency"):
        DeviceSpec("bad", {"fp32": 1e12}, 1e9, 1, efficiency=1.5)
    with pytest.raises(ValueError, match="fp16"):
        DeviceSpec("bad", {"fp16": float("nan")}, 1e9, 1)
    with pytest.raises(ValueError, match="at least one dtype"):
        DeviceSpec("bad", {}, 1e9, 1)


def test_specs_are_frozen_and_rates_use_efficiency() -> None:
    dev = get_device("a100-40gb")
    with pytest.raises(AttributeError):
        dev.efficiency = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        dev.peak_flops["fp32"] = 1.0  # type: ignore[index]
    assert dev.achievable_flops("tf32") == 156e12 * dev.efficiency
    assert dev.compute_seconds(156e12, "tf32") == pytest.approx(1 / dev.efficiency)
    assert dev.memory_seconds(dev.memory_bandwidth) == pytest.approx(1 / dev.efficiency)
    with pytest.raises(KeyError, match="a100-40gb has no FP8 peak"):
        dev.achievable_flops("fp8")
    assert hash(dev) == hash(get_device("a100-40gb"))
