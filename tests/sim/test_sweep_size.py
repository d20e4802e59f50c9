"""A sweep's time is estimated before the model is counted, and past a minute it is refused with the flags that
narrow it (Note [sweep limit] in sim.planning.sweep_size); the CLI's default sweeps run."""

from __future__ import annotations

import pytest
import torch

from sim.cli import main
from sim.planning.counting.models import ModelSpec, get_model
from sim.planning.parallel.configurations import Configuration, configurations
from sim.planning.request import PlanRequest
from sim.planning.sweep_size import (
    BOUNDED_SHARE,
    FULL_SHARE,
    SECONDS_PER_CONFIGURATION,
    SECONDS_PER_PAIR,
    SweepSpace,
    sweep_size,
)

GPT_175B = ["--model", "gpt:175b", "--batch", "1536", "--gpus", "1024", "--hardware", "a100-80gb", "--link", "nvlink3",
            "--network", "infiniband-hdr"]
LLAMA_405B = ["--model", "llama:405b", "--batch", "2048", "--gpus", "16384", "--hardware", "h100-sxm", "--link",
              "nvlink4", "--network", "infiniband-ndr"]
# every GPU count from 1,024 to 16,384 of Llama 3 405B, with chunks up to 1,024: minutes of simulation
LARGE = [*LLAMA_405B[:4], "--gpus", "1024,2048,4096,8192,16384", *LLAMA_405B[6:],
         "--chunks", "1,2,4,8,16,32,64,128,256,512,1024"]


class Counted(Exception):
    """The CLI reached the model's count: the size check let the sweep through."""


@pytest.fixture
def no_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting a model raises :class:`Counted`, so a test sees whether the CLI got past the check, at once."""
    def count(self: ModelSpec, dtype: torch.dtype) -> None:
        raise Counted(self.name)
    monkeypatch.setattr(ModelSpec, "count", count)


@pytest.mark.parametrize("flags", [GPT_175B, LLAMA_405B], ids=["gpt-175b-1024", "llama-405b-16384"])
def test_the_cli_s_default_sweeps_are_not_refused(no_count: None, flags: list[str]) -> None:
    with pytest.raises(Counted):
        main(["plan", *flags, "--no-progress"])


def test_a_sweep_past_a_minute_is_refused_before_the_model_is_counted(no_count: None,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *LARGE, "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("gpipe-sim plan: error: this sweep spans 72,796 configurations") and error.count("\n") == 1
    for flag in ("--stages", "--chunks", "--schedule", "--tensor-parallel", "--no-limit"):
        assert flag in error
    assert "--top K" not in error  # a table ranks its fastest already
    with pytest.raises(Counted):  # asked for, it runs
        main(["plan", *LARGE, "--no-progress", "--no-limit"])


def test_a_full_sweep_is_told_it_may_rank_only_the_fastest(no_count: None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Counted):  # ranked, the default sweep runs
        main(["plan", *LLAMA_405B, "--no-progress", "--gpus", "8192,16384"])
    assert main(["plan", *LLAMA_405B, "--no-progress", "--gpus", "8192,16384", "--json"]) == 2
    assert "rank only the fastest with --top K" in capsys.readouterr().err


def test_the_estimate_prices_each_configuration_by_its_schedule_s_pairs() -> None:
    points = [Configuration(8, 4, 2, 16, "never", "1f1b"), Configuration(8, 2, 4, 8, "never", "interleaved-1f1b", 2)]
    pairs = 16 * 4 + 8 * 2 * 2
    size = sweep_size(points, bounded=False)
    assert (size.configurations, size.pairs) == (2, pairs)
    assert size.seconds == pytest.approx(FULL_SHARE * (2 * SECONDS_PER_CONFIGURATION + pairs * SECONDS_PER_PAIR))
    assert sweep_size(points, bounded=True, workers=2).seconds == pytest.approx(
        size.seconds * BOUNDED_SHARE / FULL_SHARE / 2)


def test_the_space_before_counting_spans_the_request_s_configurations() -> None:
    spec = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=100"
    entry = get_model(spec)
    counts = {(1, False): entry.count(torch.bfloat16), (2, True): entry.tensor_parallel(2, True).count(torch.bfloat16)}
    request = PlanRequest(profile=counts, batch=32, device="h100-sxm", gpus=[4, 8], link="nvlink4",
                          tensor_parallel=[1, 2, 2], sequence_parallel=[True], zero=[0, 1],
                          checkpoints=["never", "layers"], schedules=["1f1b", "interleaved-1f1b", "zb-v"])
    space = SweepSpace(32, len(counts[(1, False)]), (4, 8), (1, 2, 2), (1,), (True,), ("never", "layers"),
                       ("1f1b", "interleaved-1f1b", "zb-v"), request.virtual, (0, 1))
    assert configurations(space, {}) == configurations(request, {})
