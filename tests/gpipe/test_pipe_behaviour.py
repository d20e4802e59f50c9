"""What the executor does besides computing the right numbers: order, recompute, phases, RNG, timelines, API."""

from __future__ import annotations

import copy
import dataclasses
import threading

import pytest
import torch
from torch import Tensor, nn

from gpipe import DeferredBatchNorm, GPipe, is_checkpointing, is_recomputing
from gpipe.interpreter.pipeline import Pipeline
from gpipe.interpreter.threads import ThreadRun
from gpipe.loss import LossPlan
from gpipe.microbatch import scatter
from gpipe.schedule import CHECKPOINT_MODES, Op
from tests.gpipe.models import mlp


class Probe(nn.Module):
    """Logs (phase, micro-batch) in forward and ('B', micro-batch) in backward; micro-batch i's rows hold i."""

    def __init__(self, log: list[tuple[str, int]]) -> None:
        super().__init__()
        self.log = log

    def forward(self, x: Tensor) -> Tensor:
        i = int(x[0, 0].round().item())
        phase = "R" if is_recomputing() else ("C" if is_checkpointing() else "F")
        self.log.append((phase, i))
        if x.requires_grad:
            x.register_hook(lambda g: self.log.append(("B", i)) or g)
        return x * 1.0


def _marked(m: int, rows: int = 2) -> Tensor:
    return torch.arange(m, dtype=torch.float32).repeat_interleave(rows).unsqueeze(1).repeat(1, 3)


def _probed(logs: list[list[tuple[str, int]]]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for log in logs:
        layers += [nn.Linear(3, 3, bias=False), Probe(log)]
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.weight.copy_(torch.eye(3))
    return model


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_backward_in_reverse_order_with_recompute_right_before(checkpoint: str) -> None:
    m = 4
    logs: list[list[tuple[str, int]]] = [[], [], []]
    pipe = GPipe(_probed(logs), [2, 2, 2], chunks=m, checkpoint=checkpoint)
    pipe(_marked(m).requires_grad_()).sum().backward()
    for log in logs:
        forward = [entry for entry in log if entry[0] in "FC"]
        assert [i for _, i in forward] == list(range(m))
        for phase, i in forward:
            assert phase == ("C" if pipe.schedule.is_checkpointed(i) else "F")
        backward = [entry for entry in log if entry[0] in "RB"]
        expected: list[tuple[str, int]] = []
        for i in reversed(range(m)):
            if pipe.schedule.is_checkpointed(i):
                expected.append(("R", i))
            expected.append(("B", i))
        assert backward == expected


@pytest.mark.parametrize("grad_mode", ["eval", "no_grad"])
def test_eval_and_no_grad_run_no_checkpointing(grad_mode: str) -> None:
    logs: list[list[tuple[str, int]]] = [[], []]
    pipe = GPipe(_probed(logs), [2, 2], chunks=3, checkpoint="always")
    if grad_mode == "eval":
        pipe.eval()
        out = pipe(_marked(3))
    else:
        with torch.no_grad():
            out = pipe(_marked(3))
    assert out.requires_grad == (grad_mode == "eval")  # as the plain model: eval mode still records a graph
    assert all(phase == "F" for log in logs for phase, _ in log)
    assert [i for _, i in logs[1]] == [0, 1, 2]


def test_dropout_identical_under_recompute() -> None:
    def run(checkpoint: str) -> list[Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 16), nn.Dropout(0.3),
                              nn.Linear(16, 4))
        pipe = GPipe(model, [3, 3], chunks=4, checkpoint=checkpoint)
        torch.manual_seed(1)
        x = torch.randn(8, 8)
        pipe(x).pow(2).sum().backward()
        return [p.grad for p in model.parameters()]

    never, always, except_last = run("never"), run("always"), run("except_last")
    for a, b, c in zip(never, always, except_last, strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)
    # and dropout really dropped something (the masks are not all ones)
    assert any((g == 0).any() for g in never)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_deferred_batch_norm_running_stats_equal_whole_batch(momentum: float | None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4, momentum=momentum), nn.ReLU(), nn.Conv2d(4, 4, 1))
    reference = copy.deepcopy(model)
    pipe = GPipe(model, [2, 2], chunks=3, checkpoint="always", deferred_batch_norm=True)
    assert isinstance(pipe[1], DeferredBatchNorm)
    for _ in range(3):
        x = torch.randn(10, 2, 6, 6)
        pipe(x).mean().backward()
        reference(x)
    for ours, theirs in ((pipe[1], reference[1]),):
        torch.testing.assert_close(ours.running_mean, theirs.running_mean)
        torch.testing.assert_close(ours.running_var, theirs.running_var)
        assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == 3


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("chunks", [1, 3, 5])
def test_measured_timeline_holds_exactly_the_schedule(chunks: int, checkpoint: str) -> None:
    torch.manual_seed(0)
    pipe = GPipe(mlp(), [1, 2, 2], chunks=chunks, checkpoint=checkpoint, record=True)
    assert pipe.timeline is None
    pipe(torch.randn(10, 6)).sum().backward()
    timeline = pipe.timeline
    assert timeline is not None and timeline.source == "measured"
    schedule = pipe.schedule
    for d in range(3):
        assert timeline.task_order(d) == list(schedule.tasks[d])
    assert len(timeline.compute_spans()) == sum(map(len, schedule.tasks))
    assert timeline.copy_spans() == []  # CPU to CPU: the hand-off is the copy, nothing is moved
    for span in timeline.compute_spans():
        assert 0 <= span.start <= span.end
        for dep in schedule.dependencies(span.task):
            assert timeline.span_of(dep).end <= span.start + 1e-9
    assert timeline.meta["m"] == chunks and timeline.meta["checkpoint"] == checkpoint
    assert timeline.meta["model_state_bytes"] == [sum(p.numel() * 4 for p in part.parameters())
                                                  for part in pipe.partitions]
    for d in range(3):  # everything saved for backward is released by the end of the step
        assert timeline.memory_series(d)[-1][1] == 0
        assert timeline.peak_memory(d) > 0


