"""The torchgpipe U-Net ablation in simulation, from the counted U-Net (5, 64) on the catalog's P40."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from sim.ablation.counted import BALANCE, counted_costs, counted_unet, one_device_throughput, tuple_tensors
from sim.ablation.study import PUBLISHED, STEPS, Skip, UNetSetup, portal_slack, run, simulate_step
from sim.planning.counting.models.layers import Fork, OnFirst
from sim.planning.counting.models.unet import PopCat, unet

MB = 16  # samples per micro-batch: mini-batch 128 in 8 chunks


@pytest.fixture(scope="module")
def setup() -> UNetSetup:
    return counted_unet()


def test_each_step_is_no_slower_than_the_one_before(setup: UNetSetup) -> None:
    rows = run(setup)
    assert [r.step for r in rows] == ["baseline", "+ dependency", "+ streams", "+ portals"]
    for before, after in zip(rows, rows[1:], strict=False):
        assert after.throughput >= before.throughput, f"{after.step} is slower than {before.step}"
        assert after.utilisation >= before.utilisation, f"{after.step} is less busy than {before.step}"


def test_published_figures_are_torchgpipes(setup: UNetSetup) -> None:
    assert PUBLISHED == {"baseline": (30.662, 0.44), "+ dependency": (41.306, 0.59), "+ streams": (55.191, 0.71),
                         "+ portals": (58.477, 0.75)}
    for r in run(setup):
        assert (r.published_throughput, r.published_utilisation) == PUBLISHED[r.step]
        assert r.throughput_error == pytest.approx(r.throughput / PUBLISHED[r.step][0] - 1)


def test_rows_are_the_timelines_plus_the_optimizer_step(setup: UNetSetup) -> None:
    assert setup.update_seconds is not None
    update = max(setup.update_seconds)
    for step, row in zip(STEPS, run(setup), strict=True):
        tl = simulate_step(step, setup)
        assert row.makespan == pytest.approx(tl.makespan)
        assert row.step_seconds == pytest.approx(tl.makespan + update)
        assert row.throughput == pytest.approx(128 / (tl.makespan + update))
        busy = sum(tl.busy(d) + setup.update_seconds[d] for d in range(4))
        assert row.utilisation == pytest.approx(busy / (4 * row.step_seconds))
        assert tl.meta["copy_streams"] is step.copy_streams
        assert tl.meta["enforce_backward_order"] is step.enforce_backward_order


def test_stage_costs_are_the_counters_sums(setup: UNetSetup) -> None:
    costs = counted_costs()
    forward, backward = costs.layer_seconds(MB)
    bounds = np.cumsum([0, *BALANCE])
    for j in range(4):
        assert setup.forward[j] == pytest.approx(float(forward[bounds[j]:bounds[j + 1]].sum()), rel=1e-12)
        assert setup.backward[j] == pytest.approx(float(backward[bounds[j]:bounds[j + 1]].sum()), rel=1e-12)
    assert setup.update_seconds == tuple(costs.update_seconds(BALANCE))
    # without portals a boundary sends the whole tuple, which is what the counter saw leave the stage's last layer
    counted = costs.stages(BALANCE, MB)
    assert [s.send_bytes for s in setup.cost(portals=False).stages[:-1]] == [s.send_bytes for s in counted[:-1]]


def test_the_skips_are_unets_long_connections(setup: UNetSetup) -> None:
    # level i stashes after its encoder (layer 22 i + 20) and pops in its decoder (layer 131 + 22 (4 - i)), a
    # 64 * 2^i-channel map of (192 / 2^i)^2 fp32 pixels per sample
    bounds = np.cumsum([0, *BALANCE])
    expected = []
    for i in range(5):
        src, dst = (int(np.searchsorted(bounds, k, side="right")) - 1 for k in (22 * i + 20, 131 + 22 * (4 - i)))
        if src != dst:
            expected.append(Skip(src, dst, MB * 64 * 2**i * (192 // 2**i) ** 2 * 4))
    assert sorted(setup.skips, key=lambda s: s.bytes) == sorted(expected, key=lambda s: s.bytes)
    assert [(s.source, s.destination) for s in sorted(expected, key=lambda s: -s.bytes)] == [
        (0, 3), (1, 3), (1, 2), (1, 2), (1, 2)]


def test_portals_send_each_skip_once(setup: UNetSetup) -> None:
    with_portals, without = setup.cost(portals=True), setup.cost(portals=False)
    assert setup.skip_bytes[0] == setup.skips[-1].bytes  # only level 0's skip leaves stage 0
    for j in range(3):
        hop = sum(s.bytes for s in setup.skips if (s.source, s.destination) == (j, j + 1))
        assert with_portals.stages[j].send_bytes == setup.activation_bytes[j] + hop
        assert without.stages[j].send_bytes - with_portals.stages[j].send_bytes == setup.skip_bytes[j] - hop
    assert with_portals.stages[-1].send_bytes == without.stages[-1].send_bytes == 0


def test_the_long_portal_copies_hide_behind_compute(setup: UNetSetup) -> None:
    tl = simulate_step(STEPS[-1], setup)
    assert portal_slack(tl, setup) > 0
    # a link a thousand times slower leaves no room: the check can fail
    slow = replace(setup, link=replace(setup.link, bandwidth=setup.link.bandwidth / 1000))
    assert portal_slack(simulate_step(STEPS[-1], slow), slow) < 0


def test_free_copies_leave_only_the_dependency_step(setup: UNetSetup) -> None:
    free = replace(setup, activation_bytes=(0, 0, 0), skips=())
    base, dep, streams, portals = (r.throughput for r in run(free))
    assert dep > base * 1.05
    # what is left of a copy is the link's latency (10 us): nothing for streams or portals to win
    assert streams == pytest.approx(dep, rel=2e-3) and portals == pytest.approx(streams)


def test_one_device_throughput_is_the_counted_step() -> None:
    costs = counted_costs()
    forward, backward = costs.layer_seconds(40)
    step = float(forward.sum() + backward.sum()) + costs.update_seconds((241,))[0]
    assert one_device_throughput(40) == pytest.approx(40 / step)


def test_scaled_compute_scales_every_second_and_no_byte(setup: UNetSetup) -> None:
    half = setup.scaled_compute(0.5)
    assert half.forward == tuple(t / 2 for t in setup.forward)
    assert half.update_seconds == tuple(t / 2 for t in setup.update_seconds or ())
    assert half.activation_bytes == setup.activation_bytes and half.skips == setup.skips
    with pytest.raises(ValueError, match="> 0"):
        setup.scaled_compute(0)


def test_unet_5_64_parameters_in_closed_form() -> None:
    # torchgpipe publishes no parameter count for U-Net (5, 64); every parameter is a bias-free conv weight
    def convs(c_in: int, c_mid: int, c_out: int) -> int:
        chain = [c_in] + [c_mid] * 4 + [c_out]
        return sum(9 * a * b for a, b in zip(chain, chain[1:], strict=False))

    c = 64
    total = sum(convs(3 if i == 0 else c * 2 ** (i - 1), c * 2**i, c * 2**i) for i in range(5))
    total += convs(c * 16, c * 32, c * 16)
    total += sum(convs(c * 2 ** (i + 1), c * 2 ** (i - 1) if i else c // 2, c * 2 ** (i - 1) if i else c // 2)
                 for i in range(5))
    total += c // 2  # the 1x1 segmentation conv to one channel
    with torch.device("meta"):
        model = unet(5, 64)
    assert sum(p.numel() for p in model.parameters()) == total
    assert len(model) == sum(BALANCE) == 44 * 5 + 21


def test_tuple_tensors_follow_appends_and_pops() -> None:
    model = torch.nn.Sequential(Fork(), OnFirst(torch.nn.MaxPool2d(2)), Fork(), PopCat(), OnFirst(torch.nn.Identity()),
                                PopCat())
    activation, skips = tuple_tensors(model, torch.empty(2, 3, 8, 8))
    f = 4  # fp32 bytes
    assert activation == [2 * 3 * 64 * f, 2 * 3 * 16 * f, 2 * 3 * 16 * f, 2 * 6 * 16 * f, 2 * 6 * 16 * f,
                          2 * 9 * 64 * f]
    assert [(s.source, s.destination, s.bytes) for s in skips] == [(2, 3, 2 * 3 * 16 * f), (0, 5, 2 * 3 * 64 * f)]
    with pytest.raises(ValueError, match="never taken back"):
        tuple_tensors(torch.nn.Sequential(Fork()), torch.empty(2, 3, 8, 8))


def test_bad_setups_are_refused(setup: UNetSetup) -> None:
    with pytest.raises(ValueError, match="one entry per stage"):
        replace(setup, backward=(1.0,))
    with pytest.raises(ValueError, match="one entry per boundary"):
        replace(setup, activation_bytes=(1, 2))
    with pytest.raises(ValueError, match="ends on stage 4"):
        replace(setup, skips=(Skip(0, 4, 1),))
    with pytest.raises(ValueError, match="later one"):
        Skip(2, 2, 1)
    with pytest.raises(ValueError, match="must divide"):
        counted_unet(chunks=7)
    with pytest.raises(ValueError, match="covers 240 layers"):
        counted_unet(balance=(34, 76, 70, 60))
