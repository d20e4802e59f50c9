"""The planner with a mixture of experts: the command line's refusals (one line, exit 2, before anything is counted),
the expert-parallel sweep and its rows (the all-to-all's seconds, those exposed), the experts' model state sharded
over the expert-data-parallel group, and dense models as they were."""

from __future__ import annotations

import json
from functools import cache

import pytest
import torch

from sim.cli import main
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.models import get_model
from sim.planning.parallel.experts import Routing, sharded_state_of_experts
from sim.planning.plan import PlanRequest, plan

MOE = "mixtral:layers=4,hidden=256,heads=8,kv-heads=2,ffn=512,experts=8,top-k=2,seq=128,vocab=1000"
ROUTING = Routing(8, 2)
DENSE = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"


def _plan(model: str, *flags: str) -> list[str]:
    return ["plan", "--model", model, "--batch", "16", "--gpus", "16", "--hardware", "h100-sxm", "--link", "nvlink",
            "--network", "infiniband-ndr", "--tensor-parallel", "1", "--no-progress", *flags]


@pytest.fixture
def no_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a model is built or counted."""
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the count started")

    monkeypatch.setattr("sim.planning.counting.models.ModelSpec.module", started)
    monkeypatch.setattr("sim.planning.counting.models.ModelSpec.count", started)
    monkeypatch.setattr("sim.cli.plan.count_layers", started)


@pytest.mark.usefixtures("no_count")
@pytest.mark.parametrize(("model", "flags", "needle"), [
    (MOE, ["--expert-parallel", "3"], "expert parallel 3 does not divide the model's 8 routed experts"),
    (MOE, ["--expert-parallel", "0"], "expert parallel degrees are integers >= 1"),
    (MOE, ["--expert-parallel", "8", "--stages", "4"], "does not fold onto the GPUs of a stage"),
    (MOE, ["--expert-imbalance", "0.5"], "a number >= 1, got 0.5"),
    (MOE, ["--expert-imbalance", "nan"], "--expert-imbalance must be a finite number"),
    (MOE, ["--expert-parallel", "8", "--node-limit", "4"], "--node-limit 4 is more nodes than an expert-parallel "
                                                           "group spans (1 of 8 GPUs at the most)"),
    (MOE, ["--node-limit", "0"], "--node-limit must be >= 1"),
    (MOE, ["--expert-tensor-parallel", "2"], "expert tensor parallel degrees are 1 or a tensor-parallel degree"),
    (DENSE, ["--expert-parallel", "2"], "this model has none"),
    (DENSE, ["--node-limit", "2"], "--node-limit routes a mixture of experts' tokens; this model has none"),
])
def test_bad_expert_flags_are_refused_in_one_line_before_counting(capsys: pytest.CaptureFixture[str], model: str,
                                                                   flags: list[str], needle: str) -> None:
    code = main(_plan(model, *flags))
    out = capsys.readouterr()
    assert code == 2, out.err
    assert len(out.err.strip().splitlines()) == 1 and not out.out, out.err
    assert needle in out.err and out.err.startswith("gpipe-sim plan: error: ")


@cache
def _counts(ep: int) -> ModelProfile:
    return get_model(MOE).expert_parallel(ep).count(torch.bfloat16)


def _request(eps: tuple[int, ...], schedules: tuple[str, ...] = ("1f1b",), **kwargs: object) -> PlanRequest:
    return PlanRequest(profile={(1, False, ep, 1): _counts(ep) for ep in eps}, batch=64, device="h100-sxm",
                       gpus=[16], link="nvlink", network="infiniband-ndr", gpus_per_node=4, training="bf16-adam",
                       tensor_parallel=[1], stages=[2], zero=[1], checkpoints=["never"], chunks=[4],
                       schedules=schedules, tokens_per_sample=128, routing=ROUTING, expert_parallel=eps,
                       **kwargs)  # type: ignore[arg-type]


def test_the_sweep_prices_each_expert_parallel_degree_and_its_all_to_all() -> None:
    rows = {r.expert_parallel: r for r in plan(_request((1, 2, 8)), workers=1).rows}
    assert set(rows) == {1, 2, 8}
    assert rows[1].all_to_all_seconds == 0.0
    assert 0 < rows[2].all_to_all_seconds
    assert rows[8].all_to_all_seconds > rows[2].all_to_all_seconds  # 8 ranks over 2 nodes of 4: the network
    # without pairs every all-to-all second waits
    assert rows[8].all_to_all_exposed_seconds == pytest.approx(rows[8].all_to_all_seconds)


def test_an_overlapped_pair_hides_what_1f1b_pays_in_line() -> None:
    rows = {r.schedule: r for r in plan(_request((8,), ("1f1b", "dualpipe-v", "dualpipe"), virtual=[2]),
                                        workers=1).rows}
    line = rows["1f1b"]
    assert line.all_to_all_exposed_seconds == pytest.approx(line.all_to_all_seconds)
    for pairs in (rows["dualpipe-v"], rows["dualpipe"]):
        assert pairs.all_to_all_seconds == pytest.approx(line.all_to_all_seconds)  # the same tasks, the same bytes
        assert pairs.all_to_all_exposed_seconds < pairs.all_to_all_seconds


def test_dualpipe_holds_two_copies_of_its_stages() -> None:
    rows = {r.schedule: r for r in plan(_request((8,), ("1f1b", "dualpipe"), virtual=[2]), workers=1).rows}
    one, two = rows["1f1b"], rows["dualpipe"]
    assert len(two.balance) == two.stages and two.virtual == 2
    # device d holds stage d and a copy of stage p - 1 - d
    assert two.model_state_bytes[0] == one.model_state_bytes[0] + one.model_state_bytes[1]


def test_the_experts_state_shards_over_the_expert_data_parallel_group() -> None:
    ep = 8  # 2 stages of 8 GPUs: EP 8 folds onto a stage's 8 replicas, one expert-data-parallel rank each
    (row,) = plan(_request((ep,)), workers=1).rows
    profile, training = _counts(ep), _request((ep,)).policy
    layers = profile.layers[:row.balance[0]]
    params, experts = sum(x.parameters for x in layers), sum(x.expert_parameters for x in layers)
    assert experts > 0
    state = sharded_state_of_experts(params * training.weight_bytes, params * training.gradient_bytes,
                                     params * training.optimizer_bytes, params, experts, training, 1, 8, 1)
    assert row.model_state_bytes[0] == state.total
    dense_only = sharded_state_of_experts(params * training.weight_bytes, params * training.gradient_bytes,
                                          params * training.optimizer_bytes, params, 0, training, 1, 8, 1)
    assert row.model_state_bytes[0] > dense_only.total  # the experts' optimizer state is not split 8 ways


def test_the_table_states_the_imbalance_and_the_all_to_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_plan(MOE, "--expert-parallel", "1,4", "--schedule", "1f1b", "--chunks", "2", "--checkpoint",
                      "never", "--zero", "1", "--stages", "2")) == 0
    out = capsys.readouterr().out
    assert "expert imbalance 1 (balanced routing)" in out
    header = next(line for line in out.splitlines() if "gpus" in line and "sched" in line)
    assert "ep" in header.split() and "a2a (s)" in header and "exposed" in header
    assert main(_plan(MOE, "--expert-parallel", "4", "--schedule", "1f1b", "--chunks", "2", "--checkpoint", "never",
                      "--stages", "2", "--expert-imbalance", "1.5", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["expert_imbalance"] == 1.5
    assert {r["expert_parallel"] for r in result["rows"]} == {4}
    assert all(r["all_to_all_seconds"] > 0 for r in result["rows"] if r["simulated"])


def test_a_dense_model_plans_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_plan(DENSE, "--schedule", "1f1b", "--chunks", "2", "--checkpoint", "never", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["expert_imbalance"] is None
    assert all(r["expert_parallel"] == 1 and r["all_to_all_seconds"] == 0.0 for r in result["rows"])
    assert main(_plan(DENSE, "--schedule", "1f1b", "--chunks", "2", "--checkpoint", "never")) == 0
    assert "a2a" not in capsys.readouterr().out


def test_a_request_needs_the_count_of_each_expert_parallel_degree() -> None:
    with pytest.raises(ValueError, match="expert parallel 4 x 1 needs the count of one rank's shard") as error:
        PlanRequest(profile={(1, False, 4, 1): _counts(8)}, batch=64, device="h100-sxm", gpus=[16],  # counted at EP 8
                    training="bf16-adam",
                    routing=ROUTING, expert_parallel=[4])
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="routing needs experts an integer >= 1"):
        Routing(0, 1)
