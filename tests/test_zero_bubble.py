"""Zero-bubble schedules as data: ZB-H1, ZB-H2 and ZB-V look like their diagrams, pass the validator under every
policy, hold what their docstrings say (ZB-H1 and ZB-V 1F1B's activations, ZB-H2 up to 2n - 1 per stage), and ZB-V's
layout refuses a shape it cannot place, naming the fix."""

from __future__ import annotations

import pytest

from gpipe.schedule import (
    CHECKPOINT_MODES,
    SCHEDULES,
    Checkpoint,
    Op,
    Schedule,
    Task,
    one_f_one_b,
    parse_tasks,
    schedule_kind,
    v_shape,
    zb_h1,
    zb_h2,
    zb_v,
)


def _v(device: int, p: int, text: str) -> tuple[Task, ...]:
    """``Fa0 Bb1 ...`` on ``device`` of a V over ``p`` devices: ``a`` is stage ``device``, ``b`` is ``2p-1-device``."""
    stages = {"a": device, "b": 2 * p - 1 - device}
    return tuple(Task(Op(w[0]), int(w[2:]), stages[w[1]]) for w in text.split())


def test_zb_h1_looks_like_its_diagram() -> None:
    s = zb_h1(4, 3).validate()
    assert s.tasks == (parse_tasks("F0@0 F1@0 F2@0 B0@0 W0@0 F3@0 B1@0 W1@0 B2@0 W2@0 B3@0 W3@0"),
                       parse_tasks("F0@1 F1@1 B0@1 F2@1 B1@1 W0@1 F3@1 B2@1 W1@1 B3@1 W2@1 W3@1"),
                       parse_tasks("F0@2 B0@2 F1@2 B1@2 F2@2 B2@2 W0@2 F3@2 B3@2 W1@2 W2@2 W3@2"))
    assert s.placement == (0, 1, 2) and s.splits_weight_gradient and s.name == "zb-h1"


def test_zb_h2_looks_like_its_diagram() -> None:
    """Stage j: 2n - 1 - 2j forwards, B W F triples, then B followed by a forward (2j of them) or a held-back W."""
    s = zb_h2(6, 3).validate()
    assert s.tasks == (
        parse_tasks("F0@0 F1@0 F2@0 F3@0 F4@0 B0@0 W0@0 F5@0 B1@0 W1@0 B2@0 W2@0 B3@0 W3@0 B4@0 W4@0 B5@0 W5@0"),
        parse_tasks("F0@1 F1@1 F2@1 B0@1 W0@1 F3@1 B1@1 F4@1 B2@1 F5@1 B3@1 W1@1 B4@1 W2@1 B5@1 W3@1 W4@1 W5@1"),
        parse_tasks("F0@2 B0@2 W0@2 F1@2 B1@2 F2@2 B2@2 F3@2 B3@2 F4@2 B4@2 F5@2 B5@2 W1@2 W2@2 W3@2 W4@2 W5@2"))
    assert s.placement == (0, 1, 2) and s.splits_weight_gradient and s.name == "zb-h2"
    assert zb_h2(2, 3).tasks == (parse_tasks("F0@0 F1@0 B0@0 W0@0 B1@0 W1@0"),  # fewer micro-batches: no triple
                                 parse_tasks("F0@1 F1@1 B0@1 W0@1 B1@1 W1@1"),
                                 parse_tasks("F0@2 B0@2 F1@2 B1@2 W0@2 W1@2"))


def test_zb_v_looks_like_its_diagram() -> None:
    s = zb_v(3, 4).validate()
    assert s.placement == (0, 1, 1, 0) and s.splits_weight_gradient and s.name == "zb-v"
    assert s.tasks == (_v(0, 2, "Fa0 Fa1 Fa2 Fb0 Bb0 Wb0 Fb1 Bb1 Wb1 Ba0 Wa0 Fb2 Bb2 Wb2 Ba1 Wa1 Ba2 Wa2"),
                       _v(1, 2, "Fa0 Fb0 Fa1 Fb1 Bb0 Wb0 Fa2 Ba0 Wa0 Fb2 Bb1 Wb1 Ba1 Bb2 Ba2 Wa1 Wb2 Wa2"))


def _recompute_right_before_its_backward(s: Schedule) -> None:
    for ts in s.tasks:
        for k, t in enumerate(ts):
            if t.op is Op.R:
                assert ts[k + 1] == Task(Op.B, t.microbatch, t.stage)
    assert sum(t.op is Op.R for t in s.all_tasks()) == s.n * sum(map(s.is_checkpointed, range(s.m)))


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_every_shape_and_policy_is_valid(checkpoint: Checkpoint) -> None:
    for n in range(1, 6):
        for m in range(1, 9):
            for s in (zb_h1(m, n, checkpoint).validate(), zb_h2(m, n, checkpoint).validate()):
                _recompute_right_before_its_backward(s)
                assert s.splits_weight_gradient and sorted(s.all_tasks()) == sorted(s.expected_tasks())
    for p in range(1, 5):
        for m in range(1, 2 * p + 3):
            s = zb_v(m, 2 * p, checkpoint).validate()
            _recompute_right_before_its_backward(s)
            assert s.num_devices == p and s.placement == v_shape(2 * p, p)


