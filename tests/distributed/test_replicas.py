"""DistributedGPipe with replicas (issue 48): ``pp 2 x dp 2`` on 4 gloo processes and ``dp 2`` on 2, each spawned
once: three SGD steps equal the plain model's on the global batch (GPipe's, 1F1B, a zero-bubble schedule, a
checkpointed run, ZeRO-1's sharded optimizer, ZeRO-3's stages sharded by FSDP2), every collective a span, and a
failure in one replica ends both.
"""

from __future__ import annotations

import functools

import pytest

from tests.distributed import replica_cases as cases
from tests.distributed.ranks import Case, run

pytestmark = pytest.mark.slow  # launches ranks: end to end (still run in CI)

MESH: dict[str, Case] = {
    f"{name}-{checkpoint}": functools.partial(cases.trains, schedule=name, checkpoint=checkpoint, dp=2, balance=[2, 2])
    for name, checkpoint in (("gpipe", "never"), ("1f1b", "never"), ("zb-h1", "never"), ("1f1b", "always"))}
MESH["zero-1"] = functools.partial(cases.trains, schedule="1f1b", checkpoint="never", dp=2, balance=[2, 2], zero=1)
MESH |= {f"zero-3-{name}-{checkpoint}": functools.partial(cases.trains, schedule=name, checkpoint=checkpoint, dp=2,
                                                          balance=[2, 2], zero=3)
         for name, checkpoint in (("gpipe", "never"), ("1f1b", "never"), ("1f1b", "always"))}
MESH["gathered"] = functools.partial(cases.gathered, dp=2)
MESH["fails"] = functools.partial(cases.fails, dp=2, victim=3)
MESH["fails-zero-3"] = functools.partial(cases.fails, dp=2, victim=3, zero=3)
PAIR: dict[str, Case] = {
    "dp2-gpipe": functools.partial(cases.trains, schedule="gpipe", checkpoint="except_last", dp=2, balance=[4]),
    "dp2-one-bucket": functools.partial(cases.trains, schedule="gpipe", checkpoint="never", dp=2, balance=[4],
                                        bucket_bytes=2**20),
    "dp2-zero-3-gpipe": functools.partial(cases.trains, schedule="gpipe", checkpoint="except_last", dp=2, balance=[4],
                                          zero=3),
    "dp2-zero-3-kept": functools.partial(cases.trains, schedule="1f1b", checkpoint="never", dp=2, balance=[4], zero=3,
                                         reshard_after_forward=False),
    "dp2-zero-3-two-stages": functools.partial(cases.trains, schedule="interleaved-1f1b", checkpoint="except_last",
                                               dp=2, balance=[2, 2], zero=3),
}


@pytest.fixture(scope="module")
def mesh() -> dict[str, list[str | None]]:
    return run(4, list(MESH.items()), timeout=120)


@pytest.mark.parametrize("case", [c for c in MESH if not c.startswith("fails")])
def test_pp2_dp2_trains_like_one_process(mesh: dict[str, list[str | None]], case: str) -> None:
    assert mesh[case] == ["ok"] * 4


def test_dp2_trains_like_one_process() -> None:
    got = run(2, list(PAIR.items()), timeout=90)
    assert got == {case: ["ok", "ok"] for case in PAIR}


@pytest.mark.parametrize("case", ["fails", "fails-zero-3"])
def test_a_failing_backward_in_one_replica_ends_every_rank(mesh: dict[str, list[str | None]], case: str) -> None:
    """Rank 3 (replica 1's last stage) raises in a backward; replica 0's ranks, waiting for their reductions (or,
    sharded, a gather), stop naming it."""
    said = "rank 3, stage 1, task B"
    for rank, result in enumerate(mesh[case]):
        assert result is not None, f"rank {rank} never answered"
        expected = f"PipelineFailed: {said}" if rank == 3 else f"PipelineFailed: rank {rank} stopped because {said}"
        assert result.startswith(expected), result
        assert "failed with ValueError: boom in the backward" in result, result
