"""DistributedGPipe on 2 gloo processes on loopback (one spawn for the whole module, :mod:`tests.distributed.ranks`):
every registered schedule x checkpoint policy trains like the plain model (a stage per rank; 4 stages by the
schedule's layout), skips and tuples cross ranks, draws and deferred batch norm match one process, a meta model
is materialised alike; a failing task, a hanging rank, a detached loss and bad input end every rank with the expected
message.
"""

from __future__ import annotations

import functools

import pytest

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES
from tests.distributed import cases
from tests.distributed.ranks import Case, run
from tests.gpipe.losses import CASES as LOSSES

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)

WORLD = 2


TRAIN: dict[str, Case] = {}
for _name, _kind in SCHEDULES.items():
    for _model, (_one, _two) in {"mlp": ([3, 2], [1, 1, 2, 1]), "skip": ([2, 3], [1, 1, 1, 2])}.items():
        _balance = _two if _kind.place is not None else _one
        # every policy on the plain model; skips cross ranks under one (recomputed) policy, which is what they add
        for _checkpoint in CHECKPOINT_MODES if _model == "mlp" else ("always",):
            if not cases.refused(_name, _checkpoint, len(_balance), 4, WORLD):
                TRAIN[f"{_name}-{_checkpoint}-{_model}"] = functools.partial(
                    cases.train, schedule=_name, checkpoint=_checkpoint, model=_model, balance=_balance, m=4)
# interleaved 1F1B with m no multiple of the ranks, in rounds named by option (a last round of two)
TRAIN["interleaved-1f1b-round3-m5"] = functools.partial(cases.train, schedule="interleaved-1f1b:round=3",
                                                       checkpoint="except_last", model="mlp", balance=[1, 1, 2, 1],
                                                       m=5)
TRAIN["gpipe-tuple"] = functools.partial(cases.train, schedule="gpipe", checkpoint="always", model="tuple",
                                         balance=[2, 2], m=4)
TRAIN["1f1b-tuple"] = functools.partial(cases.train, schedule="1f1b", checkpoint="except_last", model="tuple",
                                        balance=[2, 2], m=4)
# every loss of tests/gpipe/losses.py under 1F1B (a backward before the last forward), a few under GPipe too
LOSS: dict[str, Case] = {f"loss-1f1b-{name}": functools.partial(cases.loss, name=name, schedule="1f1b")
                         for name in LOSSES}
LOSS.update({f"loss-gpipe-{name}": functools.partial(cases.loss, name=name, schedule="gpipe")
             for name in ("cross-entropy-smoothing-weight-ignore", "nll-sum", "callable-sum")})
OTHER: dict[str, Case] = {
    "draws-always": functools.partial(cases.like_gpipe, model="drop", checkpoint="always", batch_norm=False),
    "draws-except_last": functools.partial(cases.like_gpipe, model="drop", checkpoint="except_last",
                                           batch_norm=False),
    "deferred-batch-norm": functools.partial(cases.like_gpipe, model="conv", checkpoint="always", batch_norm=True),
    "meta": cases.meta,
    "fail-F-stage0": functools.partial(cases.fail, stage=0, where="F", schedule="gpipe"),
    "fail-F-stage1": functools.partial(cases.fail, stage=1, where="F", schedule="1f1b"),
    "fail-B-stage0": functools.partial(cases.fail, stage=0, where="B", schedule="1f1b"),
    "fail-B-stage1": functools.partial(cases.fail, stage=1, where="B", schedule="gpipe"),
    "hang": cases.hang,
    "detached-loss": cases.detached_loss,
    "gathered-1f1b": functools.partial(cases.gathered, schedule="1f1b", balance=[3, 2], m=4),
    "gathered-interleaved-1f1b": functools.partial(cases.gathered, schedule="interleaved-1f1b", balance=[1, 2, 1, 1],
                                                   m=4),
    "gathered-zb-h1": functools.partial(cases.gathered, schedule="zb-h1", balance=[2, 3], m=4),
    "bad-balance": cases.bad_balance,
    "empty-batch": functools.partial(cases.bad_input, what="empty"),
    "target-rows": functools.partial(cases.bad_input, what="target"),
    "input-type": functools.partial(cases.bad_input, what="type"),
    "shape-mismatch": cases.shape_mismatch,
    "new-structures": cases.new_structures,
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[str | None]]:
    return run(WORLD, [*TRAIN.items(), *LOSS.items(), *OTHER.items()])


@pytest.mark.parametrize("case", list(TRAIN) + ["draws-always", "draws-except_last", "deferred-batch-norm", "meta"])
def test_trains_like_one_process(results: dict[str, list[str | None]], case: str) -> None:
    assert results[case] == ["ok"] * WORLD


@pytest.mark.parametrize("case", list(LOSS))
def test_the_step_loss_is_the_plain_models_on_two_ranks(results: dict[str, list[str | None]], case: str) -> None:
    assert results[case] == ["ok"] * WORLD


def test_every_schedule_is_run() -> None:
    assert {case.split("-")[0] for case in TRAIN} >= {name.split("-")[0] for name in SCHEDULES}
    assert all(any(case.startswith(f"{name}-") for case in TRAIN) for name in SCHEDULES)


