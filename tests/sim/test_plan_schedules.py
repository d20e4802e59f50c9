"""The planner sweeps every registered schedule, stages per device for those with a layout, and B/W costs for
those that split the backward.

Three schedules registered for these tests only, GPipe's fill-drain underneath::

    looped-plan (layout: stage s on device s % p), 4 stages on 2 devices, m=2:
        dev0  F0@0 F1@0 F0@2 F1@2 B1@2 B0@2 B1@0 B0@0
        dev1  F0@1 F1@1 F0@3 F1@3 B1@3 B0@3 B1@1 B0@1
    vee-plan: the same, but its layout takes exactly two stages per device (as a V-shape does)
    split-plan: one stage per device, every B followed by its W:
        dev0  F0@0 F1@0 B1@0 W1@0 B0@0 W0@0

The model is an identity then identical linear layers: the identity costs nothing, so a balance into ``n``
stages gives ``n`` stages of equal cost and the pipeline's closed forms hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

from gpipe.schedule import Checkpoint, Op, Schedule, Task, gpipe, looped, register, unregister
from sim.cli import main
from sim.core.link import LinkSpec
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.flops import ModelProfile, count_layers
from sim.planning.hardware.catalog import DeviceSpec
from sim.planning.parallel.memory import SEGMENT_BYTES
from sim.planning.plan import PlanRequest, PlanRow, plan

LOOPED, VEE, SPLIT, EVEN = "looped-plan", "vee-plan", "split-plan", "even-chunks-plan"
WIDTH, LAYERS = 256, 8
MiB = 2**20
# compute-bound: matrix products run at 1e12 FLOP/s, and bytes move at 1e18 B/s (so fast no kernel is memory-bound)
DEVICE = DeviceSpec("toy", {"fp32": 1e12}, 1e18, 4096 * MiB, efficiency=1.0)
FREE = LinkSpec("free", 0.0, 1e30)  # copies take ~1e-24 s: the closed forms without copies hold to rounding


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Identity(), *[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


@pytest.fixture(scope="module")
def profile() -> ModelProfile:
    torch.manual_seed(0)
    return count_layers(_model(), torch.randn(2, WIDTH))


def _vee(n: int, p: int) -> tuple[int, ...]:
    if n != 2 * p:
        raise ValueError(f"a V places two stages on each device: {2 * p} stages on {p} devices, not {n}")
    return tuple(s if s < p else 2 * p - 1 - s for s in range(n))


def _split(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    base = gpipe(m, n, checkpoint, placement)
    lists = [tuple(x for t in ts for x in ((t, Task(Op.W, t.microbatch, t.stage)) if t.op is Op.B else (t,)))
             for ts in base.tasks]
    return dataclasses.replace(base, tasks=tuple(lists), name=SPLIT)


def _even(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    if m % 2:
        raise ValueError(f"{EVEN} needs an even number of micro-batches, got {m}")
    return gpipe(m, n, checkpoint, placement)


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    register(LOOPED, "GPipe's fill-drain, stage s on device s % p", layout=looped)(gpipe)
    register(VEE, "GPipe's fill-drain on a V: two stages per device", layout=_vee)(gpipe)
    register(SPLIT, "GPipe's fill-drain, every B followed by its W")(_split)
    register(EVEN, "GPipe's fill-drain for an even number of micro-batches")(_even)
    try:
        yield
    finally:
        for name in (LOOPED, VEE, SPLIT, EVEN):
            unregister(name)


def _rows(profile: ModelProfile, schedules: list[str], gpus: int, chunks: int, checkpoint: str = "never",
          **kwargs: object) -> dict[tuple[str, int], PlanRow]:
    result = plan(PlanRequest(profile=profile, batch=8 * chunks, device=DEVICE, gpus=[gpus], link=FREE,
                              training="fp32-adam", chunks=[chunks], checkpoints=[checkpoint], schedules=schedules,
                              stages=[gpus], **kwargs))  # type: ignore[arg-type]
    return {(r.schedule, r.virtual): r for r in result.rows}


# -- what the count splits ----------------------------------------------------------------------------


def test_a_linear_layers_input_gradient_is_one_forward_of_flops(profile: ModelProfile) -> None:
    """Input gradient ``dx = dy W`` and weight gradient ``dW = dy^T x``: each as many FLOPs as the forward."""
    for batch in (1, 16):
        identity, *linears = profile.layers
        assert identity.input_backward is not None and identity.input_backward.kernels == 0
        for layer in linears:
            assert layer.input_backward is not None
            forward = layer.forward.flops_at(batch).sum()
            assert forward == 2 * batch * WIDTH * WIDTH
            assert layer.input_backward.flops_at(batch).sum() == forward
            assert layer.backward.flops_at(batch).sum() == 2 * forward


def test_a_layer_without_parameters_is_all_input_gradient() -> None:
    relu = count_layers(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(2, 8)).layers[1]
    assert relu.input_backward is not None
    assert (relu.input_backward.bytes == relu.backward.bytes).all()


def test_split_stage_costs(profile: ModelProfile) -> None:
    costs = FlopCosts(profile, DEVICE, "fp32-adam", kernel_seconds=1e-6)
    whole = costs.stages((3, 3, 3), 16)
    split = costs.stages((3, 3, 3), 16, split=True)
    matmul = 2 * 16 * WIDTH * WIDTH / 1e12 + 1e-6  # one product of one layer: its FLOPs at peak, one kernel
    assert split[1].backward == pytest.approx(3 * matmul, rel=1e-12)  # three layers' input gradients
    assert split[0].backward == pytest.approx(2 * matmul, rel=1e-12)  # the identity's input needs none
    for w, s in zip(whole, split, strict=True):
        assert w.weight == 0 and s.weight > matmul
        assert s.backward + s.weight == pytest.approx(w.backward, rel=1e-12)
    by_hand = ModelProfile(tuple(dataclasses.replace(x, input_backward=None) for x in profile.layers), profile.dtype)
    with pytest.raises(ValueError, match="count the model with sim.planning.counting.flops.count_layers"):
        FlopCosts(by_hand, DEVICE, "fp32-adam").stages((9,), 1, split=True)


# -- closed forms ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "n"), [(1, 2), (4, 2), (8, 4)])
def test_step_time_and_bubble_closed_forms(profile: ModelProfile, m: int, n: int) -> None:
    """Equal stages: GPipe takes ``(m + n - 1)(f + b + w)``; splitting the backward takes the weight gradient
    off the critical path of the drain, ``(m + n - 1)(f + b) + m w``; the step adds the optimizer's update."""
    rows = _rows(profile, ["gpipe", SPLIT], n, m)
    plain, split = rows[("gpipe", 1)], rows[(SPLIT, 1)]
    assert plain.balance == split.balance == (1 + LAYERS // n, *[LAYERS // n] * (n - 1))
    costs = FlopCosts(profile, DEVICE, "fp32-adam")
    f, b = (x.sum() / n for x in costs.layer_seconds(8))  # one stage: LAYERS / n linear layers
    bi, w = (x.sum() / n for x in costs.split_backward_seconds(8))
    update = max(costs.update_seconds(plain.balance))
    assert plain.step_seconds == pytest.approx((m + n - 1) * (f + b) + update, rel=1e-9)
    assert split.step_seconds == pytest.approx((m + n - 1) * (f + bi) + m * w + update, rel=1e-9)
    assert plain.bubble_fraction == pytest.approx((n - 1) / (m + n - 1), rel=1e-9)


def test_one_device_running_every_stage_has_no_bubble(profile: ModelProfile) -> None:
    rows = _rows(profile, [LOOPED], 1, 4)
    assert set(rows) == {(LOOPED, 1), (LOOPED, 2), (LOOPED, 4)}
    costs = FlopCosts(profile, DEVICE, "fp32-adam")
    f, b = (float(x.sum()) for x in costs.layer_seconds(8))
    for (_, v), row in rows.items():
        assert len(row.balance) == v and row.bubble_fraction == 0
        assert row.step_seconds == pytest.approx(4 * (f + b) + sum(costs.update_seconds(row.balance)), rel=1e-12)


# -- what the sweep tries ---------------------------------------------------------------------------------


def test_stages_per_device_are_swept_for_a_schedule_with_a_layout(profile: ModelProfile) -> None:
    rows = _rows(profile, ["gpipe", LOOPED, VEE], 2, 4)
    assert set(rows) == {("gpipe", 1), (LOOPED, 1), (LOOPED, 2), (LOOPED, 4), (VEE, 2)}
    for (_, v), row in rows.items():
        assert row.stages == 2 and row.gpus == 2 and len(row.balance) == 2 * v and sum(row.balance) == LAYERS + 1
        assert len(row.memory_bytes) == len(row.model_state_bytes) == len(row.activation_bytes) == 2
        assert sum(row.model_state_bytes) == LAYERS * (WIDTH * WIDTH + WIDTH) * 16  # fp32 Adam, every stage once
    assert rows[(LOOPED, 1)].step_seconds == pytest.approx(rows[("gpipe", 1)].step_seconds, rel=1e-12)
    assert rows[(LOOPED, 2)].bubble_fraction < rows[(LOOPED, 1)].bubble_fraction  # smaller stages fill faster
    # 5 stages per device would need 10 stages of 9 layers; 3 per device is asked for and placed
    assert set(_rows(profile, [LOOPED], 2, 4, virtual=[3, 5])) == {(LOOPED, 3)}


def test_a_schedule_that_gets_no_row_says_why(profile: ModelProfile, capsys: pytest.CaptureFixture[str]) -> None:
    result = plan(PlanRequest(profile=profile, batch=24, device=DEVICE, gpus=[2], link=FREE, training="fp32-adam",
                              chunks=[3], checkpoints=["never"], schedules=["gpipe", VEE, EVEN], virtual=[1, 4]))
    assert {r.schedule for r in result.rows} == {"gpipe"}
    assert "a V places two stages on each device" in result.missing[VEE]
    assert result.missing[EVEN] == f"{EVEN} needs an even number of micro-batches, got 3"
    assert result.to_dict()["missing"] == dict(result.missing)
    with pytest.raises(ValueError, match="nothing to sweep.*even-chunks-plan needs an even number"):
        plan(PlanRequest(profile=profile, batch=24, device=DEVICE, gpus=[2], link=FREE, training="fp32-adam",
                         chunks=[3], schedules=[EVEN]))
    with pytest.raises(ValueError, match="virtual lists stages per device"):
        plan(PlanRequest(profile=profile, batch=24, device=DEVICE, gpus=[2], link=FREE, training="fp32-adam",
                         virtual=[0]))


# -- memory ---------------------------------------------------------------------------------------------


def test_memory_per_device_follows_the_schedule(profile: ModelProfile) -> None:
    rows = _rows(profile, ["gpipe", "1f1b", SPLIT, LOOPED], 4, 8)
    gpipe_, f1b, split = rows[("gpipe", 1)], rows[("1f1b", 1)], rows[(SPLIT, 1)]
    saved = [a / 8 for a in gpipe_.activation_bytes]  # GPipe keeps every micro-batch: 8 per device
    assert f1b.activation_bytes == tuple(round(s * (4 - d)) for d, s in enumerate(saved))  # 1F1B: n - d of them
    assert split.activation_bytes == gpipe_.activation_bytes  # W frees what B kept, after every forward
    for (name, _), row in rows.items():
        assert row.memory_bytes == tuple(p.total for p in row.memory_parts)
        for d, part in enumerate(row.memory_parts):
            assert part.total % SEGMENT_BYTES == 0 and 0 <= part.rounding < SEGMENT_BYTES
            if name in ("gpipe", "1f1b"):  # the peak: a backward, all gradients allocated
                assert part.task.startswith("B") and part.model_state == row.model_state_bytes[d]
                # the first with every saved byte held, or (Note [accumulated weight gradients] in
                # sim.planning.parallel.memory) a later one whose new weight gradient outweighs the activation freed
                # since
                assert part.saved == row.activation_bytes[d] or (part.saved < row.activation_bytes[d] and
                                                                 part.working > part.saved)
    raw = {k: [p.total - p.rounding for p in r.memory_parts] for k, r in rows.items()}
    assert raw[("1f1b", 1)] < raw[("gpipe", 1)] and raw[(LOOPED, 2)] <= raw[("gpipe", 1)]


def test_a_row_that_does_not_fit_says_so(profile: ModelProfile) -> None:
    """A device between 1F1B's peak and GPipe's: 1F1B fits, GPipe does not (no checkpointing)."""
    def sweep(device: DeviceSpec) -> list[PlanRow]:  # 1024 samples per micro-batch: 1 MiB per layer's output
        return list(plan(PlanRequest(profile=profile, batch=8192, device=device, gpus=[2], link=FREE,
                                     training="fp32-adam", chunks=[8], checkpoints=["never"],
                                     schedules=["gpipe", "1f1b"], stages=[2])).rows)

    peaks = {r.schedule: r.peak_memory_bytes for r in sweep(DEVICE)}
    assert peaks["1f1b"] < peaks["gpipe"]
    limit = (peaks["gpipe"] + peaks["1f1b"]) // 2
    rows = sweep(dataclasses.replace(DEVICE, memory_bytes=limit))
    assert {r.schedule: r.fits for r in rows} == {"gpipe": False, "1f1b": True}
    best = next(r for r in rows if r.best)
    assert best.schedule == "1f1b"


def test_the_memory_plot_follows_one_number_of_stages_per_device(profile: ModelProfile) -> None:
    from sim.planning.plan_plot import plot_memory

    result = plan(PlanRequest(profile=profile, batch=64, device=DEVICE, gpus=[2], link=FREE, training="fp32-adam",
                              chunks=[2, 4, 8], checkpoints=["never"], schedules=[LOOPED], stages=[2]))
    row = next(r for r in result.rows if r.virtual == 2)
    fig = plot_memory(result, row)
    *devices, limit = fig.axes[0].lines
    assert [line.get_label() for line in devices] == ["device 0", "device 1"]
    same = sorted((r for r in result.rows if r.virtual == 2), key=lambda r: r.chunks)
    assert list(devices[1].get_ydata()) == [r.memory_bytes[1] / 2**30 for r in same]
    assert "2 devices (2 stages each) x 1 replicas" in fig.axes[0].get_title()


# -- the command line ---------------------------------------------------------------------------------------

MODEL_FILE = f'''
import torch
from torch import nn

def build():
    layers = [nn.Linear({WIDTH}, {WIDTH}) for _ in range({LAYERS})]
    return nn.Sequential(nn.Identity(), *layers), torch.randn(4, {WIDTH})
'''


def test_cli_prints_one_row_per_schedule_and_stages_per_device(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "linears.py"
    path.write_text(MODEL_FILE)
    code = main(["plan", "--model", f"{path}:build", "--batch", "32", "--gpus", "2", "--hardware", "h100-sxm",
                 "--training", "fp32-adam", "--chunks", "4", "--checkpoint", "never",
                 "--schedule", f"1f1b,{LOOPED},{VEE}", "--virtual", "1,2", "--no-progress"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if "samples/s" in line)
    assert head.split()[:9] == ["gpus", "pp", "x", "dp", "chunks", "mb", "checkpoint", "sched", "v"]
    cells = [x.lstrip("* ").split() for x in lines[lines.index(head) + 1:] if x[:1] in "* "]
    assert {(c[1], c[5], c[6]) for c in cells} == {
        ("2x1", "1f1b", "1"), ("2x1", LOOPED, "1"), ("2x1", LOOPED, "2"), ("2x1", VEE, "2"),  # 2 devices in a row
        ("1x2", "1f1b", "1"), ("1x2", LOOPED, "1"), ("1x2", LOOPED, "2"), ("1x2", VEE, "2")}  # 1, twice
    assert any(line.startswith("best: 2 GPUs") for line in lines)


def test_cli_rejects_stages_per_device_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "gpt:125m", "--batch", "8", "--gpus", "2", "--hardware", "h100-sxm",
                 "--virtual", "0,2"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == "gpipe-sim plan: error: --virtual lists stages per device, each at least 1, got '0,2'"
