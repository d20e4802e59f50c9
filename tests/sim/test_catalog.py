"""The catalog of devices and links people buy: every figure positive and consistent, memory as the board reports it."""

from __future__ import annotations

import pytest

from sim.cli import main
from sim.planning.hardware.catalog import DEVICES, LINKS, DeviceSpec, get_device, get_link
from sim.planning.plan import resolve_link

GB = 10**9
GiB = 2**30
MiB = 2**20

NEW_DEVICES = ("h100-pcie", "h100-nvl", "h800", "b200", "gb200", "l40s", "mi300x", "mi325x")
NEW_LINKS = ("nvlink4-bridge", "nvlink4-h800", "nvlink5", "xgmi-mi300", "infiniband-ndr", "infiniband-xdr", "roce-400g",
             "roce-800g")
GPUS = [d for d in DEVICES.values() if d.name != "cpu"]
#: The memory each datasheet prints, "GB".
LABEL_GB = {"tesla-p40": 24, "v100-sxm2-16gb": 16, "v100-sxm2-32gb": 32, "a100-40gb": 40, "a100-80gb": 80,
            "h100-sxm": 80, "h800": 80, "h100-pcie": 80, "h100-nvl": 94, "h200": 141, "b200": 180, "gb200": 186,
            "l40s": 48, "mi300x": 192, "mi325x": 256}


def test_every_new_name_resolves_and_old_names_still_do() -> None:
    for name in (*NEW_DEVICES, "h100-sxm", "h200", "a100-80gb", "tesla-p40"):
        assert get_device(name.upper()) is DEVICES[name]
    for name in (*NEW_LINKS, "nvlink3", "nvlink4", "infiniband-hdr", "pcie4-x16", "ethernet-100g"):
        assert get_link(name.upper()) is LINKS[name]


@pytest.mark.parametrize("dev", GPUS, ids=lambda d: d.name)
def test_peaks_are_ordered_as_the_datasheets_give_them(dev: DeviceSpec) -> None:
    peaks = dev.peak_flops
    assert all(v > 0 for v in peaks.values()) and dev.memory_bandwidth > 0 and dev.memory_bytes > 0
    if "bf16" in peaks:
        assert peaks["bf16"] == peaks["fp16"]  # every datasheet here gives BF16 and FP16 one figure
    if "fp8" in peaks:
        assert peaks["fp16"] < peaks["fp8"]
    if "tf32" in peaks:
        assert peaks["fp32"] <= peaks["tf32"] < peaks["fp16"]
    if "fp64" in peaks:
        assert peaks["fp64"] <= peaks["fp32"]
    assert dev.roofline is not None and dev.roofline.source  # every GPU says where its fractions come from


def test_dense_peaks_are_half_the_sparsity_starred_figures() -> None:
    # Note [dense peaks]: the datasheets' starred (2:4 sparse) FP16 figures, TFLOPS.
    starred = {"h100-sxm": 1979, "h100-pcie": 1513, "h100-nvl": 1671, "h200": 1979, "b200": 4500, "gb200": 5000}
    for name, sparse in starred.items():
        assert get_device(name).peak_flops["fp16"] == pytest.approx(sparse * 1e12 / 2, rel=1e-3)
    # Where the datasheet prints the dense figure, it is taken as printed.
    assert get_device("l40s").peak_flops["fp16"] == 362.05e12 and get_device("mi300x").peak_flops["bf16"] == 1307.4e12


def test_memory_is_what_the_board_reports_not_the_datasheet_label() -> None:
    h100 = get_device("h100-sxm").memory_bytes
    assert 79 * GiB < h100 < 80 * GiB and h100 == 81559 * MiB  # an "80 GB" H100 is 79.6 GiB
    assert get_device("a100-80gb").memory_bytes == 80 * GiB  # while an A100 80GB reports a full 81,920 MiB
    assert get_device("b200").memory_bytes == 183359 * MiB and get_device("gb200").memory_bytes == 189471 * MiB
    assert get_device("mi300x").memory_bytes == 206_141_652_992  # rocm-smi, bytes
    assert get_device("l40s").memory_bytes < 45 * GiB  # GDDR6 with ECC on: 1/16 held back
    assert get_device("mi325x").memory_bytes == 256 * GB  # no report found: the datasheet read as decimal bytes
    # Every board reports at least its datasheet label read as decimal GB (Note [memory as reported]).
    assert {d.name for d in GPUS} == set(LABEL_GB)
    for name, label in LABEL_GB.items():
        assert get_device(name).memory_bytes >= label * GB, name


def test_links_are_per_direction_bytes_per_second() -> None:
    assert get_link("nvlink5").bandwidth == 900 * GB == 2 * get_link("nvlink4").bandwidth
    assert get_link("nvlink4-bridge").bandwidth == 300 * GB
    assert get_link("infiniband-ndr").bandwidth == 400e9 / 8 == get_link("roce-400g").bandwidth
    assert get_link("infiniband-xdr").bandwidth == 800e9 / 8 == 4 * get_link("infiniband-hdr").bandwidth
    assert get_link("xgmi-mi300").bandwidth == 64 * GB
    assert get_link("nvlink4-h800").bandwidth == 200 * GB  # 400 GB/s both directions
    assert get_link("roce-800g").bandwidth == 800e9 / 8 == get_link("infiniband-xdr").bandwidth


def test_the_h800_is_an_h100_sxm_with_less_nvlink() -> None:
    h800, h100 = get_device("h800"), get_device("h100-sxm")
    assert dict(h800.peak_flops) == dict(h100.peak_flops) and h800.peak_flops["fp8"] == 1979e12
    assert (h800.memory_bandwidth, h800.memory_bytes) == (h100.memory_bandwidth, h100.memory_bytes)
    for link in LINKS.values():
        assert 0 < link.latency < 1e-4 and link.bandwidth > 0


def test_gpipe_sim_hardware_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    for name in (*NEW_DEVICES, *NEW_LINKS):
        assert f"\n{name} " in out


@pytest.mark.parametrize(("device", "nvlink", "pcie"), [
    ("h100-sxm", "nvlink4", "pcie5-x16"), ("h100-pcie", "nvlink4-bridge", "pcie5-x16"),
    ("h100-nvl", "nvlink4-bridge", "pcie5-x16"), ("b200", "nvlink5", "pcie5-x16"), ("gb200", "nvlink5", "pcie5-x16"),
    ("l40s", None, "pcie4-x16"), ("mi300x", None, "pcie5-x16"),
])
def test_a_link_family_names_the_generation_that_comes_with_the_device(device: str, nvlink: str | None,
                                                                       pcie: str) -> None:
    spec = get_device(device)
    assert resolve_link("pcie", spec).name == pcie
    if nvlink is None:
        with pytest.raises(KeyError, match="has no nvlink"):
            resolve_link("nvlink", spec)
    else:
        assert resolve_link("nvlink", spec).name == nvlink
