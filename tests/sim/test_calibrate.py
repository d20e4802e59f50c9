"""Calibration: a tiny model's cost model has exact bytes and positive times; overheads are sane."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from sim.calibration.calibrate import calibrate, calibrate_overheads, partitions_of
from sim.calibration.host import ExecutorStage, Overheads, executor_costs, with_overheads
from sim.calibration.primitives import measure_contention, measure_handoff, measure_task_overhead
from sim.core.cost import CostModel, StageCost

F32 = 4  # bytes per float32
BATCH = 4


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_cost_model_shape_and_exact_bytes() -> None:
    model = _model()
    cost = calibrate(model, [2, 1], torch.randn(BATCH, 8), warmup=1, repeats=3)
    assert isinstance(cost, CostModel) and cost.n == 2
    first, last = cost.stages
    # Stage 0, Linear(8, 16) + ReLU on a data input: Linear keeps its input, ReLU its output.
    assert first.send_bytes == BATCH * 16 * F32
    assert first.saved_bytes == BATCH * 8 * F32 + BATCH * 16 * F32
    assert first.checkpoint_bytes == BATCH * 8 * F32
    assert first.parameter_bytes == first.gradient_bytes == (8 * 16 + 16) * F32
    # Stage 1, Linear(16, 4): keeps its input (which requires grad: it came from stage 0).
    assert last.send_bytes == BATCH * 4 * F32
    assert last.saved_bytes == BATCH * 16 * F32
    assert last.checkpoint_bytes == BATCH * 16 * F32
    assert last.parameter_bytes == last.gradient_bytes == (16 * 4 + 4) * F32


def test_times_are_positive_and_both_forwards_are_there() -> None:
    cost = calibrate(_model(), [1, 2], torch.randn(BATCH, 8), warmup=1, repeats=3)
    for stage in cost.stages:
        assert stage.forward > 0 and stage.backward > 0 and stage.recompute_seconds > 0
        assert stage.forward_checkpointed is not None and stage.forward_checkpointed > 0
        assert stage.forward_seconds(checkpointed=False) == stage.forward
        assert stage.forward_seconds(checkpointed=True) == stage.forward_checkpointed
        assert stage.recompute_seconds == stage.forward


def test_recorded_calibration_is_for_a_recording_executor_only() -> None:
    plain = calibrate(_model(), [1, 2], torch.randn(BATCH, 8), warmup=0, repeats=2)
    assert all(s.forward_recorded is None and s.backward_recorded is None for s in executor_costs(plain).stages)
    recorded = calibrate(_model(), [1, 2], torch.randn(BATCH, 8), warmup=0, repeats=2, recorded=True)
    for stage in executor_costs(recorded).stages:
        assert stage.forward_recorded is not None and stage.forward_recorded > 0
        assert stage.backward_recorded is not None and stage.backward_recorded > 0
    with pytest.raises(ValueError, match="backward_recorded"):
        ExecutorStage(backward_recorded=-1.0)


def test_calibration_leaves_the_model_alone() -> None:
    model = _model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    calibrate(model, [3], torch.randn(BATCH, 8), warmup=0, repeats=1)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_the_simulator_accepts_the_calibrated_model() -> None:
    from gpipe.schedule import gpipe
    from sim.core.engine import simulate

    cost = calibrate(_model(), [2, 1], torch.randn(BATCH, 8), warmup=0, repeats=2)
    timeline = simulate(gpipe(4, 2, "except_last"), with_overheads(cost, Overheads(task=1e-6)))
    assert timeline.makespan > 0


def test_stage_cost_forward_checkpointed_defaults_to_forward() -> None:
    stage = StageCost(2.0, 3.0)
    assert stage.forward_checkpointed is None
    assert stage.forward_seconds(checkpointed=True) == stage.forward_seconds(checkpointed=False) == 2.0
    assert StageCost(2.0, 3.0, forward_checkpointed=1.5).forward_seconds(checkpointed=True) == 1.5
    with pytest.raises(ValueError, match="forward_checkpointed"):
        StageCost(2.0, 3.0, forward_checkpointed=-1.0)


def test_partitions_share_the_layers() -> None:
    model = _model()
    parts = partitions_of(model, [1, 2])
    assert [len(p) for p in parts] == [1, 2]
    assert parts[0][0] is model[0] and parts[1][1] is model[2]


@pytest.mark.parametrize(("balance", "match"),
                         [([2, 2], "sums to 4"), ([3, 0], "positive integers"), ([], "non-empty")])
def test_bad_balance(balance: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        calibrate(_model(), balance, torch.randn(BATCH, 8))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="2 devices for 1 partitions"):
        calibrate(_model(), [3], torch.randn(BATCH, 8), devices=["cpu", "cpu"])
    with pytest.raises(TypeError, match="nn.Sequential"):
        calibrate(nn.Linear(8, 4), [1], torch.randn(BATCH, 8))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2 workers"):
        measure_contention(1)
    with pytest.raises(ValueError, match="repeats"):
        measure_handoff(0)


def test_overheads_are_finite_and_non_negative() -> None:
    threads = torch.get_num_threads()
    overheads = calibrate_overheads(workers=2, repeats=50)
    assert torch.get_num_threads() == threads  # the intra-op setting is restored
    for value in (overheads.task, overheads.handoff, overheads.contention):
        assert math.isfinite(value) and value >= 0
    assert overheads.task < 1.0 and overheads.handoff < 1.0  # microseconds, not seconds (load stretches them)
    assert calibrate_overheads(repeats=5, contention=False).contention == 0.0
    assert measure_task_overhead(5) >= 0


def test_the_simulator_bills_a_checkpointed_forward_at_its_no_grad_time() -> None:
    from gpipe.schedule import Op, Task, gpipe
    from sim.core.engine import simulate

    cost = CostModel((StageCost(2.0, 3.0, forward_checkpointed=1.0),))
    timeline = simulate(gpipe(2, 1, "except_last"), cost)
    assert timeline.span_of(Task(Op.F, 0, 0)).duration == 1.0  # checkpointed: no-grad forward
    assert timeline.span_of(Task(Op.F, 1, 0)).duration == 2.0  # the last micro-batch is not
    assert timeline.span_of(Task(Op.R, 0, 0)).duration == 2.0  # a recompute records the graph


def test_issue_seconds_only_on_cuda() -> None:
    """Note [issue seconds]: on CPU the host runs the work, so the profiler's issue seconds are its seconds and
    the cost model leaves them out (a CPU device is synchronous); on CUDA they are the host's share."""
    from gpipe.profiling.profile import profile_blocks

    (p,) = profile_blocks([_model()], torch.randn(BATCH, 8), warmup=0, repeats=2, recorded=True)
    assert p.forward_issue_seconds == p.forward_seconds and p.backward_issue_seconds == p.backward_seconds
    assert p.forward_nograd_issue_seconds == p.forward_nograd_seconds
    assert p.forward_recorded_issue_seconds == p.forward_recorded_seconds
    cost = calibrate(_model(), [1, 2], torch.randn(BATCH, 8), warmup=0, repeats=2, recorded=True)
    assert all(s.issue_forward == s.issue_nograd == s.issue_backward == 0.0 for s in executor_costs(cost).stages)
    with pytest.raises(ValueError, match="issue_nograd"):
        ExecutorStage(issue_nograd=math.inf)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_issue_seconds_on_cuda() -> None:
    cost = calibrate(_model(), [1, 2], torch.randn(BATCH, 8), devices=["cuda:0", "cuda:0"], warmup=1, repeats=3,
                     recorded=True)
    for stage in executor_costs(cost).stages:
        assert stage.issue_forward > 0 and stage.issue_nograd > 0 and stage.issue_backward > 0