def test_recording_off_records_nothing_and_can_be_switched_on() -> None:
    pipe = GPipe(mlp(), [2, 3], chunks=2)
    pipe(torch.randn(4, 6)).sum().backward()
    assert pipe.timeline is None
    pipe.record = True
    with torch.no_grad():
        pipe(torch.randn(4, 6))
    assert pipe.timeline is None  # forward-only steps are not training steps
    pipe(torch.randn(4, 6)).sum().backward()
    assert pipe.timeline is not None


def test_sequential_face() -> None:
    model = mlp()
    layers = list(model)
    pipe = GPipe(model, [2, 3], devices=["cpu", "cpu"], chunks=4)
    assert pipe.balance == [2, 3] and pipe.chunks == 4 and pipe.checkpoint == "except_last"
    assert pipe.devices == [torch.device("cpu")] * 2
    assert len(pipe) == 5 and list(pipe) == layers and pipe[2] is layers[2] and pipe[-1] is layers[-1]
    assert [len(p) for p in pipe.partitions] == [2, 3]
    with pytest.raises(TypeError, match="places its partitions"):
        pipe.to("cpu")
    with pytest.raises(TypeError, match="places its partitions"):
        pipe.cpu()
    with pytest.raises(TypeError, match="places its partitions"):
        pipe.cuda()
    assert pipe.to(torch.float64) is pipe and layers[0].weight.dtype == torch.float64


def test_a_run_is_given_the_pipeline_description_not_the_gpipe() -> None:
    """Note [what a run is given] in gpipe.interpreter.pipeline: GPipe builds one frozen Pipeline; a ThreadRun needs
    nothing else."""
    torch.manual_seed(0)
    model = mlp()
    pipe = GPipe(model, [2, 3], devices=["cpu", "cpu"], chunks=2, cpu_affinity=[None, None], switch_interval=None)
    description = pipe.pipeline
    assert isinstance(description, Pipeline)
    assert all(a is b for a, b in zip(description.partitions, pipe.partitions, strict=True))
    assert description.devices == (torch.device("cpu"),) * 2 and description.copy_streams == {}
    assert pipe.cpu_affinity == [None, None] and pipe.switch_interval is None and pipe.skip_layout.popped_in == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        description.devices = (torch.device("cpu"),)  # type: ignore[misc]
    x = torch.randn(4, 6)
    run = ThreadRun(description, pipe.schedule_for(2, "except_last"), scatter((x,), 2), False, train=True, record=True,
              loss=(LossPlan(lambda out, target: (out - target).sum(), (1.0, 1.0)), [(torch.zeros(2, 3),)] * 2))
    run.execute_all()
    assert pipe.timeline is None and run.timeline is not None  # the run's own: it knows no GPipe to keep it in
    assert run.timeline.meta["m"] == 2 and description.writes_input == [False, False]
    pipe.record = True
    pipe.step(x, torch.zeros(4, 3), nn.MSELoss())
    assert pipe.timeline is not None and pipe.timeline is not run.timeline


