"""The cells of notebook 07, "Write your own schedule" (``make_notebooks.py`` renders them)."""

from __future__ import annotations

from cells import answer, setup

OWN_SCHEDULE = [
    """md:# Write your own schedule

A pipeline schedule is data: for each device, the ordered list of tasks it runs. In this notebook you will

1. write a schedule by hand, as text, and let the validator check it,
2. read what the validator says when a schedule is wrong: the wrong tasks, or the grid and the waiting cycle of a
   deadlock,
3. simulate it beside GPipe and 1F1B and read time and memory,
4. register it as a generator and train a real model with it on your CPU, checking the gradients and the order
   the executor ran,
5. compare the executor's measured step with the simulator's prediction.

It runs on two CPU cores in well under a minute.""",
    setup(pyplot=False),
    """md:## A schedule by hand

Tasks are written `F2@1` (forward of micro-batch 2 on stage 1), `B2@1` (its backward), `R2@1` (the recompute a
checkpointed micro-batch runs before its backward) and `W2@1` (a weight gradient, for schedules that split the
backward). A `Schedule` holds the shape (`m` micro-batches, `n` stages), the checkpoint policy, where each stage
runs (`placement`) and each device's list.

Here is a schedule of our own for two stages and four micro-batches: *eager backwards*. The last stage runs each
micro-batch's backward as soon as its forward is done; the first stage runs its forwards first, then the
backwards in the order they arrive.""",
    """from gpipe.schedule import Schedule, ScheduleError, parse_tasks

eager = Schedule(
    m=4, n=2, checkpoint="never", placement=(0, 1),
    tasks=(parse_tasks("F0@0 F1@0 F2@0 F3@0 B0@0 B1@0 B2@0 B3@0"),
           parse_tasks("F0@1 B0@1 F1@1 B1@1 F2@1 B2@1 F3@1 B3@1")),
    name="eager",
)
print(eager.validate())""",
    """md:`validate()` returned the schedule, so it is valid: every task exactly once, on its stage's device, and no
device waits forever. The grid runs every task in one unit step, as early as its device's order and its
dependencies allow; a dot is a step where a device waits.

## When a schedule is wrong

The validator explains its refusal. A task left out (or one too many, or one on the wrong device) is named:""",
    """missing = Schedule(4, 2, "never", (0, 1),
                   (parse_tasks("F0@0 F1@0 F2@0 F3@0 B0@0 B1@0 B2@0"), eager.tasks[1]), name="missing")
try:
    missing.validate()
except ScheduleError as error:
    print(error)""",
    """md:A deadlock is subtler: every task is there, but the lists wait for each other. Here device 0 wants to run
`B0@0` before `F1@0`, while device 1 wants `F1@1` before `B0@1`. The validator prints the grid up to the step where
nothing can run, marks the stuck tasks with `>`, and names the cycle of waits:""",
    """stuck = Schedule(2, 2, "never", (0, 1),
                 (parse_tasks("F0@0 B0@0 F1@0 B1@0"), parse_tasks("F0@1 F1@1 B0@1 B1@1")), name="stuck")
try:
    stuck.validate()
except ScheduleError as error:
    print(error)""",
    """md:Read the cycle: `B0@0` waits for `B0@1` (the gradient comes from stage 1), which device 1 runs after
`F1@1`, which waits for `F1@0` (the activation comes from stage 0), which device 0 runs after `B0@0`.

## Simulating it

The simulator runs any valid schedule. Give every stage a forward of 1 ms, a backward of 2 ms, and 10 MiB that a
micro-batch keeps for its backward; then compare with GPipe and 1F1B on the same costs.""",
    """from gpipe.schedule import gpipe, one_f_one_b
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

cost = CostModel([StageCost(forward=1e-3, backward=2e-3, saved_bytes=10 * MiB)] * 2)
print(f"{'schedule':8} {'makespan':>9} {'bubble':>7} {'peak MiB per device':>20}")
for s in (gpipe(4, 2, "never"), one_f_one_b(4, 2, "never"), eager):
    tl = simulate(s, cost)
    peaks = [tl.peak_memory(d) / MiB for d in range(2)]
    print(f"{s.name:8} {tl.makespan * 1e3:7.1f}ms {tl.bubble_fraction():7.3f} {str(peaks):>20}")""",
    """md:All three take the same time here: with two stages the bubble is `(n - 1)(t_f + t_b)` whatever the
order. Memory is where they differ: GPipe keeps all four micro-batches on both devices; 1F1B keeps two on the first
and one on the last; *eager* keeps one on the last device but all four on the first, whose backwards wait until
its forwards are done.

## Your schedule in the executor

To run a schedule by name everywhere (`GPipe(schedule=...)`, the simulator's planner, `gpipe-sim simulate
--schedule`), write it as a **generator**, a function of the shape, and register it once. Ours works for any
number of stages: the last stage alternates forward and backward, the others run their forwards first.""",
    """from gpipe.schedule import SCHEDULES, Op, Task, checkpointed, register


def eager_backwards(m, n, checkpoint="never", placement=None):
    \"\"\"Forwards first on every stage but the last, which runs each backward right after its forward.\"\"\"
    def backward(i, j):
        return ([Task(Op.R, i, j)] if checkpointed(checkpoint, i, m) else []) + [Task(Op.B, i, j)]

    lists = []
    for j in range(n):
        if j == n - 1:
            lists.append([t for i in range(m) for t in [Task(Op.F, i, j)] + backward(i, j)])
        else:
            lists.append([Task(Op.F, i, j) for i in range(m)] + [t for i in range(m) for t in backward(i, j)])
    return Schedule(m, n, checkpoint, tuple(range(n)) if placement is None else placement, lists, name="eager")


if "eager" not in SCHEDULES:  # a notebook cell may run twice
    register("eager", "the last stage runs each backward right after its forward")(eager_backwards)
assert eager_backwards(4, 2) == eager
print(SCHEDULES["eager"](4, 3, "except_last").validate())""",
    """md:Now train a small model with it: four `Linear` layers in two partitions, both on the CPU, through `step()`
(a schedule whose forwards and backwards interleave trains through `step()`, which computes the loss in the last
stage's task). The loss and every gradient must be those of the model without a pipeline, and the recorded
timeline must show each device running exactly the scheduled order.""",
    """import copy

import torch
from torch import nn

from gpipe import GPipe

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
plain = copy.deepcopy(model)
x, y = torch.randn(32, 64), torch.randn(32, 64)

pipe = GPipe(model, balance=[2, 2], devices=["cpu", "cpu"], chunks=4, checkpoint="never", schedule="eager",
             record=True)
loss = pipe.step(x, y, nn.functional.mse_loss)
expected = nn.functional.mse_loss(plain(x), y)
expected.backward()

print(f"loss {loss.item():.6f}   without a pipeline {expected.item():.6f}")
print("gradients equal:", all(torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(model.parameters(),
    plain.parameters(), strict=True)))
for d in range(2):
    print(f"device {d} ran the schedule's order:", pipe.timeline.task_order(d) == list(pipe.schedule.tasks[d]))""",
    """md:## Predicted against measured

`sim.calibration.experiment.run` does the whole loop for any registered schedule: it profiles each partition,
runs recorded training steps through `step()`, simulates the same schedule from the profiled costs alone, and
compares the median measured step with the prediction. A short run (few steps) is noisy on a shared machine; the
`gpipe-sim demo --schedule NAME` command runs the same loop at full length.""",
    """from sim.calibration.experiment import run
from sim.calibration.setup import Setup

torch.manual_seed(0)
mlp = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(256, 256), nn.ReLU())])
outcome = run(mlp, torch.randn(128, 256),
              Setup(chunks=4, checkpoint="never", schedule="eager", balance=(6, 6), steps=5, warmup_steps=1,
                    pair_rounds=2))
print(f"predicted {outcome.predicted.makespan * 1e3:.1f} ms, measured {outcome.measured.makespan * 1e3:.1f} ms, "
      f"error {outcome.comparison.makespan_error:+.1%}")""",
    """from gpipe.schedule.plot import plot_side_by_side

plot_side_by_side([outcome.predicted, outcome.measured], titles=("predicted", "measured"));""",
    """md:## Exercises

**1.** Write 1F1B for `n = 2`, `m = 4` by hand (the first stage runs one forward ahead, then alternates) and
check it against `one_f_one_b(4, 2)`.""",
    """# Exercise 1: your code here
""",
    "md:" + answer("""
```python
mine = Schedule(4, 2, "never", (0, 1),
                (parse_tasks("F0@0 F1@0 B0@0 F2@0 B1@0 F3@0 B2@0 B3@0"),
                 parse_tasks("F0@1 B0@1 F1@1 B1@1 F2@1 B2@1 F3@1 B3@1")), name="1f1b")
assert mine.validate().tasks == one_f_one_b(4, 2).tasks
```
The first stage keeps at most two micro-batches' activations, the last one; that is 1F1B's memory bound
`n - j` for stage `j`."""),
    """md:**2.** Split the backward. Give every `B` of *eager* its weight gradient `W` right after it, and simulate
with `StageCost(forward=1e-3, backward=1e-3, weight=1e-3)` (the old 2 ms backward, split in half). Then move every
`W` of one device to the end of that device's list: try device 1, then device 0. Which is shorter, and why?""",
    """# Exercise 2: your code here
""",
    "md:" + answer("""
```python
def with_w(s, late_device=None):
    lists = []
    for d, ts in enumerate(s.tasks):
        out = [u for t in ts for u in ([t, Task(Op.W, t.microbatch, t.stage)] if t.op is Op.B else [t])]
        if d == late_device:
            out = [t for t in out if t.op is not Op.W] + [t for t in out if t.op is Op.W]
        lists.append(out)
    return Schedule(s.m, s.n, s.checkpoint, s.placement, lists, name=f"W late on {late_device}")

cost_w = CostModel([StageCost(forward=1e-3, backward=1e-3, weight=1e-3)] * 2)
for late in (None, 1, 0):
    print(late, f"{simulate(with_w(eager, late).validate(), cost_w).makespan * 1e3:.0f} ms")
```
14 ms with each `W` after its `B`, 13 ms with device 1's `W`s last, 17 ms with device 0's. Nothing depends on a
`W`, so a schedule may run it late. On device 1 that sends each input gradient to device 0 one `W` sooner, and the
`W`s fill the time device 1 would spend waiting while device 0 finishes its backwards. Device 0 is the last to
finish, so its `W`s moved to the end only lengthen the tail. Zero-bubble schedules (ZB-H1, ZB-V) use exactly this
freedom; the price is memory, since a micro-batch keeps what its weight gradient needs until its `W` runs."""),
    """md:**3.** Place four stages on two devices: stage `j` on device `j % 2`. Use `gpipe(4, 4, "never",
placement=[0, 1, 0, 1])`, print its grid and simulate it with `CostModel.uniform(4, 1e-3, 2e-3)`. Compare with
`gpipe(4, 2)` on twice the per-stage cost. What does the looped placement buy?""",
    """# Exercise 3: your code here
""",
    "md:" + answer("""
```python
looped = gpipe(4, 4, "never", placement=[0, 1, 0, 1])
print(looped.validate())
a = simulate(looped, CostModel.uniform(4, 1e-3, 2e-3)).makespan
b = simulate(gpipe(4, 2, "never"), CostModel.uniform(2, 2e-3, 4e-3)).makespan
print(f"looped {a * 1e3:.1f} ms, two stages {b * 1e3:.1f} ms")
```
The same work, cut in smaller stages that go round the devices twice, fills the pipeline sooner: the first
device starts its second stage while the second device works on the first. That is the idea behind interleaved
1F1B, which adds 1F1B's order to it."""),
    """md:**4.** Repair the deadlocking `stuck` schedule by changing the order on one device only.""",
    """# Exercise 4: your code here
""",
    "md:" + answer("""
```python
fixed = Schedule(2, 2, "never", (0, 1),
                 (parse_tasks("F0@0 F1@0 B0@0 B1@0"), stuck.tasks[1]), name="fixed")
print(fixed.validate())
```
Device 0 now runs `F1@0` before waiting for `B0@1`, which breaks the cycle (device 1 can run `F1@1`)."""),
]
