"""Recompute per layer (Megatron-LM's full recompute) and selective recompute of the attention core.

The closed forms are Korthikanti et al. (2022)'s, in 16 bits with the math attention: a layer under ``layers``
keeps its input, ``2·s·b·h`` bytes; under ``selective`` it keeps ``s·b·h·(10 + 24/t)``, the whole layer's less the
core's ``5·a·s²·b/t``. The counter sees ``16·s·b`` bytes more per layer, the two LayerNorms' fp32 statistics.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
import torch

from sim.cli import main
from sim.core.link import LinkSpec
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_device
from sim.planning.parallel.recompute import core_table, schedule_checkpoint
from sim.planning.plan import PlanRequest, plan

H, A, S, V = 256, 8, 128, 1000
SMALL = f"gpt:layers=2,hidden={H},heads={A},seq={S},vocab={V},attention=math"  # Korthikanti et al.'s attention
LINK = LinkSpec("test-link", 1e-6, 1e11)


@cache
def _profile(t: int, spec: str = SMALL) -> ModelProfile:
    shard = get_model(spec).tensor_parallel(t)
    profile = count_layers(shard.module("meta"), shard.sample(2, "meta"), dtype=torch.float16)
    assert shard.attention_core is not None
    return replace(profile, attention_core=shard.attention_core(2))


def _costs(t: int) -> FlopCosts:
    return FlopCosts(_profile(t), get_device("a100-80gb"), "fp16-adam", tensor_link=LINK)


def test_policies_run_as_the_schedules_modes() -> None:
    assert [schedule_checkpoint(p) for p in ("never", "except_last", "always", "layers", "selective")] == \
        ["never", "except_last", "always", "always", "never"]
    with pytest.raises(ValueError, match="unknown checkpoint mode 'some'"):
        schedule_checkpoint("some")


@pytest.mark.parametrize("t", [1, 2, 4])
def test_layers_keep_each_blocks_input_and_hold_one_block_while_it_recomputes(t: int) -> None:
    b = 3
    block = _profile(t).at(b)[1]
    stage = _costs(t).stages([1, 2, 1], b, recompute="layers")[1]  # the two blocks
    assert stage.checkpoint_bytes == 2 * (2 * S * b * H)
    assert stage.saved_bytes == block.saved_bytes - 2 * S * b * H  # its input is the kept copy
    never = _costs(t).stages([1, 2, 1], b)[1]
    assert (never.forward, never.backward) == (stage.forward, stage.backward)  # R recomputes the whole forward


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("b", [2, 3])
def test_selective_keeps_the_layer_less_the_attention_core(t: int, b: int) -> None:
    stage = _costs(t).stages([1, 2, 1], b, recompute="selective")[1]
    assert stage.saved_bytes == 2 * (S * b * H * (10 + 24 / t) + 16 * S * b)
    never = _costs(t).stages([1, 2, 1], b)[1]
    assert never.saved_bytes - stage.saved_bytes == 2 * 5 * A * S * S * b / t


def test_selective_recomputes_the_cores_forward_in_the_backward() -> None:
    costs, b = _costs(2), 3
    core = costs.core_seconds(b)
    assert core[0] == core[3] == 0 and core[1] == core[2] > 0  # embedding and head have no core
    fwd, bwd = costs.layer_seconds(b)
    assert core[1] < 0.5 * fwd[1]
    never, selective = (costs.stages([1, 2, 1], b, recompute=r)[1] for r in ("never", "selective"))
    assert selective.backward == pytest.approx(never.backward + 2 * core[1])
    assert selective.forward == never.forward
    table = core_table(_profile(2).layers[1].forward, _profile(2).attention_core)  # type: ignore[arg-type]
    assert table.flops_at(b).sum() >= 2 * 2 * b * S * S * H / 2  # QK^T and @V of this rank's heads


def test_a_llama_block_has_a_core_of_its_softmax() -> None:
    spec = "llama:layers=1,hidden=128,heads=8,kv-heads=2,ffn=256,seq=16,vocab=100,attention=math"
    profile = _profile(2, spec)
    costs = FlopCosts(profile, get_device("a100-80gb"), "fp16-adam", tensor_link=LINK)
    never, selective = (costs.stages([1, 1, 1], 2, recompute=r)[1] for r in ("never", "selective"))
    assert never.saved_bytes - selective.saved_bytes == 2 * (8 // 2) * 16 * 16 * 2  # softmax output, 16 bits
    assert costs.core_seconds(2)[1] > 0


def _plan(checkpoint: str, device: object = "a100-80gb", t: int = 2, batch: int = 8) -> object:
    return plan(PlanRequest(profile={t: _profile(t)}, batch=batch, device=device, gpus=[2 * t], link="nvlink3",
                            training="fp16-adam", chunks=[4], checkpoints=[checkpoint], schedules=["1f1b"], stages=[2],
                            tensor_parallel=(t,)))


def test_the_peak_under_layers_is_the_kept_inputs_and_one_block() -> None:
    row = _plan("layers").rows[0]  # type: ignore[attr-defined]
    assert row.checkpoint == "layers" and row.balance == (2, 2)
    costs = _costs(2)
    stages = costs.stages(row.balance, row.microbatch, recompute="layers")
    # 1F1B on 2 devices: device 0 has 2 micro-batches in flight at its first backward, and recomputes one block
    part = row.memory_parts[0]
    assert part.saved == 2 * stages[0].checkpoint_bytes + stages[0].saved_bytes
    assert stages[0].saved_bytes == _profile(2).at(2)[1].saved_bytes - 2 * S * 2 * H


def test_a_plan_fits_under_selective_and_not_under_never() -> None:
    device = get_device("a100-80gb")
    never, selective = (_plan(c, batch=64).rows[0] for c in ("never", "selective"))  # type: ignore[attr-defined]
    assert selective.peak_memory_bytes < never.peak_memory_bytes
    assert selective.step_seconds > never.step_seconds  # the core's forward runs again
    small = replace(device, memory_bytes=(selective.peak_memory_bytes + never.peak_memory_bytes) // 2)
    assert _plan("selective", small, batch=64).rows[0].fits  # type: ignore[attr-defined]
    assert not _plan("never", small, batch=64).rows[0].fits  # type: ignore[attr-defined]


def test_layers_refuses_torchgpipes_copy_streams() -> None:
    with pytest.raises(ValueError, match="checkpoint layers .* runs with one copy stream"):
        plan(PlanRequest(profile=_profile(1), batch=8, device="a100-80gb", gpus=[2], link="nvlink3",
                         training="fp16-adam", checkpoints=["layers"], copy_streams="per_microbatch"))


def test_selective_needs_an_attention_core() -> None:
    bare = replace(_profile(1), attention_core=None)
    with pytest.raises(ValueError, match="checkpoint selective recomputes the attention core"):
        plan(PlanRequest(profile=bare, batch=8, device="a100-80gb", gpus=[2], link="nvlink3", training="fp16-adam",
                         checkpoints=["selective"]))


def test_the_cli_plans_per_layer_recompute(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", SMALL, "--batch", "8", "--gpus", "4", "--hardware", "a100-80gb",
                 "--link", "nvlink", "--tensor-parallel", "2", "--stages", "2", "--chunks", "4",
                 "--checkpoint", "layers,selective", "--schedule", "1f1b", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert " layers " in out and " selective " in out
    assert main(["plan", "--model", SMALL, "--batch", "8", "--gpus", "2", "--hardware", "a100-80gb",
                 "--checkpoint", "sometimes", "--no-progress"]) == 2
    assert "unknown value 'sometimes'" in capsys.readouterr().err
