"""The torchgpipe U-Net ablation in simulation: each mechanism the paper adds makes the pipeline faster."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sim.planning.ablation import PUBLISHED, STEPS, UNET, UNetSetup, run, simulate_step


def test_each_step_improves_throughput_and_utilisation() -> None:
    rows = run()
    assert [r.step for r in rows] == ["baseline", "+ dependency", "+ streams", "+ portals"]
    for before, after in zip(rows, rows[1:], strict=False):
        assert after.throughput > before.throughput, f"{after.step} does not beat {before.step}"
        assert after.utilisation > before.utilisation, f"{after.step} does not beat {before.step}"


def test_published_figures_are_the_papers() -> None:
    assert PUBLISHED == {"baseline": (30.7, 0.44), "+ dependency": (41.3, 0.59), "+ streams": (55.2, 0.71),
                         "+ portals": (58.5, 0.75)}
    for r in run():
        assert (r.published_throughput, r.published_utilisation) == PUBLISHED[r.step]


def test_rows_are_consistent_with_the_timelines() -> None:
    for step, row in zip(STEPS, run(), strict=True):
        tl = simulate_step(step)
        assert row.makespan == pytest.approx(tl.makespan)
        assert row.throughput == pytest.approx(UNET.batch / tl.makespan)
        assert row.utilisation == pytest.approx(1 - tl.bubble_fraction())
        assert tl.meta["copy_streams"] is step.copy_streams
        assert tl.meta["enforce_backward_order"] is step.enforce_backward_order


def test_the_full_configuration_is_near_the_papers_step() -> None:
    """The mini-batch size was chosen for this (docs/ablation.md says so); if the simulator changes, revisit it."""
    full = run()[-1]
    assert math.isclose(full.throughput, full.published_throughput, rel_tol=0.15)


def test_without_portals_every_crossed_boundary_carries_the_skips() -> None:
    with_portals, without = UNET.cost(portals=True), UNET.cost(portals=False)
    for j in range(UNET.devices - 1):
        assert without.stages[j].send_bytes - with_portals.stages[j].send_bytes == UNET.skip_bytes[j]
    assert with_portals.stages[-1].send_bytes == without.stages[-1].send_bytes == 0


def test_free_copies_leave_only_the_dependency_step() -> None:
    free = replace(UNET, activation_bytes=(0, 0, 0), skip_bytes=(0, 0, 0))
    base, dep, streams, portals = (r.throughput for r in run(free))
    assert dep > base * 1.1
    # what is left of a copy is the link's latency (10 us): nothing for streams or portals to win
    assert streams == pytest.approx(dep, rel=2e-3) and portals == pytest.approx(streams)


def test_rechunking_keeps_the_mini_batch() -> None:
    r16 = UNET.rechunked(16)
    assert r16.chunks == 16 and r16.batch == UNET.batch
    assert sum(r16.forward) * 16 == pytest.approx(sum(UNET.forward) * UNET.chunks)
    with pytest.raises(ValueError):
        UNET.rechunked(0)


def test_setup_rejects_wrong_lengths() -> None:
    with pytest.raises(ValueError, match="one entry per stage"):
        UNetSetup(forward=(1.0,))
    with pytest.raises(ValueError, match="one entry per boundary"):
        UNetSetup(skip_bytes=(1, 2))