def test_workers_overlap_backward_on_cpu() -> None:
    """The B tasks of different partitions run on their own worker threads, not on the caller's."""
    seen: dict[str, set[str]] = {"B": set()}

    class Where(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            if x.requires_grad:
                x.register_hook(lambda g: seen["B"].add(threading.current_thread().name) or g)
            return x

    pipe = GPipe(nn.Sequential(nn.Linear(3, 3), Where(), nn.Linear(3, 3), Where()), [2, 2], chunks=2)
    pipe(torch.randn(4, 3)).sum().backward()
    assert seen["B"] == {"gpipe-worker-0", "gpipe-worker-1"}
    assert threading.current_thread().name not in seen["B"]
    assert not [t for t in threading.enumerate() if t.name.startswith("gpipe-worker")]


def test_schedule_drives_the_workers() -> None:
    pipe = GPipe(mlp(), [2, 3], chunks=3, checkpoint="except_last")
    schedule = pipe.schedule
    assert schedule.name == "gpipe" and schedule.m == 3 and schedule.n == 2
    assert [t.op for t in schedule.tasks[0]].count(Op.R) == 2


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_step_trains_like_the_plain_model(schedule: str, checkpoint: str, reduction: str) -> None:
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    loss_fn = nn.MSELoss(reduction=reduction)
    pipe = GPipe(model, [2, 2, 1], chunks=4, checkpoint=checkpoint, schedule=schedule, record=True)
    x, y = torch.randn(9, 6), torch.randn(9, 3)
    loss = pipe.step(x, y, loss_fn)
    expected = loss_fn(reference(x), y)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    timeline = pipe.timeline
    assert timeline is not None and timeline.meta["schedule"] == pipe.schedule.name
    for d in range(3):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])


def test_one_f_one_b_keeps_fewer_activations() -> None:
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        torch.manual_seed(0)
        pipe = GPipe(mlp(), [2, 2, 1], chunks=8, checkpoint="never", schedule=schedule, record=True)
        pipe.step(torch.randn(16, 6), torch.randn(16, 3), nn.functional.mse_loss)
        assert pipe.timeline is not None
        peaks[schedule] = pipe.timeline.peak_memory(0)
    assert peaks["1f1b"] < peaks["gpipe"]


def test_one_f_one_b_needs_step() -> None:
    pipe = GPipe(mlp(), [2, 3], chunks=2, schedule="1f1b")
    with pytest.raises(RuntimeError, match=r"pipe.step\(input, target, loss_fn\)"):
        pipe(torch.randn(4, 6))
    with torch.no_grad():  # inference needs no loss: any schedule runs it
        assert pipe(torch.randn(4, 6)).shape == (4, 3)
    with pytest.raises(ValueError, match="unknown schedule"):
        GPipe(mlp(), [2, 3], schedule="zero-bubble")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_batch_smaller_than_chunks_runs_fewer_microbatches_as_torchgpipe(schedule: str) -> None:
    """The last, short batch of an epoch (drop_last=False) trains, as with torchgpipe's tensor.chunk; the
    recorded timeline is of the micro-batches that ran."""
    torch.manual_seed(0)
    pipe = GPipe(mlp(), [2, 3], chunks=8, record=True, schedule=schedule)
    pipe.step(torch.randn(3, 6), torch.randn(3, 3), nn.MSELoss())
    assert pipe.timeline is not None
    assert {span.task.microbatch for span in pipe.timeline.spans} == {0, 1, 2}
    with torch.no_grad():
        assert pipe(torch.randn(2, 6)).shape == (2, 3)


def test_a_batch_smaller_than_chunks_matches_the_plain_model() -> None:
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    pipe = GPipe(model, [2, 3], chunks=8, checkpoint="always")
    x, y = torch.randn(3, 6), torch.randn(3, 3)
    torch.testing.assert_close(pipe.step(x, y, nn.MSELoss()), nn.MSELoss()(reference(x), y))
    nn.MSELoss()(reference(x), y).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
