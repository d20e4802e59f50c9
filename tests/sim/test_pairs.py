"""sim.calibration.pairs: pair measurements on the real partitions, rounds and their medians, and how the experiment
takes a round between its steps (Note [interleaved calibration] in sim.calibration.experiment)."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch import nn

import sim.calibration.experiment as experiment
from gpipe.profiling.profile import RecordedSeconds
from sim.calibration.experiment import Setup, run
from sim.calibration.host import Overheads
from sim.calibration.pairs import PHASE_PAIRS, PairMeter, measure_pairs, median_pairs, rebased

WINDOW, MAX_WINDOW = 0.002, 0.004  # tiny: the tests check what is measured, not how well


def two_parts() -> list[nn.Sequential]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU()), nn.Sequential(nn.Linear(16, 4))]


def batch_stats(bn: nn.BatchNorm1d) -> tuple[torch.Tensor, int]:
    assert bn.running_mean is not None and bn.num_batches_tracked is not None
    return bn.running_mean.clone(), int(bn.num_batches_tracked)


def both_ways(kinds: tuple[tuple[str, str], ...] = PHASE_PAIRS) -> set[tuple[str, int, str, int]]:
    return {(a, 0, b, 1) for a, b in kinds} | {(b, 1, a, 0) for a, b in kinds}


def test_pairs_cover_both_phases_both_ways() -> None:
    pairs = measure_pairs(two_parts(), torch.randn(4, 8), repeats=1, window=WINDOW, max_window=MAX_WINDOW)
    assert {(a, j, b, k) for a, j, b, k, _ in pairs} == both_ways()
    assert all(math.isfinite(c) and c >= 0 for *_, c in pairs)
    Overheads(pairs=pairs)  # the cost model takes them as they are


def test_median_pairs_is_the_median_of_each_pair_clipped_at_zero() -> None:
    rounds = [{("F", 0, "F", 1): 1.0, ("F", 1, "F", 0): -0.5},
              {("F", 0, "F", 1): 3.0, ("F", 1, "F", 0): -0.2},
              {("F", 0, "F", 1): 2.0, ("F", 1, "F", 0): 0.4}]
    assert median_pairs(rounds) == (("F", 0, "F", 1, 2.0), ("F", 1, "F", 0, 0.0))
    assert median_pairs(rounds[:2]) == (("F", 0, "F", 1, 2.0), ("F", 1, "F", 0, 0.0))


def test_median_pairs_refuses_no_rounds_and_mixed_rounds() -> None:
    with pytest.raises(ValueError, match="at least one round"):
        median_pairs([])
    with pytest.raises(ValueError, match="different pairs"):
        median_pairs([{("F", 0, "F", 1): 1.0}, {("B", 0, "B", 1): 1.0}])


def test_a_meter_measures_round_after_round_and_leaves_the_parts_as_they_were() -> None:
    parts = two_parts()
    bn = parts[0][1]
    assert isinstance(bn, nn.BatchNorm1d)
    for p in parts[1].parameters():
        p.grad = torch.full_like(p, 7.0)
    parts[0].eval()
    before = batch_stats(bn)
    sample = torch.randn(4, 8)
    rng = torch.random.get_rng_state()
    threads = threading.active_count()
    kinds = (("F", "F"), ("B", "B"))
    with PairMeter(parts, sample, kinds=kinds, window=WINDOW, max_window=MAX_WINDOW) as meter:
        rounds = [meter.round(), meter.round()]
        assert threading.active_count() == threads + 1  # the long-lived second thread
    assert threading.active_count() == threads
    for r in rounds:
        assert set(r) == both_ways(kinds) and all(math.isfinite(c) and c > -1 for c in r.values())
    after = batch_stats(bn)
    assert torch.equal(after[0], before[0]) and after[1] == before[1]
    assert not parts[0].training and parts[1].training
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in parts[1].parameters() if p.grad is not None)
    assert all(p.grad is None for p in parts[0].parameters())
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_a_meter_measures_only_inside_its_block() -> None:
    meter = PairMeter(two_parts(), torch.randn(4, 8), kinds=(("F", "F"),), window=WINDOW, max_window=MAX_WINDOW)
    with pytest.raises(RuntimeError, match="inside its with-block"):
        meter.round()
    with meter:
        meter.round()
    with pytest.raises(RuntimeError, match="inside its with-block"):
        meter.round()


@pytest.mark.parametrize(("window", "max_window"), [(0.0, 0.1), (0.1, 0.05)])
def test_bad_windows_are_refused(window: float, max_window: float) -> None:
    with pytest.raises(ValueError, match="window"):
        PairMeter(two_parts(), torch.randn(4, 8), window=window, max_window=max_window)


@pytest.mark.parametrize("repeats", [0, True, 1.5])
def test_bad_repeats_are_refused(repeats: object) -> None:
    with pytest.raises(ValueError, match="repeats"):
        measure_pairs(two_parts(), torch.randn(4, 8), repeats=repeats, window=WINDOW, max_window=MAX_WINDOW)  # type: ignore[arg-type]


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ArithmeticError("boom inside a partition")


def test_an_error_in_a_partition_surfaces_and_leaves_no_thread() -> None:
    threads = threading.active_count()
    with pytest.raises(ArithmeticError, match="boom inside a partition"):
        measure_pairs([nn.Linear(8, 8), Boom()], torch.randn(4, 8), repeats=1, window=WINDOW, max_window=MAX_WINDOW)
    assert threading.active_count() == threads


def test_the_experiment_takes_pair_rounds_between_its_steps_and_uses_their_medians(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost model's pairs are the medians of the rounds taken between the steps, spread over them."""
    values = iter([0.5, 3.0, 1.0, 9.0, 2.0])  # one value per round: median 2.0
    taken: list[float] = []

    def fake_round(self: PairMeter) -> dict[tuple[str, int, str, int], float]:
        value = next(values)
        taken.append(value)
        return {key: value for key in both_ways()}

    monkeypatch.setattr(PairMeter, "round", fake_round)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    outcome = run(model, torch.randn(8, 8), Setup(chunks=2, balance=(2, 2), devices=("cpu", "cpu"), steps=6,
                                                  warmup_steps=1, pair_rounds=5, warmup=0, repeats=1))
    assert taken == [0.5, 3.0, 1.0, 9.0, 2.0]
    assert outcome.cost.runner.pairs == tuple((*key, 2.0) for key in sorted(both_ways()))
    assert len(outcome.step_predictions) == 6


