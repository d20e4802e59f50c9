"""What a GPU run of the fidelity experiment says about its tasks and its card: per-task seconds and clock state.

:func:`task_seconds` answers issue 26's first question, is a task's profiled cost alone its cost inside the
pipeline: per stage and kind of task, the median of the measured spans (CUDA events on a GPU, the host clock on
CPU) beside the seconds the cost model holds for it and the median of the predicted spans. :func:`gpu_state`
reads each GPU's clocks, power and temperature (``torch.cuda``, and ``nvidia-smi`` where it is installed), so a
run records the card's state before and after it.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
from typing import Any

import torch

from gpipe.schedule import Op, Schedule, Task
from gpipe.schedule.timeline import Timeline
from sim.core.cost import CostModel

__all__ = ["NVIDIA_SMI_FIELDS", "gpu_state", "profiled_seconds", "task_seconds"]

#: what ``nvidia-smi --query-gpu`` is asked for (the clock event reasons say why a clock is below its maximum)
NVIDIA_SMI_FIELDS = ("index", "pstate", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.draw", "power.limit",
                     "temperature.gpu", "utilization.gpu", "clocks_event_reasons.active")


def profiled_seconds(cost: CostModel, task: Task, checkpointed: bool) -> float:
    """The seconds the cost model holds for ``task`` alone on its device (no host cost, no contention): the
    runner's own measurement where it took one (``stage_seconds``), else the stage's profiled seconds, scaled
    to the task's micro-batch as the simulator scales them."""
    stage = cost.stages[task.stage]
    seconds = cost.runner.stage_seconds(task.op, task.stage, checkpointed)
    if seconds is None:
        seconds = {Op.F: stage.forward_seconds(checkpointed), Op.B: stage.backward, Op.R: stage.recompute_seconds,
                   Op.W: stage.weight}[task.op]
    return seconds * cost.scale(task.microbatch)


def task_seconds(schedule: Schedule, cost: CostModel, measured: Timeline, predicted: Timeline) -> list[dict[str, Any]]:
    """Per stage and kind of task (``F`` of checkpointed micro-batches apart from the others): how many tasks,
    the median measured and predicted span and the profiled seconds (medians over the micro-batches), and
    ``ratio`` = measured / profiled, 1.0 where a task inside the pipeline costs what it cost alone."""
    groups: dict[tuple[int, str, bool], list[tuple[float, float, float]]] = {}
    for task in schedule.all_tasks():
        checkpointed = schedule.is_checkpointed(task.microbatch)
        key = (task.stage, str(task.op), checkpointed and task.op is Op.F)
        groups.setdefault(key, []).append((measured.span_of(task).duration, predicted.span_of(task).duration,
                                           profiled_seconds(cost, task, checkpointed)))
    rows = []
    for (stage, op, checkpointed), samples in sorted(groups.items()):
        got, want, alone = (statistics.median(s[k] for s in samples) for k in range(3))
        rows.append({"stage": stage, "op": op, "checkpointed": checkpointed, "tasks": len(samples),
                     "measured_s": got, "predicted_s": want, "profiled_s": alone,
                     "ratio": got / alone if alone > 0 else None})
    return rows


def gpu_state() -> list[dict[str, Any]]:
    """Per CUDA device: its name and, where the driver tells, SM clock (MHz), power (mW), temperature (C) and
    utilisation (%) from ``torch.cuda``, and ``nvidia-smi``'s :data:`NVIDIA_SMI_FIELDS` where it is installed
    (``None`` for what could not be read). Empty without CUDA."""
    if not torch.cuda.is_available():
        return []
    readers = {"clock_mhz": torch.cuda.clock_rate, "power_mw": torch.cuda.power_draw,
               "temperature_c": torch.cuda.temperature, "utilization": torch.cuda.utilization}
    smi = _nvidia_smi()
    states = []
    for k in range(torch.cuda.device_count()):
        state: dict[str, Any] = {"device": f"cuda:{k}", "name": torch.cuda.get_device_name(k)}
        for name, read in readers.items():
            try:
                state[name] = read(k)
            except Exception:  # no NVML (pynvml) or a driver that does not say: recorded as unknown
                state[name] = None
        state["nvidia_smi"] = smi[k] if k < len(smi) else None
        states.append(state)
    return states


def _nvidia_smi() -> list[dict[str, str]]:
    """``nvidia-smi``'s fields per GPU, in its index order; without the clock event reasons where this driver's
    ``nvidia-smi`` does not know them; empty where it is not installed or fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    for fields in (NVIDIA_SMI_FIELDS, NVIDIA_SMI_FIELDS[:-1]):
        try:
            done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20, check=True)
        except (OSError, subprocess.SubprocessError):
            continue
        return [dict(zip(fields, (v.strip() for v in line.split(",")), strict=False))
                for line in done.stdout.splitlines() if line.strip()]
    return []
