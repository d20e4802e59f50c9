"""Selective recompute by modules (Note [recompute modules] in sim.planning.counting.modules): Megatron-Core's
``--recompute-modules`` of ``layernorm``, ``mla_up_proj`` and ``moe_act`` as the planner's ``modules:`` policies,
what each drops from the saved bytes and adds to the backward, and the command line's defaults and refusals."""

from __future__ import annotations

import json
import math
from functools import cache

import pytest
import torch

from gpipe.schedule import CHECKPOINT_MODES
from sim.cli import main
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.models import get_model
from sim.planning.hardware.catalog import get_device
from sim.planning.parallel.recompute import (
    check_checkpoint,
    modules_policy,
    recompute_fraction,
    schedule_checkpoint,
)
from sim.planning.request import practice_checkpoints

S, H, A = 16, 64, 4  # tokens, hidden, heads
Q_LORA, KV_LORA, ROPE, NOPE, V = 24, 16, 8, 12, 10
EXPERTS, TOP_K, EXPERT_FFN = 8, 2, 32
DEEPSEEK = (f"deepseek:layers=2,hidden={H},heads={A},ffn=96,experts={EXPERTS},top-k={TOP_K},expert-ffn={EXPERT_FFN},"
            f"seq={S},vocab=100,dense-layers=1,mtp=0,q-lora={Q_LORA},kv-lora={KV_LORA},rope-dim={ROPE},"
            f"nope-dim={NOPE},v-dim={V}")  # embedding, a dense MLA block, an MoE MLA block, head
LLAMA = f"llama:layers=2,hidden={H},heads=8,kv-heads=2,ffn=96,seq={S},vocab=100"
EVERY = "modules:layernorm+mla_up_proj+moe_act"


@cache
def _costs(spec: str = DEEPSEEK) -> FlopCosts:
    profile: ModelProfile = get_model(spec).count(torch.bfloat16)
    return FlopCosts(profile, get_device("h100-sxm"), "bf16-adam")


def _dropped(policy: str, b: int, spec: str = DEEPSEEK) -> list[int]:
    never, modules = (_costs(spec).stages([1, 1, 1, 1], b, recompute=p) for p in ("never", policy))
    return [n.saved_bytes - m.saved_bytes for n, m in zip(never, modules, strict=True)]


def test_a_policy_names_its_modules_in_one_order_and_runs_as_never() -> None:
    assert modules_policy(["moe_act", "layernorm", "moe_act"]) == "modules:layernorm+moe_act"
    assert schedule_checkpoint(EVERY) == "never" and recompute_fraction(EVERY, 4) == 0.0
    check_checkpoint(EVERY)
    for bad, needle in [("modules:rope", "unknown recompute module 'rope'"), ("some", "unknown checkpoint mode")]:
        with pytest.raises(ValueError, match=needle):
            check_checkpoint(bad)
    with pytest.raises(ValueError, match="at least one module"):
        modules_policy([])


@pytest.mark.parametrize("b", [1, 3])
def test_layernorm_drops_every_norms_output_and_statistics(b: int) -> None:
    # a Llama block: two norms of s x h outputs (BF16) and s FP32 statistics each; the head's final norm likewise
    per_norm = b * S * (2 * H + 4)
    assert _dropped("modules:layernorm", b, LLAMA) == [0, 2 * per_norm, 2 * per_norm, per_norm]
    # an MLA block: the block's two norms and the two latents' (q: r_q wide, kv: r_kv)
    latents = b * S * (2 * (Q_LORA + KV_LORA) + 2 * 4)
    assert _dropped("modules:layernorm", b)[1:3] == [2 * per_norm + latents] * 2


@pytest.mark.parametrize("b", [1, 3])
def test_mla_up_proj_drops_the_heads_queries_keys_and_values(b: int) -> None:
    qkv = b * S * A * 2 * (2 * (NOPE + ROPE) + V)  # q and k of d_n + d_r per head, v of d_v, in BF16
    latents = b * S * (2 * (Q_LORA + KV_LORA) + 2 * 4)  # the normalised latents, inside the up-projection
    dropped = _dropped("modules:mla_up_proj", b)
    assert dropped[0] == dropped[3] == 0 and dropped[1] == dropped[2]
    assert qkv + latents <= dropped[1] <= qkv + latents + b * S * A * 2 * ROPE * 2  # and RoPE's contiguous inputs


@pytest.mark.parametrize("b", [1, 3])
def test_moe_act_drops_the_experts_swiglu_output(b: int) -> None:
    capacity = math.ceil(b * S * TOP_K / EXPERTS)  # slots per expert (Note [routed tokens])
    assert _dropped("modules:moe_act", b) == [0, 0, 2 * EXPERTS * capacity * EXPERT_FFN, 0]


def test_the_modules_forward_runs_again_inside_the_backward() -> None:
    costs, b = _costs(), 2
    for policy in ("modules:layernorm", "modules:mla_up_proj", "modules:moe_act", EVERY):
        inside = costs.core_seconds(b, policy)
        never, modules = (costs.stages([1, 1, 1, 1], b, recompute=p) for p in ("never", policy))
        assert [m.backward for m in modules] == pytest.approx([n.backward + x for n, x in zip(never, inside,
                                                                                                 strict=True)])
        assert [m.forward for m in modules] == [n.forward for n in never]
        assert inside[0] == 0 and 0 < inside[2] < costs.layer_seconds(b)[0][2]
    assert costs.core_seconds(b, "modules:moe_act")[1] == 0  # the dense block has no experts
    assert sum(_dropped(EVERY, b)) > sum(_dropped("modules:mla_up_proj", b))


def test_todays_practice_adds_a_modules_policy_only_where_given_modules() -> None:
    assert practice_checkpoints(False) == (*CHECKPOINT_MODES, "layers")
    assert practice_checkpoints(False, modules=("layernorm", "moe_act"))[-1] == "modules:layernorm+moe_act"


def _plan(model: str, *flags: str) -> list[str]:
    return ["plan", "--model", model, "--batch", "4", "--gpus", "2", "--hardware", "h100-sxm", "--link", "nvlink",
            "--tensor-parallel", "1", "--chunks", "2", "--schedule", "1f1b", "--no-progress", "--json", *flags]


@pytest.mark.parametrize(("model", "flags", "policies"), [
    (DEEPSEEK, [], {"never", "except_last", "always", "layers", EVERY}),
    (LLAMA, [], {"never", "except_last", "always", "layers"}),
    (LLAMA, ["--checkpoint", "never,modules"], {"never", "modules:layernorm"}),
    (DEEPSEEK, ["--checkpoint", "modules", "--recompute-modules", "moe_act"], {"modules:moe_act"}),
])
def test_the_cli_sweeps_the_modules(capsys: pytest.CaptureFixture[str], model: str, flags: list[str],
                                    policies: set[str]) -> None:
    assert main(_plan(model, *flags)) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["checkpoint"] for r in rows} == policies


@pytest.mark.parametrize(("flags", "needle"), [
    (["--recompute-modules", "rope"], "--recompute-modules: unknown value 'rope'"),
    (["--checkpoint", "never", "--recompute-modules", "layernorm"], "add modules to --checkpoint"),
    (["--checkpoint", "modules:rope"], "--checkpoint: unknown value"),
])
def test_the_cli_refuses_unknown_modules_in_one_line(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                     needle: str) -> None:
    assert main(_plan(DEEPSEEK, *flags)) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("gpipe-sim plan: error: ") and len(err.strip().splitlines()) == 1
