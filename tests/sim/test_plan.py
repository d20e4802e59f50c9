"""The planner and its CLI: balance, memory fit, the best row, model state per parameter, errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES
from sim.cli import main
from sim.planning.costs.efficiency import effective_efficiency
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import ModelProfile, count_layers
from sim.planning.counting.models.gpt import GPTConfig, gpt, gpt_sample
from sim.planning.counting.training import TRAINING, training_policy
from sim.planning.hardware.catalog import DeviceSpec, get_device, get_link
from sim.planning.plan import PlanRequest, block_partition, default_training, plan, resolve_link

LAID_OUT = set(SCHEDULES)  # the sweep lays out every registered schedule, DualPipe's copies too

MiB = 2**20


def _mlp(layers: int = 8, width: int = 512) -> nn.Sequential:
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)])


@pytest.fixture(scope="module")
def mlp_profile() -> ModelProfile:
    return count_layers(_mlp(), torch.randn(2, 512))


SMALL = DeviceSpec("small", {"fp32": 10e12}, 500e9, 24 * MiB, efficiency=0.5)


def test_block_partition_takes_the_sweeps_arrays_and_names_bad_input() -> None:
    assert block_partition(np.array([3.0, 1, 1, 2, 2, 1, 4]), 3) == (3, 3, 1)
    with pytest.raises(ValueError, match="at most one partition per layer"):
        block_partition([1.0, 2.0], 3)
    with pytest.raises(ValueError, match="non-negative finite"):
        block_partition(np.array([1.0, -2.0]), 1)


def test_planner_picks_the_fastest_configuration_that_fits(mlp_profile: ModelProfile) -> None:
    # 8 x 512^2 parameters x 16 bytes (fp32 Adam) = 32 MiB of model state: one 24 MiB device is too small
    result = plan(PlanRequest(profile=mlp_profile, batch=256, device=SMALL, gpus=[1, 2, 4], link=get_link("pcie4-x16"),
                              training="fp32-adam"))
    best = result.best
    assert best is not None and best.fits
    assert sum(r.best for r in result.rows) == 1
    assert best.throughput == max(r.throughput for r in result.rows if r.fits)
    assert any(not r.fits for r in result.rows)
    assert all(not r.fits for r in result.rows if r.stages == 1)  # a whole replica holds the model
    for r in result.rows:
        assert sum(r.balance) == len(mlp_profile)
        assert len(r.balance) == r.stages * r.virtual // SCHEDULES[r.schedule].copies
        assert r.gpus == r.stages * r.replicas
        assert r.fits == all(m <= SMALL.memory_bytes for m in r.memory_bytes)
        assert r.simulated == r.fits  # Note [not simulated]: a step that cannot run has no time
        if r.fits:
            assert r.throughput == pytest.approx(256 / r.step_seconds)
        else:
            assert math.isnan(r.throughput) and math.isnan(r.step_seconds) and r.bound == "memory"
    assert {r.schedule for r in result.rows} == LAID_OUT  # every registered schedule the sweep lays out
    assert {r.checkpoint for r in result.rows} == {"never", "except_last", "always"}


def test_checkpointing_trades_time_for_memory(mlp_profile: ModelProfile) -> None:
    roomy = replace(SMALL, memory_bytes=64 * MiB)  # both fit, so both are simulated
    result = plan(PlanRequest(profile=mlp_profile, batch=64, device=roomy, gpus=[2], link="pcie4-x16",
                              training="fp32-adam", chunks=[8], stages=[2], schedules=["gpipe"]))
    by = {r.checkpoint: r for r in result.rows}
    assert by["always"].fits and by["never"].fits
    assert by["always"].step_seconds > by["never"].step_seconds
    assert max(by["always"].activation_bytes) < max(by["never"].activation_bytes)


def test_price_gives_cost_per_million_samples(mlp_profile: ModelProfile) -> None:
    result = plan(PlanRequest(profile=mlp_profile, batch=64, device=SMALL, gpus=[2, 4], link="pcie4-x16",
                              training="fp32-adam", price_per_gpu_hour=2.5, chunks=[4], objective="cost"))
    for r in result.rows:  # a configuration that does not fit has no speed, so no cost (Note [not simulated])
        assert r.cost_per_million == (pytest.approx(r.gpus * 2.5 / 3600 * 1e6 / r.throughput) if r.fits else None)
    best = result.best
    assert best is not None
    assert best.cost_per_million == min(r.cost_per_million or 0 for r in result.rows if r.fits)


def test_progress_bar_is_optional(mlp_profile: ModelProfile, capsys: pytest.CaptureFixture[str]) -> None:
    plan(PlanRequest(profile=mlp_profile, batch=8, device=SMALL, gpus=[2], link="pcie4-x16", training="fp32-adam",
                     chunks=[2]), progress=True)
    assert "simulating" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["fp16-adam", "bf16-adam"])
def test_mixed_precision_adam_keeps_16_to_18_bytes_per_parameter(policy: str) -> None:
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=64, seq_len=32, vocab_size=100)
    training = training_policy(policy)
    with torch.device("meta"):
        model = gpt(cfg)
    profile = count_layers(model, gpt_sample(cfg, 1), dtype=training.torch_dtype)
    stages = FlopCosts(profile, get_device("a100-80gb"), training).stages((2, 2), 1)
    per_param = sum(s.model_state_bytes for s in stages) / profile.parameters
    assert 16 <= per_param <= 18
    assert sum(s.parameter_bytes for s in stages) == profile.parameters * 6  # fp16 copy + fp32 master


def test_training_policies() -> None:
    assert TRAINING["fp32-sgd"].model_state_bytes_per_parameter == 8
    assert TRAINING["fp32-adam"].model_state_bytes_per_parameter == 16
    for name in ("fp16-adam-fp32grad", "bf16-adam-fp32grad"):  # Megatron-LM's: 2 + 4 + 4 + 4 + 4 bytes
        policy = training_policy(name)
        assert policy.model_state_bytes_per_parameter == 18 and policy.gradient_bytes == 4
        assert policy.weight_bytes == 6 and policy.torch_dtype.itemsize == 2
    assert default_training(get_device("h100-sxm")).name == "bf16-adam"
    assert default_training(get_device("tesla-p40")).name == "fp32-adam"
    with pytest.raises(KeyError, match="known"):
        training_policy("int4-lion")


def test_efficiency_falls_for_small_kernels() -> None:
    h100 = get_device("h100-sxm")
    small, large = (effective_efficiency(h100, f, "bf16") for f in (1e6, 1e13))
    assert small < 0.1 * h100.efficiency
    assert large == pytest.approx(h100.efficiency, rel=0.01)


def test_throughput_per_sample_falls_for_small_micro_batches() -> None:
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=256, seq_len=64, vocab_size=1000)
    with torch.device("meta"):
        model = gpt(cfg)
    costs = FlopCosts(count_layers(model, gpt_sample(cfg, 1)), get_device("a100-80gb"), "fp32-adam")
    per_sample = [sum(map(float, (f.sum(), b.sum()))) / mb for mb in (1, 8, 64)
                  for f, b in [costs.layer_seconds(mb)]]
    assert per_sample[0] > per_sample[1] > per_sample[2]


def test_stage_costs_from_counts(mlp_profile: ModelProfile) -> None:
    costs = FlopCosts(mlp_profile, SMALL, "fp32-adam")
    first, second = costs.stages((3, 5), 16)
    assert first.checkpoint_bytes == 16 * 512 * 4  # the input batch
    assert first.send_bytes == second.checkpoint_bytes == 16 * 512 * 4
    assert first.forward > 0 and first.backward > first.forward
    with pytest.raises(ValueError, match="covers"):
        costs.stages((3, 3), 16)


def test_links_resolve_by_family() -> None:
    assert resolve_link("nvlink", get_device("h100-sxm")).name == "nvlink4"
    assert resolve_link("nvlink", get_device("a100-40gb")).name == "nvlink3"
    assert resolve_link("pcie", get_device("tesla-p40")).name == "pcie3-x16"
    with pytest.raises(KeyError, match="no nvlink"):
        resolve_link("nvlink", get_device("tesla-p40"))
    with pytest.raises(KeyError, match="unknown link"):
        resolve_link("carrier-pigeon", get_device("h100-sxm"))


def test_plan_errors(mlp_profile: ModelProfile) -> None:
    with pytest.raises(ValueError, match="smaller than the number of chunks"):
        plan(PlanRequest(profile=mlp_profile, batch=4, device=SMALL, gpus=[2], training="fp32-adam", chunks=[8]))
    with pytest.raises(ValueError, match="at least one GPU"):
        plan(PlanRequest(profile=mlp_profile, batch=4, device=SMALL, gpus=[0], training="fp32-adam"))
    with pytest.raises(KeyError, match="unknown device"):
        plan(PlanRequest(profile=mlp_profile, batch=4, device="tpu-v9", gpus=[1]))
    with pytest.raises(ValueError, match="counted in 32-bit"):
        plan(PlanRequest(profile=mlp_profile, batch=4, device="h100-sxm", gpus=[1], training="bf16-adam"))
    with pytest.raises(ValueError, match="unknown schedule 'zb-w'"):
        plan(PlanRequest(profile=mlp_profile, batch=4, device=SMALL, gpus=[2], training="fp32-adam",
                         schedules=["zb-w"]))


def test_a_request_is_checked_when_built_and_holds_tuples(mlp_profile: ModelProfile) -> None:
    request = PlanRequest(profile={1: mlp_profile}, batch=64, device=SMALL, gpus=[2, 4], training="fp32-adam",
                          chunks=[4], balance=[4, 4])
    assert (request.gpus, request.chunks, request.balance, request.checkpoints) == ((2, 4), (4,), (4, 4),
                                                                                      CHECKPOINT_MODES)
    assert request == replace(request) and hash(request) == hash(replace(request))  # frozen, hashable
    with pytest.raises(ValueError, match="at least one GPU"):
        replace(request, gpus=[0])  # a changed request is checked again
    with pytest.raises(TypeError, match="gpus takes a list, got 4"):
        PlanRequest(profile=mlp_profile, batch=64, device=SMALL, gpus=4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="checkpoints takes a list, got 'never'"):
        PlanRequest(profile=mlp_profile, batch=64, device=SMALL, gpus=[2], checkpoints="never")
    with pytest.raises(TypeError, match="plan takes a PlanRequest"):
        plan(mlp_profile)  # type: ignore[arg-type]


# -- the CLI -------------------------------------------------------------------------------------------

MODEL_FILE = '''
import torch
from torch import nn

def build():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()), torch.randn(4, 64)
'''


def test_cli_plans_a_users_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mymodel.py"
    path.write_text(MODEL_FILE)
    out = tmp_path / "out"
    code = main(["plan", "--model", f"{path}:build", "--batch", "32", "--gpus", "1,2", "--hardware", "a100-80gb",
                 "--link", "nvlink", "--price", "2.5", "--chunks", "1,4", "--zero", "0", "--json", "--out", str(out)])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"] == "a100-80gb" and doc["link"] == "nvlink3" and doc["training"] == "bf16-adam"
    one_per_device = [r for r in doc["rows"] if r["schedule"] in ("gpipe", "1f1b")]
    # (gpus, stages) x chunks x sched x ckpt: a user's model is swept with per-layer recompute, not selective
    assert {r["checkpoint"] for r in doc["rows"]} == {"always", "except_last", "never", "layers"}
    assert doc["best"]["fits"] and len(one_per_device) == 3 * 2 * 2 * 4
    assert {r["schedule"] for r in doc["rows"]} == LAID_OUT
    written = {"plan.json", "throughput.png", "memory.png", "best.trace.json"}  # the best row's timeline too
    assert {p.name for p in out.iterdir()} == written | {".gpipe-sim.json"}
    assert set(json.loads((out / ".gpipe-sim.json").read_text())["files"]) == written  # sim.files


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "gpt:125m", "--batch", "8", "--gpus", "2", "--hardware", "h100-sxm",
                 "--link", "nvlink", "--chunks", "2", "--schedule", "1f1b", "--checkpoint", "never", "--price", "3"])
    assert code == 0
    text = capsys.readouterr().out
    assert "best: 2 GPUs" in text and "$/M samp" in text
    assert sum(line.startswith("*") for line in text.splitlines()) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "vgg16"], "unknown model 'vgg16'"),
    (["--hardware", "tpu-v9"], "unknown device 'tpu-v9'"),
    (["--batch", "4", "--chunks", "8"], "batch 4 is smaller than the number of chunks (8)"),
    (["--gpus", "0"], "need at least one GPU"),
    (["--gpus", "two"], "--gpus takes comma-separated integers"),
    (["--model", "no_such_module:build"], "cannot import 'no_such_module'"),
    (["--link", "carrier-pigeon"], "unknown link 'carrier-pigeon'"),
])
def test_cli_bad_input_is_one_line_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--model": "gpt:125m", "--batch": "64", "--gpus": "1,2", "--hardware": "h100-sxm"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    argv = ["plan"] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("gpipe-sim plan: error:")


@pytest.mark.slow
def test_torchgpipe_resnet101_speedups_within_10_percent() -> None:
    """benchmarks/published.py: one efficiency calibrated on the baseline, every speed-up predicted."""
    from benchmarks import published

    table = published.resnet_table()
    assert table["calibrated_efficiency"] == 0.859  # the catalog P40, set once (Note [roofline sources])
    for row in table["rows"]:
        assert abs(row["error"]) <= published.TOLERANCE, row