def test_rounds_are_spread_evenly_over_the_steps() -> None:
    assert experiment._spread(5, 17) == {3, 6, 10, 13, 16}
    assert experiment._spread(9, 4) == {0, 1, 2, 3}
    assert experiment._spread(1, 4) == {3}


def test_pair_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="pair_rounds"):
        Setup(pair_rounds=0)


def test_one_microbatch_without_checkpoints_measures_no_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """One micro-batch, no checkpoints: one task at a time, so no pair rounds, however many are asked for."""
    def no_round(self: PairMeter) -> dict[tuple[str, int, str, int], float]:
        raise AssertionError("a pair round ran for a schedule that runs one task at a time")

    monkeypatch.setattr(PairMeter, "round", no_round)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    outcome = run(model, torch.randn(8, 8), Setup(chunks=1, checkpoint="never", balance=(2, 2),
                                                  devices=("cpu", "cpu"), steps=3, warmup_steps=1, pair_rounds=5,
                                                  warmup=0, repeats=1))
    assert outcome.pair_rounds == ()
    assert len(outcome.passes) == len(outcome.step_predictions) == 3


def test_one_checkpointed_microbatch_measures_pairs() -> None:
    """One checkpointed micro-batch recomputes every stage at once: the pairs are measured and used."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    outcome = run(model, torch.randn(8, 8), Setup(chunks=1, checkpoint="always", balance=(2, 2),
                                                  devices=("cpu", "cpu"), steps=3, warmup_steps=1, pair_rounds=2,
                                                  warmup=0, repeats=1))
    assert len(outcome.pair_rounds) == 2
    assert {(a, b) for a, _, b, _, _ in outcome.cost.runner.pairs} >= {("F", "F"), ("F", "Fc"), ("B", "F")}


def test_rebased_keeps_the_added_seconds_of_each_pair() -> None:
    """Note [pair baselines]: c * (time alone in the loop) seconds added, whatever the cost model's seconds."""
    recorded = [RecordedSeconds(forward=2.0, backward=4.0, forward_nograd=1.0),
                RecordedSeconds(forward=1.0, backward=1.0, forward_nograd=0.5)]
    alone = {("F", 0): 1.0, ("B", 0): 2.0, ("Fc", 1): 0.25, ("F", 1): 1.0}
    found = rebased({("F", 0, "F", 1): 3.0, ("B", 0, "F", 1): 2.0, ("Fc", 1, "Fc", 0): 2.0,
                     ("F", 1, "F", 0): 1.5, ("B", 1, "B", 0): 0.7}, alone, recorded)
    assert found == {("F", 0, "F", 1): 1.5, ("B", 0, "F", 1): 1.0, ("Fc", 1, "Fc", 0): 1.0,
                     ("F", 1, "F", 0): 1.5,  # the same seconds alone: unchanged
                     ("B", 1, "B", 0): 0.7}  # no time alone measured: unchanged
    for (kind, stage, *_), c in found.items():  # the seconds added are the loop's
        own = {"F": recorded[stage].forward, "B": recorded[stage].backward, "Fc": recorded[stage].forward_nograd}
        if (kind, stage) in alone:
            assert own[kind] * c == pytest.approx(alone[(kind, stage)] * {
                ("F", 0): 3.0, ("B", 0): 2.0, ("Fc", 1): 2.0, ("F", 1): 1.5}[(kind, stage)])