# -- models the executor runs that calibration must run too --------------------------------------------


def _no_parameters() -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Tanh(), nn.Sigmoid(), nn.ReLU())


def _in_place_first() -> nn.Sequential:
    """Partition 1 of balance (1, 2) starts with an in-place ReLU (Note [entering a partition] in
    gpipe.interpreter.worker)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))


def test_a_partition_that_starts_in_place_calibrates() -> None:
    model = _in_place_first()
    cost = calibrate(model, [1, 2], torch.randn(BATCH, 8), warmup=0, repeats=1, recorded=True)
    plain = calibrate(nn.Sequential(model[0], nn.ReLU(), model[2]), [1, 2], torch.randn(BATCH, 8), warmup=0,
                      repeats=1, recorded=True)
    assert [s.saved_tensors for s in executor_costs(cost).stages] == [s.saved_tensors
                                                                      for s in executor_costs(plain).stages]
    assert all(s.forward_recorded is not None and s.forward_recorded > 0 for s in executor_costs(cost).stages)


class _DoubleInPlace(nn.Module):
    """An in-place first layer that is not idempotent: a run on an input it changed before shows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)


def test_pair_runners_run_a_partition_that_starts_in_place() -> None:
    from sim.calibration.pairs import task_runners

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), _DoubleInPlace(), nn.Linear(16, 4))
    sample = torch.randn(BATCH, 8)
    with torch.no_grad():
        expected = model[2](2 * model[0](sample))
    runners = task_runners(partitions_of(model, [1, 2]), sample)
    for _ in range(3):
        for stage in runners:
            for kind in ("F", "Fc", "B"):
                if kind == "B":
                    stage[kind].build(1)  # type: ignore[attr-defined]
                stage[kind]()
    # each run started from the stage's input as it was, as each of the executor's tasks does
    assert torch.allclose(runners[1]["F"](), expected) and torch.allclose(runners[1]["Fc"](), expected)