def test_zb_h1_and_h2_merge_several_stages_on_a_device() -> None:
    for generator in (zb_h1, zb_h2):
        for m in (1, 3, 5, 8):
            s = generator(m, 4, "except_last", placement=(0, 1, 0, 1)).validate()
            assert s.num_devices == 2 and s.stages_on(0) == (0, 2)
            assert generator(m, 4, "always", placement=(0, 0, 0, 0)).validate().num_devices == 1


def _peaks(tasks: tuple[Task, ...], until: Op) -> dict[int, int]:
    """Per stage, the most micro-batches between their ``F`` and their ``until`` in one device's list."""
    held: dict[int, set[int]] = {}
    peak: dict[int, int] = {}
    for t in tasks:
        live = held.setdefault(t.stage, set())
        if t.op is Op.F:
            live.add(t.microbatch)
        elif t.op is until:
            live.discard(t.microbatch)
        peak[t.stage] = max(peak.get(t.stage, 0), len(live))
    return peak


def test_zb_h1_holds_what_1f1b_holds_between_f_and_b() -> None:
    """Between F and B as 1F1B (n - j on stage j); between F and W at most n, 1F1B's first stage."""
    for n in range(1, 7):
        for m in range(1, 2 * n + 2):
            zb, f1b = zb_h1(m, n), one_f_one_b(m, n)
            for d in range(n):
                assert _peaks(zb.tasks[d], Op.B) == _peaks(f1b.tasks[d], Op.B) == {d: min(m, n - d)}
                assert _peaks(zb.tasks[d], Op.W) == {d: min(m, n)}


def test_zb_h2_holds_up_to_2n_minus_1_micro_batches_on_every_stage() -> None:
    """Stage j: min(m, 2n - 1 - 2j) between F and B (its warm-up), min(m, 2n - 1) between F and W."""
    for n in range(1, 7):
        for m in range(1, 3 * n + 2):
            s = zb_h2(m, n)
            for j in range(n):
                assert _peaks(s.tasks[j], Op.B) == {j: min(m, 2 * n - 1 - 2 * j)}
                assert _peaks(s.tasks[j], Op.W) == {j: min(m, 2 * n - 1)}


def test_zb_v_holds_at_most_2p_stage_activations_per_device() -> None:
    """The paper's bound: 2p (stage, micro-batch) activations between F and W, reached once m >= 2p - 1."""
    for p in range(1, 6):
        for m in range(1, 3 * p + 2):
            for d, ts in enumerate(zb_v(m, 2 * p).tasks):
                live: set[tuple[int, int]] = set()
                most = 0
                for t in ts:
                    if t.op is Op.F:
                        live.add((t.microbatch, t.stage))
                    elif t.op is Op.W:
                        live.discard((t.microbatch, t.stage))
                    most = max(most, len(live))
                assert most <= 2 * p and (most == 2 * p or m < 2 * p - 1), (p, m, d, most)


def test_the_v_layout() -> None:
    assert v_shape(6, 3) == (0, 1, 2, 2, 1, 0)
    kind = SCHEDULES["zb-v"]
    assert kind.layout(8, 4) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert kind(5, 6, devices=3).placement == (0, 1, 2, 2, 1, 0)
    with pytest.raises(ValueError, match="n = 2p: 6 stages cannot go on 2 devices; give 3 devices"):
        kind.layout(6, 2)
    with pytest.raises(ValueError, match=r"give an even number of stages \(4 or 6\)"):
        kind.layout(5, 2)
    assert SCHEDULES["zb-h1"].place is None and kind.place is v_shape


def test_zb_v_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="zb-v runs n = 2p stages.*got n=5: give an even number of stages"):
        zb_v(4, 5)
    with pytest.raises(ValueError, match=r"its own V placement \(0, 1, 1, 0\).*leave placement out or give devices=2"):
        zb_v(4, 4, placement=(0, 1, 0, 1))
    with pytest.raises(ValueError, match="zb-v runs n = 2p stages"):
        schedule_kind("zb-v")(4, 3)


def test_registered_with_their_constraints() -> None:
    for name in ("zb-h1", "zb-h2", "zb-v"):
        kind = SCHEDULES[name]
        assert kind.default_checkpoint == "never" and "splits the backward" in kind.constraints
    assert "n = 2p" in SCHEDULES["zb-v"].constraints
    assert SCHEDULES["zb-h2"].place is None and "2n-1" in SCHEDULES["zb-h2"].constraints