def test_a_round_leaves_each_task_time_alone_as_its_baseline() -> None:
    kinds = (("F", "B"),)
    with PairMeter(two_parts(), torch.randn(4, 8), kinds=kinds, window=WINDOW, max_window=MAX_WINDOW) as meter:
        assert meter.alone == {}
        meter.round()
        assert set(meter.alone) == {("F", 0), ("B", 1), ("F", 1), ("B", 0)}
        assert all(seconds > 0 for seconds in meter.alone.values())


def test_the_experiment_rebases_each_round_against_the_pass_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round's c, times the meter's time alone over the seconds of the profiling pass just taken."""
    def fake_round(self: PairMeter) -> dict[tuple[str, int, str, int], float]:
        self.alone = {(kind, j): 0.004 for kind in ("F", "Fc", "B") for j in (0, 1)}
        return {key: 1.0 for key in both_ways()}

    monkeypatch.setattr(PairMeter, "round", fake_round)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    outcome = run(model, torch.randn(8, 8), Setup(chunks=2, balance=(2, 2), devices=("cpu", "cpu"), steps=3,
                                                  warmup_steps=1, pair_rounds=2, warmup=0, repeats=1))
    assert len(outcome.pair_rounds) == 2
    for k, found in outcome.pair_rounds:
        p = outcome.passes[k]
        for (kind, j, _, _), c in found.items():
            seconds = {"F": p[j].forward, "Fc": p[j].forward_nograd, "B": p[j].backward}[kind]
            assert c == pytest.approx(0.004 / seconds)


def test_measure_pairs_rebases_against_the_seconds_it_is_given() -> None:
    """Tasks a thousand seconds long in the cost model: the seconds the lock adds are nothing beside them."""
    slow = [RecordedSeconds(forward=1e3, backward=1e3, forward_nograd=1e3)] * 2
    pairs = measure_pairs(two_parts(), torch.randn(4, 8), repeats=1, window=WINDOW, max_window=MAX_WINDOW,
                          kinds=(("F", "B"),), recorded=slow)
    assert {p[:4] for p in pairs} == both_ways((("F", "B"),))
    assert all(0.0 <= c < 1e-3 for *_, c in pairs)


def test_only_stages_on_different_workers_are_paired() -> None:
    """Four stages on two workers (stage j on worker j % 2): a worker runs one task at a time, so its own stages
    are never measured together."""
    parts = [nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4)]
    with PairMeter(parts, torch.randn(4, 8), kinds=(("F", "B"),), window=WINDOW, max_window=MAX_WINDOW,
                   placement=(0, 1, 0, 1)) as meter:
        assert meter.stage_pairs == [(0, 1), (0, 3), (1, 2), (2, 3)]
        found = meter.round()
    assert {(j, k) for _, j, _, k in found} == {(0, 1), (1, 0), (0, 3), (3, 0), (1, 2), (2, 1), (2, 3), (3, 2)}
    with pytest.raises(ValueError, match="placement has 3 entries for 4 stages"):
        PairMeter(parts, torch.randn(4, 8), placement=(0, 1, 0))