def test_stage_extras_of_a_model_without_parameters() -> None:
    """The executor trains such a model when its input requires grad; each stage alone trains the same way."""
    from sim.calibration.thread_costs import measure_stage_extras

    model = _no_parameters()
    parts = partitions_of(model, [2, 2])
    sample = torch.randn(BATCH, 8)
    cost = calibrate(model, [2, 2], sample.clone().requires_grad_(), warmup=0, repeats=1)
    extras = measure_stage_extras(cost, parts, sample, steps=1, warmup_steps=0)
    assert len(extras) == 2 and all(math.isfinite(v) and v >= 0 for e in extras for v in vars(e).values())


@pytest.mark.slow
@pytest.mark.parametrize(("model", "balance", "checkpoint"), [
    (_no_parameters, (2, 2), "except_last"),
    (_in_place_first, (1, 2), "never"),  # with checkpointing the executor refuses an in-place first layer
])
def test_the_experiment_runs_models_the_executor_runs(model: Any, balance: tuple[int, ...], checkpoint: str) -> None:
    from sim.calibration.experiment import Setup, run

    setup = Setup(chunks=2, checkpoint=checkpoint, balance=balance, devices=("cpu", "cpu"), steps=1,
                  warmup_steps=0, warmup=0, repeats=1, pair_rounds=1)  # type: ignore[arg-type]
    outcome = run(model(), torch.randn(BATCH, 8), setup)
    comparison = outcome.comparison
    assert comparison.matched > 0 and comparison.only_predicted == () and comparison.only_measured == ()
    assert outcome.predicted.makespan > 0 and outcome.measured.makespan > 0


def test_a_split_calibration_prices_w_tasks_by_their_own_seconds() -> None:
    """Calibrated for a schedule with W tasks, every stage with parameters has weight > 0, and the simulator
    bills each W at the stage's recorded weight-gradient seconds."""
    import dataclasses

    from gpipe.schedule import Op, Task, gpipe
    from sim.core.engine import simulate

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
    cost = calibrate(model, [2, 2], torch.randn(32, 64), warmup=1, repeats=3, recorded=True, split=True)
    assert all(s.weight > 0 for s in cost.stages)
    assert cost.stages[0].backward == 0.0  # the first stage's input needs no gradient: W does all its backward
    executor = executor_costs(cost)
    assert all(e.weight_recorded is not None and e.weight_recorded > 0 for e in executor.stages)
    assert executor_costs(calibrate(model, [2, 2], torch.randn(32, 64), warmup=0, repeats=1,
                                    recorded=True)).stages[0].weight_recorded is None
    base = gpipe(2, 2, "never")
    lists = tuple(tuple(u for t in ts for u in ((t, Task(Op.W, t.microbatch, t.stage)) if t.op is Op.B else (t,)))
                  for ts in base.tasks)
    timeline = simulate(dataclasses.replace(base, tasks=lists, name="split"), cost)
    for span in timeline.compute_spans():
        if span.task.op is Op.W:
            assert span.duration == pytest.approx(executor.stages[span.task.stage].weight_recorded)
