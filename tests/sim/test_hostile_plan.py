"""Hostile input to ``plan`` and ``hardware``: a model past a size cap, a hardware file that is not a device, a
user's function that takes arguments and more calibration threads than cores are each one line with exit status 2,
refused before any counting, timing or writing; sequence parallelism at tensor parallel 1 is none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpipe.interpreter.affinity import available_cores
from sim.cli import main
from sim.planning.costs.calibrate_device import check_threads
from sim.planning.counting.models import get_model
from sim.planning.counting.models.limits import (
    AMOEBANET_FILTERS,
    AMOEBANET_LAYERS,
    DECODER_LAYERS,
    FFN,
    HIDDEN,
    SEQ,
    UNET_BLOCKS,
    UNET_CHANNELS,
    VOCAB,
)
from sim.planning.hardware.catalog import DEVICES, MAX_FILE_BYTES
from sim.planning.request import shard_keys

SMALL = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"
QUICK = ["--chunks", "2", "--schedule", "gpipe", "--checkpoint", "never", "--no-progress"]


def _plan(model: str, *flags: str, hardware: str = "a100-80gb") -> list[str]:
    return ["plan", "--model", model, "--batch", "64", "--gpus", "8", "--hardware", hardware, *flags]


@pytest.fixture
def no_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a model is built or counted."""
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the count started")

    monkeypatch.setattr("sim.planning.counting.models.ModelSpec.module", started)
    monkeypatch.setattr("sim.planning.counting.models.count_layers", started)
    monkeypatch.setattr("sim.cli.plan.count_layers", started)


def _one_line(capsys: pytest.CaptureFixture[str], code: int, *needles: str) -> str:
    out = capsys.readouterr()
    assert code == 2, out.err
    assert len(out.err.strip().splitlines()) == 1 and not out.out, out.err
    for needle in needles:
        assert needle in out.err
    return out.err


# -- sizes past the caps (Note [size caps] in sim.planning.counting.models.limits)
# -------------------------------------------

@pytest.mark.parametrize(("model", "needles"), [
    ("gpt:layers=1000000000,hidden=768,heads=12,seq=512,vocab=1000",
     ["layers 1,000,000,000 is above the planner's cap of 2,048", "7.1e+15 parameters", "58 days"]),
    ("gpt:layers=10000,hidden=768,heads=12,seq=512,vocab=1000", ["layers 10,000", "about 50 seconds"]),
    ("llama:layers=100000,hidden=768,heads=12,kv-heads=4,ffn=2048,seq=512,vocab=1000", ["layers 100,000"]),
    ("gpt:layers=2,hidden=3000000000,heads=12,seq=512,vocab=1000", ["hidden size 3,000,000,000", "parameters"]),
    ("llama:layers=2,hidden=3000000000,heads=12,kv-heads=4,ffn=2048,seq=512,vocab=1000", ["hidden size"]),
    ("gpt:layers=2,hidden=768,heads=12,seq=1000000000,vocab=1000", ["sequence 1,000,000,000", "1.2e+19 elements"]),
    ("llama:layers=2,hidden=768,heads=12,kv-heads=4,ffn=2048,seq=1000000000,vocab=1000", ["sequence"]),
    ("gpt:layers=2,hidden=768,heads=12,seq=512,vocab=100000000", ["vocabulary 100,000,000"]),
    ("gpt:layers=2,hidden=768,heads=12,seq=512,vocab=1000,ffn=10000000", ["MLP width 10,000,000"]),
    ("unet:100000,100000", ["U-Net B 100,000", "4,400,021 layers", "hours"]),
    ("unet:5,100000", ["U-Net C 100,000"]),
    ("amoebanet:300,256", ["AmoebaNet-D L 300", "304 cells"]),
    ("amoebanet:18,16384", ["AmoebaNet-D D 16,384"]),
])
@pytest.mark.usefixtures("no_count")
def test_a_model_past_a_cap_is_refused_with_an_estimate_before_counting(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, model: str, needles: list[str]) -> None:
    out = tmp_path / "out"
    err = _one_line(capsys, main(_plan(model, "--out", str(out))), *needles)
    assert f"model {model!r}" in err
    assert not out.exists()


def test_the_caps_admit_the_largest_published_models_with_headroom() -> None:
    for spec in ("gpt:175b", "llama:405b", "unet:48,160", "amoebanet:72,512"):
        get_model(spec)
    get_model(f"gpt:layers={DECODER_LAYERS},hidden={HIDDEN},heads=128,seq={SEQ},vocab={VOCAB},ffn={FFN}")
    get_model(f"unet:{UNET_BLOCKS},{UNET_CHANNELS}")
    get_model(f"amoebanet:{AMOEBANET_LAYERS},{AMOEBANET_FILTERS}")
    with pytest.raises(ValueError, match="cap"):
        get_model(f"gpt:layers={DECODER_LAYERS + 1},hidden=64,heads=4,seq=16,vocab=10")


@pytest.mark.parametrize("spec", [
    f"gpt:layers=1,hidden={HIDDEN},heads={HIDDEN},seq={SEQ},vocab={VOCAB},ffn={FFN}",
    f"llama:layers=1,hidden={HIDDEN},heads={HIDDEN // 2},kv-heads={HIDDEN // 2},ffn={FFN},seq={SEQ},vocab={VOCAB}",
])
def test_the_widest_decoder_the_caps_allow_counts_without_overflow(spec: str) -> None:
    """Every width at its cap at once, the most heads: no tensor's bytes overflow on meta, whole or sharded."""
    model = get_model(spec)
    assert len(model.count(torch.float32)) == 3
    assert len(model.tensor_parallel(8, True).count(torch.bfloat16)) == 3


# -- a hardware file that is not a device --------------------------------------------------------------------------

