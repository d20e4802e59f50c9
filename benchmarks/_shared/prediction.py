"""The simulator's prediction of the speed workload's GPipe step on this machine, and the prediction beside the step
measured (``executor_speed.py``).

Note [prediction]: the simulator's figure comes from calibrating this machine: each partition profiled at the
micro-batch size (``sim.calibration.calibrate.calibrate``), the executor's own costs measured (task overhead,
hand-off, two workers sharing the cores: ``sim.calibration.executor_costs.with_executor_costs``) and merged into the
cost model, then ``simulate(gpipe(m, n, checkpoint), cost)``. A shared machine drifts (the cores' contention measured a
few seconds apart has ranged from 0.5 to 1.9), so a run calibrates several times, spread over its timed rounds
(:func:`merge`): the prediction is their median, and every one is kept. Two bounds come with it: ``(m + n - 1) /
(m n)`` of the plain step (perfect pipelining of perfectly divisible work), and the same simulation without
overheads (what the smaller micro-batches alone allow). The prediction leaves out the loss and ``zero_grad``, which
the measured step includes (both are small here).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpipe.schedule import Checkpoint
from gpipe.schedule import gpipe as gpipe_schedule
from sim.calibration.calibrate import calibrate, on_device, partitions_of
from sim.calibration.executor_costs import with_executor_costs
from sim.calibration.host import Overheads, executor_costs, with_overheads
from sim.core.engine import simulate

from .workload import Workload

__all__ = ["compared", "merge", "predict"]


def predict(workload: Workload, modes: Sequence[Checkpoint], quick: bool) -> dict[str, Any]:
    """Calibrate on this machine and simulate GPipe for each checkpoint policy of ``modes`` (Note [prediction])."""
    model = workload.model()
    x, _ = workload.data()
    pieces = x.tensor_split(workload.m)  # (B / m, width) each
    sample = pieces[0]
    devices = ["cpu", "cpu"]
    cost = calibrate(model, workload.balance, sample, devices=devices, warmup=2 if quick else 3,
                     repeats=3 if quick else 15)
    # the executor's own costs, measured as sim.calibration.experiment measures them
    parts = [on_device(p, d) for p, d in zip(partitions_of(model, workload.balance), devices, strict=True)]
    cost, config = with_executor_costs(cost, parts, sample, devices, steps=4 if quick else 12, two_phases=True)
    overheads = executor_costs(cost).overheads
    scale = tuple(p.shape[0] / sample.shape[0] for p in pieces)
    if all(s == 1.0 for s in scale):
        scale = ()
    full = replace(cost, microbatch_scale=scale)
    ideal = with_overheads(full, Overheads())
    n = len(workload.balance)
    out: dict[str, Any] = {
        "overheads": {"task_seconds": overheads.task, "handoff_seconds": overheads.handoff,
                      "contention": overheads.contention},
        "stages": [{"forward_ms": s.forward * 1e3, "forward_checkpointed_ms": s.forward_seconds(True) * 1e3,
                    "recompute_ms": s.recompute_seconds * 1e3, "backward_ms": s.backward * 1e3}
                   for s in cost.stages],
        # Every micro-batch through every stage, one after the other: the plain step at the micro-batch size.
        "serial_microbatch_ms": sum((s.forward + s.backward) * (ideal.scale(i))
                                    for s in cost.stages for i in range(workload.m)) * 1e3,
        "m": workload.m, "n": n, "modes": {},
    }
    for mode in modes:
        schedule = gpipe_schedule(workload.m, n, mode)
        predicted = simulate(schedule, full, config)
        out["modes"][mode] = {
            "predicted_ms": predicted.makespan * 1e3,
            "without_overheads_ms": simulate(schedule, ideal, config).makespan * 1e3,
            "timeline": predicted,
        }
    return out


def merge(calibrations: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several calibrations spread over the run: per policy the median prediction, every one kept (the machine
    drifts, and one calibration caught in a slow spell must not decide the figure)."""
    last = calibrations[-1]
    merged: dict[str, Any] = {"m": last["m"], "n": last["n"], "calibrations": [
        {**{k: v for k, v in c.items() if k not in ("modes", "m", "n")},
         "predicted_ms": {mode: e["predicted_ms"] for mode, e in c["modes"].items()}} for c in calibrations]}
    merged["serial_microbatch_ms"] = statistics.median(c["serial_microbatch_ms"] for c in calibrations)
    merged["modes"] = {}
    for mode in last["modes"]:
        ranked = sorted((c["modes"][mode] for c in calibrations), key=lambda e: e["predicted_ms"])
        middle = ranked[(len(ranked) - 1) // 2]
        merged["modes"][mode] = {**middle, "predicted_ms_range": [ranked[0]["predicted_ms"],
                                                                  ranked[-1]["predicted_ms"]]}
    return merged


def compared(prediction: dict[str, Any], workload: Workload, modes: Sequence[str], measured_ms: Mapping[str, float],
             plain_ms: float, timelines: Mapping[str, Any]) -> dict[str, Any]:
    """The merged ``prediction`` beside each policy's measured step (``measured_ms``) and recorded timeline of
    median makespan (``timelines``), with the bounds of Note [prediction]; printed, and returned for the results."""
    from sim.calibration.compare import compare

    m, n = workload.m, len(workload.balance)
    bound = (m + n - 1) / (m * n)
    simulator = {k: v for k, v in prediction.items() if k != "modes"}
    simulator.update(bound_fraction_of_plain=bound, bound_ms=plain_ms * bound, modes={})
    for k, c in enumerate(prediction["calibrations"]):
        when = ("before timing", "halfway", "after timing")[k] if len(prediction["calibrations"]) == 3 else k
        over = c["overheads"]
        print(f"{'' if k else chr(10)}simulator calibrated {when}: task overhead "
              f"{over['task_seconds'] * 1e6:.1f} us, hand-off {over['handoff_seconds'] * 1e6:.1f}"
              f" us, contention {over['contention']:.2f}, stages (F + B) "
              + " ".join(f"{st['forward_ms'] + st['backward_ms']:.2f}" for st in c["stages"]) + " ms")
    print(f"bound (m + n - 1) / (m n) = {bound:.3f} of plain = {plain_ms * bound:.2f} ms; all micro-batches through "
          f"all stages serially at the micro-batch size: {prediction['serial_microbatch_ms']:.2f} ms "
          f"(plain {plain_ms:.2f} ms)")
    print(f"{'checkpoint':<13}{'measured ms':>12}{'predicted':>11}{'(range)':>14}{'no overheads':>14}"
          f"{'error':>8}{'recorded ms':>13}{'order':>7}{'busy/device: recorded vs predicted ms':>40}")
    for mode in modes:
        p = prediction["modes"][mode]
        measured = measured_ms[mode]
        entry = {"measured_ms": measured, **{k: v for k, v in p.items() if k != "timeline"},
                 "error": measured / p["predicted_ms"] - 1.0}
        tl = timelines.get(mode)
        if tl is not None:
            c = compare(p["timeline"], tl)
            entry.update(measured_timeline_ms=tl.makespan * 1e3, order_agreement=c.order_agreement,
                         start_error_mean_ms=c.start_error_mean * 1e3,
                         busy_ms_measured=[d.measured_busy * 1e3 for d in c.devices],
                         busy_ms_predicted=[d.predicted_busy * 1e3 for d in c.devices])
        simulator["modes"][mode] = entry
        spread = "{:.1f}-{:.1f}".format(*p["predicted_ms_range"])
        print(f"{mode:<13}{measured:>12.2f}{p['predicted_ms']:>11.2f}{spread:>14}{p['without_overheads_ms']:>14.2f}"
              f"{entry['error']:>+8.1%}{_cell(entry.get('measured_timeline_ms'), '.2f'):>13}"
              f"{_cell(entry.get('order_agreement'), '.0%'):>7}{_busy(entry):>40}")
    return simulator


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _busy(entry: dict[str, Any]) -> str:
    if "busy_ms_measured" not in entry:
        return "-"
    return "  ".join(f"{a:.1f} vs {b:.1f}" for a, b in zip(entry["busy_ms_measured"], entry["busy_ms_predicted"],
                                                         strict=True))
