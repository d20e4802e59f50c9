"""torchgpipe's copy streams and accumulated weight gradients in the planner's memory, in closed form.

Note [a copy stream per micro-batch] and Note [accumulated weight gradients] in :mod:`sim.planning.parallel.memory`.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gpipe.schedule import gpipe
from sim.core.cost import StageCost
from sim.planning.counting.flops import count_layers
from sim.planning.counting.models.unet import unet, unet_sample
from sim.planning.parallel.memory import (
    SEGMENT_BYTES,
    copy_stream_bytes,
    device_memory,
    round_block,
    round_segment,
    stage_backward_working_bytes,
)
from sim.planning.plan import PlanRequest, plan

MiB = 2**20
S, C, SEND = 1000 * 512, 3 * MiB, 5 * MiB  # saved, checkpointed input, sent activation (= its gradient)


def _two_stages() -> tuple[StageCost, ...]:
    return (StageCost(1.0, 2.0, saved_bytes=S, checkpoint_bytes=512, send_bytes=SEND),
            StageCost(1.0, 2.0, saved_bytes=S, checkpoint_bytes=C, send_bytes=512))


def test_each_microbatch_stream_reserves_its_own_copies() -> None:
    """GPipe, 2 stages, 3 micro-batches: device 0 receives each output gradient (5 MiB -> 6 MiB reserved), device 1
    each input (3 MiB -> 4 MiB); three streams each, never shared."""
    schedule = gpipe(3, 2, "except_last")
    assert copy_stream_bytes(schedule, _two_stages()) == [3 * 6 * MiB, 3 * 4 * MiB]
    assert copy_stream_bytes(schedule, _two_stages(), [1.0, 1.0, 0.5]) == [(2 * 6 + 4) * MiB, (2 * 4 + 2) * MiB]


def test_per_microbatch_streams_move_the_received_inputs_out_of_saved() -> None:
    """Device 1 peaks after its last F (F2): micro-batch 2's activation S and two checkpointed inputs C. With a copy
    stream per micro-batch the inputs sit on their streams: saved is S alone, and copies 3 x 4 MiB at every task."""
    schedule = gpipe(3, 2, "except_last")
    shared = device_memory(schedule, _two_stages(), [0, 0])
    streams = device_memory(schedule, _two_stages(), [0, 0], copy_streams="per_microbatch")
    assert (shared[1].saved, shared[1].copies, shared[1].task) == (S + 2 * C, 0, "F2@1")
    assert (streams[1].saved, streams[1].copies, streams[1].task) == (S, 12 * MiB, "F2@1")
    assert streams[1].total == 12 * MiB + SEGMENT_BYTES  # S rounds up to one 2 MiB segment
    assert (streams[0].saved, streams[0].copies) == (shared[0].saved, 18 * MiB)  # device 0 keeps its 512-byte inputs
    with pytest.raises(ValueError, match="copy_streams must be one of shared, per_microbatch"):
        device_memory(schedule, _two_stages(), [0, 0], copy_streams="per-device")


def test_a_backward_that_accumulates_holds_the_new_weight_gradient() -> None:
    """One stage, two micro-batches, no checkpoint: B1 creates .grad (working 1 block); B0 adds into it, so its
    working set is the backward one (W = 3000 blocks), which outweighs the activation B1 held and B0 no longer does."""
    grads, w = 4 * SEGMENT_BYTES, 3000 * 512
    stages = (StageCost(1.0, 2.0, saved_bytes=S, gradient_bytes=grads),)
    (first,) = device_memory(gpipe(2, 1, "never"), stages, [512])
    (accumulating,) = device_memory(gpipe(2, 1, "never"), stages, [512], backward_working=[w])
    assert (first.task, first.saved, first.working) == ("B1@0", 2 * S, 512)
    assert (accumulating.task, accumulating.saved, accumulating.working) == ("B0@0", S, w)
    assert accumulating.gradients == grads
    with pytest.raises(ValueError, match="give one of each per stage"):
        device_memory(gpipe(2, 1, "never"), stages, [512], backward_working=[w, w])


def test_backward_working_set_counts_the_layers_weight_gradient() -> None:
    """Linear(64, 128) at 2 samples: input 512 B, output 1024 B, weight gradient 64 * 128 * 4 = 32768 B."""
    torch.manual_seed(0)
    profile = count_layers(nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU()), torch.randn(2, 64))
    assert stage_backward_working_bytes(profile, [2], 2, 4) == [512 + 1024 + 32768]
    assert stage_backward_working_bytes(profile, [1, 1], 2, 4) == [512 + 1024 + 32768, 1024 + 1024]


def test_plan_rejects_unknown_copy_streams() -> None:
    profile = count_layers(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4))
    with pytest.raises(ValueError, match="copy_streams must be one of shared, per_microbatch"):
        plan(PlanRequest(profile=profile, batch=4, device="tesla-p40", gpus=[1], copy_streams="torchgpipe"))


def test_cli_counts_torchgpipe_copy_streams(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    argv = ["plan", "--model", "unet:1,4", "--batch", "8", "--gpus", "2", "--hardware", "tesla-p40", "--chunks",
            "4", "--checkpoint", "except_last", "--schedule", "gpipe", "--balance", "30,35", "--replicas", "1",
            "--optimizer", "sgd", "--json"]
    copies = {}
    for streams in ("shared", "per_microbatch"):
        assert main([*argv, "--copy-streams", streams]) == 0
        (row,) = json.loads(capsys.readouterr().out)["rows"]
        copies[streams] = [p["copies"] for p in row["memory_parts"]]
        assert [p["total"] for p in row["memory_parts"]] == row["memory_bytes"]
    # 4 micro-batches of 2 samples: device 1 receives layer 30's input, device 0 its gradient, once per stream
    fixed, per_sample = count_layers(unet(1, 4), unet_sample(2)).layers[30].input_bytes
    sent = round_segment(round_block(fixed + 2 * per_sample))
    assert sent > SEGMENT_BYTES  # the skips travel with the activation
    assert copies == {"shared": [0, 0], "per_microbatch": [4 * sent, 4 * sent]}
