"""DistributedGPipe on 4 gloo processes (one spawn for the module): every registered schedule (except_last) on a
stage per rank (GPipe's, 1F1B) or 8 stages by the schedule's layout, a skip from rank 0 straight to rank 3, a
failing forward on each rank; and, on 2 processes of their own, a killed rank.
"""

from __future__ import annotations

import functools

import pytest

from gpipe.schedule import SCHEDULES
from tests.distributed import cases
from tests.distributed.ranks import Case, run

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)

WORLD = 4


CASES: dict[str, Case] = {}
for _name, _kind in SCHEDULES.items():
    _model, _balance = ("chain8", [1] * 8) if _kind.place is not None else ("chain8", [2, 2, 2, 2])
    # the policies are each run at 2 ranks (test_two_ranks); here the one that recomputes all but the last
    for _checkpoint in ("except_last",):
        if not cases.refused(_name, _checkpoint, len(_balance), 8, WORLD):
            CASES[f"{_name}-{_checkpoint}"] = functools.partial(
                cases.train, schedule=_name, checkpoint=_checkpoint, model=_model, balance=_balance, m=8)
CASES["skip-0-to-3"] = functools.partial(cases.train, schedule="1f1b", checkpoint="always", model="skip",
                                         balance=[1, 1, 1, 2], m=4)
CASES["gathered-gpipe"] = functools.partial(cases.gathered, schedule="gpipe", balance=[2, 2, 2, 2], m=4)
FAILS = {f"fail-F-stage{s}": functools.partial(cases.fail, stage=s, where="F", schedule="1f1b") for s in range(4)}


@pytest.fixture(scope="module")
def results() -> dict[str, list[str | None]]:
    return run(WORLD, [*CASES.items(), *FAILS.items()])


@pytest.mark.parametrize("case", list(CASES))
def test_trains_like_one_process(results: dict[str, list[str | None]], case: str) -> None:
    assert results[case] == ["ok"] * WORLD


@pytest.mark.parametrize("stage", range(WORLD))
def test_a_failing_forward_on_any_rank_ends_every_rank(results: dict[str, list[str | None]], stage: int) -> None:
    said = f"rank {stage}, stage {stage}, task F0@{stage} failed with ValueError: boom in the forward"
    for rank, result in enumerate(results[f"fail-F-stage{stage}"]):
        assert result is not None, f"rank {rank} never answered"
        expected = f"PipelineFailed: {said}" if rank == stage else f"PipelineFailed: rank {rank} stopped because {said}"
        assert result.splitlines()[0] == expected
        assert "ValueError: boom in the forward" in result.split(f"--- traceback on rank {stage} ---")[1]


def test_a_killed_rank_ends_the_others_with_a_clear_message() -> None:
    """Rank 1 of 2 exits in its first forward; rank 0, waiting for its gradient, fails naming it (the
    connection closed, well inside the timeout of 20 s)."""
    got = run(2, [("kill", functools.partial(cases.kill, victim=1))], timeout=60)["kill"]
    assert got[1] is None
    assert got[0] is not None and got[0].startswith("PipelineFailed: rank 0 lost rank 1 to send "), got[0]
    assert "Connection closed by peer" in got[0]