@pytest.mark.parametrize(("case", "stage", "task", "text"), [
    ("fail-F-stage0", 0, "F0@0", "ValueError: boom in the forward"),
    ("fail-F-stage1", 1, "F0@1", "ValueError: boom in the forward"),
    ("fail-B-stage0", 0, "B0@0", "ValueError: boom in the backward"),
    ("fail-B-stage1", 1, "B1@1", "ValueError: boom in the backward"),
])
def test_a_failing_task_ends_every_rank_naming_it(results: dict[str, list[str | None]], case: str, stage: int,
                                                  task: str, text: str) -> None:
    """The rank of the stage raises its error; the other is told who failed, where, and the traceback (the
    alarm, not the timeout of 30 s); the pipeline refuses another step on both."""
    said = f"rank {stage}, stage {stage}, task {task} failed with {text}"
    for rank, result in enumerate(results[case]):
        assert result is not None, f"rank {rank} never answered"
        first = result.splitlines()[0]
        assert first == f"PipelineFailed: {said}" if rank == stage else \
            first == f"PipelineFailed: rank {rank} stopped because {said}", first
        assert f"--- traceback on rank {stage} ---" in result and "Traceback (most recent call last)" in result
        assert "AFTER: PipelineFailed: this pipeline failed in an earlier step" in result


def test_a_detached_loss_ends_every_rank_as_backward_raises(results: dict[str, list[str | None]]) -> None:
    for rank, result in enumerate(results["detached-loss"]):
        assert result is not None, f"rank {rank} never answered"
        assert result.startswith("PipelineFailed: ") and "loss_fn's result does not require grad" in result, result
        assert "element 0 of tensors does not require grad" in result and result.endswith("GRADS: []"), result


def test_a_shape_mismatch_between_stages_is_refused_on_every_rank(results: dict[str, list[str | None]]) -> None:
    assert results["shape-mismatch"] == [
        "raised ValueError: shape mismatch between stages 0 and 1: stage 0 outputs (float32[2, 6]), and stage 1's "
        "first layer (layer 2, Linear) cannot take it: RuntimeError: a and b must have same reduction dim, but got "
        "[2, 6] X [5, 3]. (fix the layers at the boundary, or move it with the balance)"] * WORLD


@pytest.mark.parametrize("case", ["gathered-1f1b", "gathered-interleaved-1f1b", "gathered-zb-h1"])
def test_the_gathered_timeline_follows_the_schedule_on_one_clock(results: dict[str, list[str | None]],
                                                                 case: str) -> None:
    assert results[case] == ["ok"] * WORLD


def test_a_rank_past_the_timeout_ends_every_rank(results: dict[str, list[str | None]]) -> None:
    """Rank 1 sleeps 4 s in F0@1; rank 0 waits 1.5 s for its gradient (behind its header, the first step) and
    fails, and rank 1 learns it."""
    waited = "rank 0 waited 1.5 s for rank 1 to send the header of B0@1 '', which never came"
    assert results["hang"][0] == f"PipelineFailed: {waited}: that rank died or hangs " \
                                 "(raise DistributedGPipe(timeout=...) for slow steps)"
    assert results["hang"][1] is not None and results["hang"][1].startswith(
        f"PipelineFailed: rank 1 stopped because {waited}")


def test_a_balance_for_another_world_size_is_refused_on_every_rank(results: dict[str, list[str | None]]) -> None:
    for result in results["bad-balance"]:
        assert result is not None and result.startswith(
            "raised ValueError: balance [1, 1, 1, 1, 1] makes 5 stages, which schedule 'gpipe' cannot place on 2 "
            "ranks"), result
        assert "torchrun --nproc-per-node 5" in result


@pytest.mark.parametrize(("case", "message"), [
    ("empty-batch", "the batch is empty (dim 0 has size 0)"),
    ("target-rows", "the target's batch size 6 (rank 1) differs from the input's 8 (rank 0)"),
    ("input-type", "the input must be a tensor or a tuple of tensors, got list"),
])
def test_bad_input_is_refused_on_every_rank_before_anything_is_sent(results: dict[str, list[str | None]], case: str,
                                                                    message: str) -> None:
    """Every rank raises (the one that read the input its own error, the other naming it), and the pipeline then
    steps: nothing was sent."""
    for result in results[case]:
        assert result is not None and message in result.splitlines()[0], result
        assert result.endswith("AFTER: stepped"), result




def test_a_new_input_structure_is_checked_on_every_rank_and_a_known_one_is_not(
        results: dict[str, list[str | None]]) -> None:
    """Two structures stepped (2 rows of 6, 3 rows of 2 x 3), one refused on every rank before anything is sent (5
    features into stage 1's Linear(6, 3)), and the pipeline steps on after the refusal."""
    for result in results["new-structures"]:
        assert result is not None
        steps = result.split(" | ")
        assert steps[:3] == ["stepped"] * 3 and steps[4:] == ["stepped", "checked 2"], result
        assert steps[3].startswith("ValueError: shape mismatch between stages 0 and 1: stage 0 outputs "
                                   "(float32[2, 5])"), result