def _device_text(**changes: str) -> str:
    """The catalog's A100 as a saved device, each ``key=literal`` of ``changes`` written as that JSON literal (a key
    of its roofline where the device has none)."""
    data = DEVICES["a100-80gb"].to_dict()
    text = json.dumps(data)
    for key, literal in changes.items():
        value = data[key] if key in data else data["roofline"][key]
        old = f'"{key}": {json.dumps(value)}'
        assert text.count(old) == 1
        text = text.replace(old, f'"{key}": {literal}')
    return text


@pytest.mark.parametrize(("content", "needle"), [
    ("[" * 100_000, "JSON nested too deep"),
    (_device_text(memory_bytes="1" + "0" * 400), "memory capacity (bytes) must be at most"),
    (_device_text(memory_bandwidth="1" + "0" * 400), "memory_bandwidth must be a finite number"),
    (_device_text(memory_bandwidth="Infinity"), "must be a finite number, got inf"),
    (_device_text(memory_bandwidth='"fast"'), "memory_bandwidth must be a finite number, got 'fast'"),
    (_device_text(memory_bytes="1" + "0" * 30), "must be at most"),
    (_device_text(efficiency="NaN"), "efficiency must be a finite number"),
    (_device_text(kernel_seconds="1e300"), "roofline kernel_seconds must be at most"),
    (_device_text(memory="1" + "0" * 400), "roofline memory must be a finite number"),
    (" " * (MAX_FILE_BYTES + 1), "larger than"),
    ("{not json", "not a device description"),
])
@pytest.mark.usefixtures("no_count")
def test_a_hardware_file_that_is_not_a_device_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                           content: str, needle: str) -> None:
    path = tmp_path / "device.json"
    path.write_text(content)
    out = tmp_path / "out"
    _one_line(capsys, main(_plan("gpt:125m", "--out", str(out), hardware=str(path))), str(path), needle)
    assert not out.exists()


def test_a_hardware_path_that_is_a_folder_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "device.json"
    folder.mkdir()
    _one_line(capsys, main(_plan("gpt:125m", hardware=str(folder))), "cannot read it")


def test_a_saved_device_still_loads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "device.json"
    path.write_text(_device_text())
    assert main(["plan", "--model", SMALL, "--batch", "8", "--gpus", "1", "--hardware", str(path), *QUICK]) == 0


# -- the user's function -------------------------------------------------------------------------------------------

USER = '''import torch

def needs(x):
    return torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.zeros(2, 4)

def keyword(*, width):
    return torch.nn.Sequential(torch.nn.Linear(width, 4)), torch.zeros(2, width)

def defaults(width=4, *rest, **options):
    return torch.nn.Sequential(torch.nn.Linear(width, 4)), torch.zeros(2, width)

def broken():
    return len(4)
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "um.py").write_text(USER)
    monkeypatch.chdir(tmp_path)
    return "um.py"


@pytest.mark.parametrize(("command", "function", "needle"), [
    ("plan", "needs", "um.py:needs takes arguments (x)"),
    ("plan", "keyword", "um.py:keyword takes arguments (width)"),
    ("compare", "needs", "um.py:needs takes arguments (x)"),
])
def test_a_function_that_needs_arguments_is_one_line(capsys: pytest.CaptureFixture[str], user_module: str,
                                                     tmp_path: Path, command: str, function: str,
                                                     needle: str) -> None:
    target = f"{user_module}:{function}"
    args = _plan(target) if command == "plan" else [command, target]
    before = set(tmp_path.iterdir())
    _one_line(capsys, main(args), needle, "no arguments")
    assert set(tmp_path.iterdir()) == before  # nothing written


def test_a_function_with_defaults_runs_and_an_error_inside_one_stays_the_users(
        capsys: pytest.CaptureFixture[str], user_module: str) -> None:
    base = ["plan", "--batch", "8", "--gpus", "1", "--hardware", "a100-80gb", *QUICK]
    assert main([*base, "--model", f"{user_module}:defaults"]) == 0
    capsys.readouterr()
    assert main([*base, "--model", f"{user_module}:broken"]) == 1
    err = capsys.readouterr().err
    assert "error in your code (um.py:broken): TypeError" in err and "Traceback" in err


# -- calibration threads -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [100_000, 1000, len(available_cores()) + 1, 0])
def test_more_threads_than_cores_is_refused_before_calibrating(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               threads: int) -> None:
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the calibration started")

    monkeypatch.setattr("sim.planning.costs.calibrate_device._measure", started)
    out = tmp_path / "cpu.json"
    code = main(["hardware", "--calibrate-cpu", "--threads", str(threads), "--out", str(out)])
    _one_line(capsys, code, "--threads", f"from 1 to {len(available_cores())}")
    assert not out.exists()
    check_threads(len(available_cores()))  # every core is allowed


# -- sequence parallelism (Note [sequence parallel needs ranks] in sim.planning.request) -----------------------------

def test_sequence_parallelism_at_tensor_parallel_1_is_none(capsys: pytest.CaptureFixture[str]) -> None:
    """``--tensor-parallel 1,2 --sequence-parallel on`` once exited with ``error: (1, False)``."""
    assert shard_keys([1, 2], [True]) == [(1, False), (2, True)]
    assert shard_keys([1, 2], [False, True]) == [(1, False), (2, False), (2, True)]
    assert shard_keys([1], [True]) == [(1, False)]
    code = main(["plan", "--model", SMALL, "--batch", "8", "--gpus", "2", "--hardware", "a100-80gb",
                 "--tensor-parallel", "1,2", "--sequence-parallel", "on", "--json", *QUICK])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {(r["tensor_parallel"], r["sequence_parallel"]) for r in rows} == {(1, False), (2, True)}
