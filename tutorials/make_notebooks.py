"""Write the tutorial notebooks from the cells below: this file is their source.

Edit a notebook here, then run::

    .venv/bin/python tutorials/make_notebooks.py

which rewrites every ``tutorials/NN_*.ipynb`` without outputs. ``tests/docs/test_notebooks.py`` checks that
the committed notebooks match this file and executes each of them. (Keeping the cells as Python text makes
diffs readable and keeps outputs out of the repository.)

A cell is a string: one starting with ``"md:"`` is markdown, anything else is code. Exercises put their answers in
``<details><summary>Answer</summary> ... </details>`` so that a reader reveals them on purpose.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from beyond_1f1b import BEYOND_1F1B  # noqa: E402
from cells import answer as _answer  # noqa: E402
from cells import setup  # noqa: E402
from from_scratch_cells import FROM_SCRATCH  # noqa: E402
from own_schedule import OWN_SCHEDULE  # noqa: E402

BUBBLE = [
    """md:# Micro-batches and the bubble

In this notebook you will

1. build GPipe's schedule as plain data and print it as a grid,
2. simulate it and read its makespan and bubble fraction,
3. check the simulator against the closed forms `(m + n - 1)(t_f + t_b)` and `(n - 1)/(m + n - 1)`,
4. see what an unbalanced stage does to the pipeline.

Everything runs on a CPU in a few seconds.""",
    setup(),
    """md:## A schedule is data

`gpipe(m, n)` returns, for each of the `n` devices, the ordered list of tasks it runs: `F2@1` is the forward of
micro-batch 2 on stage 1, `B2@1` its backward. Printing a schedule shows each task as one unit step; a dot is a
step in which that device waits. The dots are the **bubble**.""",
    """from gpipe.schedule import gpipe

schedule = gpipe(m=4, n=3, checkpoint="never")
print(schedule)""",
    """md:Each device first runs all forwards, then all backwards, in reverse micro-batch order. Device 0 waits at
the end of the forward phase and at the start of the backward phase; the last device waits at the start and the
end. Count the dots on one device: `2 (n - 1)` steps out of `2 (m + n - 1)`.""",
    """md:## Simulating it

The simulator needs a **cost model**: how long each task takes. `CostModel.uniform` gives every stage the same
forward and backward time (seconds per micro-batch). Copies between devices are free here.""",
    """from gpipe.schedule.plot import plot_timeline
from sim.core.cost import CostModel
from sim.core.engine import simulate

m, n = 8, 4
t_f, t_b = 1e-3, 2e-3
timeline = simulate(gpipe(m, n, "never"), CostModel.uniform(n, t_f, t_b))

print(f"makespan {timeline.makespan * 1e3:.2f} ms   formula {(m + n - 1) * (t_f + t_b) * 1e3:.2f} ms")
print(f"bubble   {timeline.bubble_fraction():.3f}      formula {(n - 1) / (m + n - 1):.3f}")
plot_timeline(timeline);""",
    """md:The timeline is data too: spans `(device, stream, task, start, end)`. Here are device 0's first and last
three.""",
    """spans = timeline.compute_spans(0)
for s in spans[:3] + spans[-3:]:
    print(f"{str(s.task):6} {s.start * 1e3:6.2f} -> {s.end * 1e3:6.2f} ms")""",
    """md:## A fixed mini-batch, cut finer and finer

In practice the mini-batch is fixed and `m` decides how finely it is cut: each micro-batch's tasks take `1/m` of
the mini-batch's. Say one stage's forward of the whole mini-batch takes 4 ms and its backward 8 ms.""",
    """T_f, T_b = 4e-3, 8e-3
print(f"{'m':>3} {'makespan':>10} {'bubble':>8} {'formula':>8}")
for m in (1, 2, 4, 8, 16, 32):
    tl = simulate(gpipe(m, 4, "never"), CostModel.uniform(4, T_f / m, T_b / m))
    print(f"{m:>3} {tl.makespan * 1e3:>8.2f}ms {tl.bubble_fraction():>8.3f} {3 / (m + 3):>8.3f}")""",
    """md:The makespan falls towards `T_f + T_b` = 12 ms, the time of the work alone, as `(1 + (n - 1)/m)(T_f + T_b)`.
Here is the bubble against `m` for several pipeline depths.""",
    """ms = [1, 2, 4, 8, 16, 32]
fig, ax = plt.subplots(figsize=(6, 3.5))
for n in (2, 4, 8):
    simulated = [simulate(gpipe(m, n, "never"), CostModel.uniform(n, 1.0, 2.0)).bubble_fraction() for m in ms]
    ax.plot(ms, simulated, "o-", label=f"n={n}")
ax.set_xscale("log", base=2)
ax.set_xlabel("micro-batches m")
ax.set_ylabel("bubble fraction")
ax.legend();""",
    """md:## An unbalanced stage

The formulas assume equal stages. Make stage 1 twice as slow as the others and look at the picture: who waits
for whom?""",
    """uneven = CostModel.from_lists(forward=[1e-3, 2e-3, 1e-3, 1e-3], backward=[2e-3, 4e-3, 2e-3, 2e-3])
tl = simulate(gpipe(8, 4, "never"), uneven)
print(f"makespan {tl.makespan * 1e3:.1f} ms")
for d in range(4):
    print(f"device {d}: busy {tl.utilisation(d):.0%}")
plot_timeline(tl);""",
    """md:The slow stage is busy most of the time; every other device waits for it once per micro-batch. Balancing
the partitions matters as much as choosing `m`.

## Exercises

**1.** A pipeline has `n = 8` stages of equal cost. What is the smallest `m` whose bubble is at most 20%? Work it
out from the formula, then check it with the simulator.""",
    "md:" + _answer("""`(n - 1)/(m + n - 1) ≤ 0.2` means `7 ≤ 0.2 (m + 7)`, so `m ≥ 28`. In code:

```python
next(m for m in range(1, 100)
     if simulate(gpipe(m, 8, "never"), CostModel.uniform(8, 1.0, 2.0)).bubble_fraction() <= 0.2)
```

returns 28. This is the GPipe paper's rule of thumb `m ≥ 4n` at work (`4n = 32` gives 18%)."""),
    """# Exercise 1: your code here
""",
    """md:**2.** Predict the makespan of `gpipe(m=5, n=3)` with `t_f = 1 ms` and `t_b = 2 ms` before you simulate
it.""",
    "md:" + _answer("""`(m + n - 1)(t_f + t_b) = 7 × 3 ms = 21 ms`:

```python
simulate(gpipe(5, 3, "never"), CostModel.uniform(3, 1e-3, 2e-3)).makespan  # 0.021
```"""),
    """# Exercise 2: your code here
""",
    """md:**3.** In the unbalanced pipeline above, find a formula for the makespan. Hint: the slow stage sets the pace
once the pipeline is full; add what it takes to fill and drain.""",
    "md:" + _answer("""GPipe runs every forward before any backward, so the step is a forward phase and then a backward
phase. In each, every micro-batch must pass every stage once (the sum of the stages' times), and the slowest stage
of that phase must process the other `m - 1` micro-batches one after the other:

```
makespan = Σ_j t_f,j + (m - 1) · max_j t_f,j  +  Σ_j t_b,j + (m - 1) · max_j t_b,j
         = (5 + 7 × 2) ms + (10 + 7 × 4) ms = 57 ms
```

which is what the simulator says. Here one stage is the slowest in both directions, so the two maxima add up to
`max_j (t_f,j + t_b,j)` and the shorter `Σ_j (t_f,j + t_b,j) + (m - 1) · max_j (t_f,j + t_b,j)` gives the same;
when different stages are slowest forward and backward, only the general form is right:

```python
f, b = [1e-3, 2e-3, 1e-3, 1e-3], [2e-3, 2e-3, 4e-3, 2e-3]  # stage 1 slow forward, stage 2 slow backward
general = sum(f) + 7 * max(f) + sum(b) + 7 * max(b)  # 0.057
short = sum(f) + sum(b) + 7 * max(x + y for x, y in zip(f, b))  # 0.050: too short
simulate(gpipe(8, 4, "never"), CostModel.from_lists(forward=f, backward=b)).makespan  # 0.057
```

With equal stages it is the familiar `(m + n - 1)(t_f + t_b)`."""),
    """# Exercise 3: your code here
""",
    """md:**4.** With the mini-batch fixed (`T_f` = 4 ms, `T_b` = 8 ms per stage, `n = 4`), what makespan does the
pipeline approach as `m` grows? Why can't a real pipeline get there by taking `m` very large?""",
    "md:" + _answer("""`(1 + (n - 1)/m)(T_f + T_b) → T_f + T_b = 12 ms`. In practice tiny micro-batches use an
accelerator poorly (a kernel has a fixed launch cost and needs enough work to fill the device), every task pays a
fixed host overhead, and each copy pays a latency: the cost per micro-batch does not shrink as `1/m` forever. The
simulator can show this: give the cost model a per-task host cost (the executor's `Overheads(task=...)`, with
`sim.calibration.host.with_overheads`) and sweep `m` again."""),
    """# Exercise 4: your code here
""",
]

CHECKPOINTING = [
    """md:# Checkpointing: memory against time

GPipe holds the activations of every micro-batch at the turn from forward to backward. Checkpointing keeps only
each stage's input and recomputes the rest right before the backward. In this notebook you will

1. read the simulator's memory samples and plot memory against time,
2. compare the checkpoint policies `never`, `except_last` and `always`,
3. measure what the recompute costs in time, and where that time goes.""",
    setup(),
    """md:## The cost model

Per micro-batch and stage: forward 1 ms, backward 2 ms, 64 MiB kept for backward (`saved_bytes`) and, when the
micro-batch is checkpointed, only its 8 MiB input (`checkpoint_bytes`). The recompute costs a forward.""",
    """from gpipe.schedule.plot import plot_timeline
from gpipe.schedule import gpipe
from sim.core.cost import CostModel
from sim.core.engine import simulate

cost = CostModel.uniform(4, 1e-3, 2e-3, saved_bytes=64 * MiB, checkpoint_bytes=8 * MiB)
runs = {policy: simulate(gpipe(8, 4, policy), cost) for policy in ("never", "except_last", "always")}

print(f"{'checkpoint':12} {'makespan':>9} {'peak dev 0':>11}")
for policy, tl in runs.items():
    print(f"{policy:12} {tl.makespan * 1e3:>7.1f}ms {tl.peak_memory(0) / MiB:>8.0f}MiB")""",
    """md:## Memory against time

A timeline's memory samples are `(device, time, bytes)`: the bytes each device keeps for backward, as a step
function. `memory_series(d)` gives one device's samples in time order.""",
    """fig, ax = plt.subplots(figsize=(8, 3.5))
for policy, tl in runs.items():
    # dict() keeps the last sample of each instant (a backward frees as the next recompute allocates)
    series = list(dict(tl.memory_series(0)).items())
    ax.step([t * 1e3 for t, _ in series], [b / MiB for _, b in series], where="post", label=policy)
ax.set_xlabel("ms")
ax.set_ylabel("MiB on device 0")
ax.legend();""",
    """md:Without checkpointing, memory climbs 64 MiB per forward to `m × 64 MiB` at the turn. With checkpointing it
climbs by 8 MiB per forward; in the backward phase each recompute brings 64 MiB back while its backward runs.

## Where the recompute goes

Green bars are recomputes. Each runs right before its backward, on the same compute stream.""",
    """plot_timeline(runs["except_last"]);""",
    """never, always = runs["never"], runs["always"]
recompute = sum(s.duration for s in always.compute_spans(0) if s.task.op.value == "R")
print(f"extra time with 'always': {(always.makespan - never.makespan) * 1e3:.1f} ms "
      f"(device 0 recomputes for {recompute * 1e3:.1f} ms)")""",
    """md:With `always` the step is 8 ms longer: `m × t_r`, not `(m + n - 1) × t_r`. A recompute needs only its own
stage input, so devices further down the pipeline run theirs while they would otherwise wait for a gradient: the
recompute fills part of the bubble.

## Exercises

**1.** With `m = 16` (same micro-batch size, so the mini-batch doubles), predict device 0's peak memory under
`never` and under `except_last`. Check with the simulator.""",
    "md:" + _answer("""`never`: all 16 micro-batches at the turn, `16 × 64 = 1024 MiB`. `except_last`: 15 checkpointed
inputs and the last micro-batch's activations, `15 × 8 + 64 = 184 MiB`; later, each recompute brings back 64 MiB
just as the backward before it frees its own, so the peak stays 184 MiB.

```python
for policy in ("never", "except_last"):
    print(policy, simulate(gpipe(16, 4, policy), cost).peak_memory(0) / MiB)
```"""),
    """# Exercise 1: your code here
""",
    """md:**2.** Predict the makespan of `gpipe(16, 4, "always")` from the makespan with `never` and the rule you just
saw.""",
    "md:" + _answer("""`never`: `(16 + 3) × 3 ms = 57 ms`; `always` adds `m × t_r = 16 ms`: 73 ms.

```python
simulate(gpipe(16, 4, "always"), cost).makespan  # 0.073
```"""),
    """# Exercise 2: your code here
""",
    """md:**3.** Each device has 1 GiB for activations. Without checkpointing, how many micro-batches of this size
fit? With `except_last`? (Use the formulas, then confirm the boundary with the simulator.)""",
    "md:" + _answer("""`never`: `m × 64 MiB ≤ 1024 MiB`, so `m ≤ 16`. `except_last`: `(m - 1) × 8 + 64 ≤ 1024`, so
`m ≤ 121`. Checkpointing lets about seven times as many micro-batches in the same memory, which also shrinks the
bubble:

```python
budget = 1024 * MiB
for policy in ("never", "except_last"):
    fits = [m for m in range(1, 200) if simulate(gpipe(m, 4, policy), cost).peak_memory(0) <= budget]
    print(policy, max(fits))
```"""),
    """# Exercise 3: your code here
""",
    """md:**4.** Why does torchgpipe's default, `except_last`, leave the last micro-batch un-checkpointed? Compare
`except_last` with `always` in the table at the top.""",
    "md:" + _answer("""The last micro-batch's backward runs right after its forward (it is the first backward of the
schedule), so its activations would be recomputed immediately after being thrown away. Keeping them costs no
extra peak memory (the peak is even a little lower, 120 MiB instead of 128 MiB: the last micro-batch's
activations take the place of a recompute's, and its input is not kept besides) and saves one recompute per
device: 40 ms instead of 41 ms."""),
    """# Exercise 4: your code here
""",
]

COPY_STREAMS = [
    """md:# Copy streams: latency and overlap

Between stages, activations travel forward and gradients come back. In this notebook you will

1. price a copy from a link's latency and bandwidth,
2. compare copies on copy streams (overlapping compute) with copies on the compute stream,
3. sweep the copy time and see where copy streams stop hiding copies,
4. find the best number of micro-batches on a high-latency link.""",
    setup(),
    """md:## The price of a copy

A link copies `n` bytes in `latency + n / bandwidth` seconds. The hardware catalog has a few real ones.""",
    """from sim.planning.hardware import LINKS, get_link

for name, link in LINKS.items():
    print(f"{name:16} {link.latency * 1e6:5.0f} us  {link.bandwidth / 1e9:7.2f} GB/s   "
          f"16 MiB in {link.transfer_seconds(16 * MiB) * 1e3:6.3f} ms")""",
    """md:## Copy streams against the compute stream

Four stages, 8 micro-batches, forward 1 ms, backward 2 ms, and every copy 0.5 ms (a fixed `copy_seconds`).
`SimConfig(copy_streams=False)` puts each copy on the compute streams of both devices it joins.""",
    """from gpipe.schedule.plot import plot_side_by_side
from gpipe.schedule import gpipe
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import simulate

cost = CostModel.uniform(4, 1e-3, 2e-3, copy_seconds=0.5e-3)
with_streams = simulate(gpipe(8, 4, "never"), cost)
without = simulate(gpipe(8, 4, "never"), cost, config=SimConfig(copy_streams=False))
print(f"copy streams: {with_streams.makespan * 1e3:.1f} ms, compute stream: {without.makespan * 1e3:.1f} ms")
plot_side_by_side([with_streams, without], titles=["copy streams", "copies on the compute stream"]);""",
    """md:Grey bars are copies, drawn on the row of the device that receives them.

## Sweeping the copy time""",
    """copies = [k * 0.25e-3 for k in range(13)]
fig, ax = plt.subplots(figsize=(6, 3.5))
for streams in (True, False):
    spans = [simulate(gpipe(8, 4, "never"), CostModel.uniform(4, 1e-3, 2e-3, copy_seconds=c),
                      config=SimConfig(copy_streams=streams)).makespan for c in copies]
    ax.plot([c * 1e3 for c in copies], [s * 1e3 for s in spans], "o-", label=f"copy_streams={streams}")
ax.set_xlabel("ms per copy")
ax.set_ylabel("makespan (ms)")
ax.legend();""",
    """md:## Pricing copies by a link

Give the stages `send_bytes` (the activation sent to the next stage; the gradient coming back is as large), leave
`copy_seconds=None`, and pass the link in the configuration.""",
    """for name in ("nvlink2", "pcie4-x16", "pcie3-x16", "ethernet-100g"):
    cost = CostModel.uniform(4, 1e-3, 2e-3, copy_seconds=None, send_bytes=16 * MiB)
    tl = simulate(gpipe(8, 4, "never"), cost, config=SimConfig(link=get_link(name)))
    print(f"{name:14} makespan {tl.makespan * 1e3:6.2f} ms")""",
    """md:## Exercises

**1.** How long does a 64 MiB activation take over `ethernet-100g`? Compute it by hand from the catalog's numbers,
then with `transfer_seconds`.""",
    "md:" + _answer("""`30 µs + 67,108,864 B / 12.5 GB/s = 30 µs + 5.37 ms ≈ 5.40 ms`:

```python
get_link("ethernet-100g").transfer_seconds(64 * MiB)  # 0.0053987...
```"""),
    """# Exercise 1: your code here
""",
    """md:**2.** In the sweep with copy streams, the makespan grows by 6 ms per ms of copy time while copies are
shorter than a forward, and faster after that. Where does the 6 come from?""",
    "md:" + _answer("""With copy streams only the copies on the critical path cost time: the `n - 1 = 3` activation
copies that the first micro-batch makes on its way down (the fill) and the 3 gradient copies of the last backward
on their way up (the drain): `2 (n - 1) = 6`. Every other copy overlaps compute. Once a copy takes longer than the
forward it overlaps, copies queue on the link behind each other and the link, not the devices, sets the pace."""),
    """# Exercise 2: your code here
""",
    """md:**3.** A slow link, `LinkSpec("slow", latency=0.5e-3, bandwidth=10e9)`, joins four stages; the mini-batch's
forward takes 8 ms per stage, its backward 16 ms, and its activation is 64 MiB. Cutting it into `m` micro-batches
divides the times and the bytes by `m`, but every copy still pays the latency. Which `m` in 1, 2, 4, ... 64 gives the
shortest step?""",
    "md:" + _answer("""`m = 16` (about 40 ms). Fewer micro-batches leave a large bubble; more pay the 0.5 ms latency
more often, and once a copy is longer than the compute it overlaps, the link dominates:

```python
from sim.core.link import LinkSpec

slow = LinkSpec("slow", latency=0.5e-3, bandwidth=10e9)
for m in (1, 2, 4, 8, 16, 32, 64):
    cost = CostModel.uniform(4, 8e-3 / m, 16e-3 / m, copy_seconds=None, send_bytes=64 * MiB // m)
    print(m, simulate(gpipe(m, 4, "never"), cost, config=SimConfig(link=slow)).makespan)
```"""),
    """# Exercise 3: your code here
""",
    """md:**4.** Why is a copy recorded on the device that *receives* it?""",
    "md:" + _answer("""Because that is where it matters: the consumer's task cannot start before its input arrived,
so a copy drawn on the receiver's row ends exactly where the task it feeds may begin, and the gaps it causes are on
that row. It is also where the executor records it: on the receiving device's copy stream. The sender is free as soon
as the copy is issued (with copy streams)."""),
    """# Exercise 4: your code here
""",
]

EXECUTOR = [
    """md:# The executor against the simulator on your own machine

The other notebooks trust the simulator. This one checks it: you run a real pipeline with PyTorch on your CPU,
predict the same step with the simulator, and put the two timelines side by side. You will

1. build a small model and train it through `gpipe.GPipe` with `record=True`, which measures a **timeline** of
   each training step,
2. **calibrate** a cost model: measure the model's partitions and the executor's own overheads on this machine,
3. **simulate** the very schedule the executor ran, with those costs,
4. **compare** prediction and measurement task by task (`sim.calibration.compare.compare`) and draw them on one
   time axis,
5. change one thing, predict first, then measure.

Your numbers will differ from anyone else's: they are your machine's. On a busy machine they also differ from run
to run, so the text says what to look for rather than quoting numbers. Everything runs in well under a minute on two
CPU cores.""",
    setup(pyplot=False),
    """md:## A model and a mini-batch

Sixteen layers (eight `Linear` + `GELU` pairs), big enough that each task takes milliseconds. PyTorch gets one
intra-op thread: the pipeline's two workers then share two cores, one each.""",
    """import torch
from torch import nn

torch.set_num_threads(1)  # one thread per worker: two workers on two cores
torch.manual_seed(0)


def make_model(width=512, pairs=8):
    layers = []
    for _ in range(pairs):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


model = make_model()
batch = torch.randn(256, 512)
print(f"{len(model)} layers, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
      f"a mini-batch of {len(batch)}")""",
    """md:## Running the executor

`GPipe(model, balance, devices, chunks, checkpoint)` has torchgpipe's interface: `balance=[8, 8]` puts eight
layers in each of two partitions, `devices=["cpu", "cpu"]` gives each partition a worker thread on the CPU, and
`chunks=4` cuts every mini-batch into four micro-batches. With `record=True` every training step (a forward with
grad and its backward) leaves its measured timeline in `pipe.timeline`, and `pipe.schedule` is the schedule it ran.

The first steps of a process are slower (memory allocation, thread pools), so we run two unrecorded steps first,
then five, and keep the step of median makespan: a real step, not an average of several.""",
    """from gpipe import GPipe

balance, chunks = [8, 8], 4
pipe = GPipe(model, balance=balance, devices=["cpu", "cpu"], chunks=chunks, checkpoint="except_last", record=True)


def train_step(pipe, batch):
    \"\"\"One training step; its measured timeline. (No optimizer here: the gradients are dropped.)\"\"\"
    pipe(batch).pow(2).mean().backward()
    for p in pipe.parameters():
        p.grad = None
    return pipe.timeline


def measure(pipe, batch, steps=5, warmup=2):
    \"\"\"The timeline of the median of ``steps`` recorded steps, and all their makespans (seconds).\"\"\"
    for _ in range(warmup):
        train_step(pipe, batch)
    timelines = sorted((train_step(pipe, batch) for _ in range(steps)), key=lambda t: t.makespan)
    return timelines[len(timelines) // 2], [t.makespan for t in timelines]


measured, makespans = measure(pipe, batch)
print("step makespans:", ", ".join(f"{t * 1e3:.1f} ms" for t in makespans))
print(pipe.schedule)""",
    """md:The grid is the schedule the two workers followed: each runs its column top to bottom (`R` is the recompute of
a checkpointed micro-batch, right before its backward). The measured timeline is the same type the simulator
returns, so it draws the same way.""",
    """from gpipe.schedule.plot import plot_timeline

plot_timeline(measured, title=f"measured: makespan {measured.makespan * 1e3:.1f} ms");""",
    """md:## Calibrating a cost model

The simulator needs to know how long each task takes. `sim.calibration.calibrate.calibrate` profiles each partition
with a micro-batch of the size the pipeline runs (forward, backward, recompute, and the bytes each keeps), with the same
profiler that `gpipe.balance.balance_by_time` uses.""",
    """from sim.calibration.calibrate import calibrate, calibrate_overheads
from sim.calibration.host import with_overheads

microbatch = batch[: len(batch) // chunks]
cost = calibrate(model, balance, microbatch)
for j, s in enumerate(cost.stages):
    print(f"stage {j}: forward {s.forward * 1e3:.2f} ms, recompute {s.recompute * 1e3:.2f} ms, "
          f"backward {s.backward * 1e3:.2f} ms; keeps {s.saved_bytes / MiB:.2f} MiB, "
          f"or {s.checkpoint_bytes / MiB:.2f} MiB when checkpointed")""",
    """md:An executor costs more than its kernels. `calibrate_overheads` measures three such costs on this machine (the
site's page *The simulator's model of a device* says where each goes in the simulation):

- `task`: the host time of one task's bookkeeping,
- `handoff`: handing a result from one worker thread to another,
- `contention`: how much two workers computing at once slow each other on shared cores (0: not at all; 1: as if
  they shared one core).""",
    """overheads = calibrate_overheads(workers=2, threads_per_worker=1)
print(f"task {overheads.task * 1e6:.1f} us, hand-off {overheads.handoff * 1e6:.1f} us, "
      f"contention {overheads.contention:.2f}")
calibrated = with_overheads(cost, overheads)""",
    """md:## Predict, then compare

The simulator gets the very schedule the executor ran. Both partitions live on the same CPU, so a hand-off moves no
bytes: no link (`SimConfig(link=None)`). We simulate twice: the *ideal* pipeline (kernels only) and the
*calibrated* one (kernels and overheads).""",
    """from sim.calibration.compare import compare
from sim.core.config import SimConfig
from sim.core.engine import simulate

config = SimConfig(link=None)
ideal = simulate(pipe.schedule, cost, config)
predicted = simulate(pipe.schedule, calibrated, config)
comparison = compare(predicted, measured)
print(comparison.table())""",
    """md:How to read the table:

- **makespan**: one training step, predicted and measured; the error is `(predicted - measured) / measured`
  (negative: the simulator is optimistic).
- **task start error**: how far each task's predicted start is from its measured start, on average and at worst.
  Errors accumulate along the pipeline, so the worst is usually late in the step.
- **task duration error**: the same for durations: one task that took much longer than its calibrated cost shows
  up here.
- **task order agreement**: the fraction of pairs of tasks that ran in the same order on their device. The
  executor follows the schedule, so it should be 100%.
- per device: time computing (*busy*), the fraction spent waiting (*bubble*), and the peak bytes kept for
  backward, predicted against measured.

A picture says more: the ideal prediction, the calibrated one and the measurement on one time axis.""",
    """from gpipe.schedule.plot import plot_side_by_side

plot_side_by_side(
    [ideal, predicted, measured],
    titles=[f"ideal (kernels only): {ideal.makespan * 1e3:.1f} ms",
            f"calibrated (kernels and overheads): {predicted.makespan * 1e3:.1f} ms",
            f"measured: {measured.makespan * 1e3:.1f} ms"],
);""",
    """md:## Where is the gap?

Align the tasks and sort them by how much longer (or shorter) they ran than predicted.""",
    """pred = {s.task: s for s in predicted.compute_spans()}
gaps = sorted(measured.compute_spans(), key=lambda s: -abs(s.duration - pred[s.task].duration))
print(f"{'task':8}{'predicted':>11}{'measured':>11}")
for s in gaps[:6]:
    print(f"{str(s.task):8}{pred[s.task].duration * 1e3:>9.2f}ms{s.duration * 1e3:>9.2f}ms")
print(f"\\nmakespan: ideal {ideal.makespan * 1e3:.1f} ms, calibrated {predicted.makespan * 1e3:.1f} ms, "
      f"measured {measured.makespan * 1e3:.1f} ms")""",
    """md:If the calibrated prediction lands between the ideal one and the measurement, the overheads explain part
of the gap; if it overshoots, the calibration saw more contention than the step did (a busy moment of a shared machine:
calibrate again, or see exercise 2). The simulator treats a task as one number of seconds: whatever makes a real
task slower than its calibrated cost shows up as a duration error on that task. Typical culprits: the first task
of a phase (a worker thread just started), another process taking a core, the two workers' memory traffic, the
operating system moving a thread.
A *start* error without a duration error, on the other hand, is inherited: the task waited for an earlier one that
was late.

## Change one thing: predict first

Cut the same mini-batch into 8 micro-batches instead of 4. Each task now processes half as many samples, so
calibrate again with the smaller micro-batch, predict the new makespan, and only then measure.""",
    """chunks8 = 8
cost8 = with_overheads(calibrate(model, balance, batch[: len(batch) // chunks8]), overheads)
pipe8 = GPipe(model, balance=balance, devices=["cpu", "cpu"], chunks=chunks8, checkpoint="except_last", record=True)
predicted8 = simulate(pipe8.schedule, cost8, config)
print(f"predicted: chunks=4 {predicted.makespan * 1e3:6.1f} ms, chunks=8 {predicted8.makespan * 1e3:6.1f} ms")

measured8, _ = measure(pipe8, batch)
print(f"measured:  chunks=4 {measured.makespan * 1e3:6.1f} ms, chunks=8 {measured8.makespan * 1e3:6.1f} ms")
print(f"error with chunks=8: {compare(predicted8, measured8).makespan_error:+.1%}")""",
    """md:More micro-batches shrink the bubble, `(n - 1)/(m + n - 1)`, but each task is smaller, and a small task uses a
core less well and pays the same fixed overheads: whether 8 beats 4 depends on the model and the machine. That is
what the simulator is for: with a calibrated cost model it answers such questions before you run them.

The whole loop (balance, calibrate, simulate, measure the median step, compare, draw) is also one command,
`gpipe-sim demo` for a built-in model, and the how-to *Compare on your own model* shows it for yours.

## Exercises

**1.** Before you measure: with `checkpoint="never"` and `chunks=4`, which device's peak memory (bytes kept for
backward) changes, and by about how much? Predict with the simulator, then measure.""",
    "md:" + _answer("""Both devices keep every micro-batch's activations until its backward instead of only the stage
input, so both peaks grow: to about `m × saved_bytes` of the stage (the calibrated `saved_bytes`, four times). The
measured peaks come from autograd's saved-tensor hooks, the same count the calibration makes, so prediction and
measurement should agree closely:

```python
pipe_never = GPipe(model, balance=balance, devices=["cpu", "cpu"], chunks=4, checkpoint="never", record=True)
predicted_never = simulate(pipe_never.schedule, calibrated, config)
measured_never, _ = measure(pipe_never, batch)
for d in range(2):
    print(d, predicted_never.peak_memory(d) / MiB, measured_never.peak_memory(d) / MiB,
          "was", measured.peak_memory(d) / MiB)
```"""),
    """# Exercise 1: your code here
""",
    """md:**2.** Which of the three overheads explains most of the gap between the ideal and the calibrated
prediction? Set each to zero in turn and simulate again.""",
    "md:" + _answer("""```python
from dataclasses import replace

for name in ("task", "handoff", "contention"):
    without = with_overheads(cost, replace(overheads, **{name: 0.0}))
    print(name, simulate(pipe.schedule, without, config).makespan * 1e3)
```

Task and hand-off overheads are microseconds against tasks of milliseconds: they matter only for very small tasks
(try a model of width 64). So the answer is `contention` or nothing. While both workers compute, each runs at
`1 / (1 + contention)` of its calibrated speed, and in a pipeline both compute most of the time. On an idle machine
with a core per worker, contention is small (the workers share only caches and memory bandwidth) and the calibrated
prediction stays close to the ideal one; on a machine busy with other work, or with fewer cores than workers, it is
large and explains most of the gap."""),
    """# Exercise 2: your code here
""",
    """md:**3.** Unbalance the pipeline: `balance=[10, 6]`. Which device becomes the bottleneck? Predict the makespan
(calibrate the new partitions), then measure.""",
    "md:" + _answer("""Partition 0 now holds five of the eight layer pairs, so its tasks take about 5/4 as long and
partition 1's about 3/4: device 1 waits for device 0 once per micro-batch in the forward phase, and device 0 waits
less in the backward phase. The step is longer than with `[8, 8]`:

```python
uneven = [10, 6]
cost_uneven = with_overheads(calibrate(model, uneven, microbatch), overheads)
pipe_uneven = GPipe(model, balance=uneven, devices=["cpu", "cpu"], chunks=4, record=True)
print(simulate(pipe_uneven.schedule, cost_uneven, config).makespan * 1e3,
      measure(pipe_uneven, batch)[0].makespan * 1e3)
```

`gpipe.balance.balance_by_time(2, model, microbatch)` finds `[8, 8]` by itself: it profiles every layer and cuts
where the slowest partition is fastest."""),
    """# Exercise 3: your code here
""",
    """md:**4.** Run the *Running the executor* cell several times. Why do the makespans differ from step to step, and
why keep the median step instead of averaging the timelines?""",
    "md:" + _answer("""A real machine is noisy: other processes take cores, the operating system moves threads,
caches and the memory allocator are in different states, CPU clocks change with temperature and load. The simulator
is deterministic and knows none of it. Averaging timelines would give spans that no step ever ran (and a task order
that may not exist); the median step is a real step that is neither the luckiest nor the unluckiest. To see the
spread, look at `makespans`; to shrink it, close other programs, or compare several medians."""),
    """# Exercise 4: your code here
""",
]

ABLATION = [
    """md:# The paper's ablations

torchgpipe's paper adds its components one at a time to U-Net (5, 64) on 4 Tesla P40s with chunks 8: fork/join
(the *dependency*), copy *streams* and *portals* for the skip connections, and reports throughput and GPU
utilisation after each. `sim.planning.ablation_counted` rebuilds the experiment without assuming a single cost: it
counts the project's own U-Net on the `meta` device, times every kernel by the catalog's P40 and reads the copies'
bytes off the real boundary tensors; `sim.planning.ablation` simulates the four steps. In this notebook you will

1. run the ablation and set it beside the published figures,
2. look at the four timelines,
3. change one counted cost at a time and see which step each one moves.""",
    setup(pyplot=False),
    """from IPython.display import Markdown, display

from sim.planning.ablation import STEPS, run, simulate_step
from sim.planning.ablation_counted import counted_unet

unet = counted_unet()  # counts U-Net (5, 64) once: a few seconds
display(Markdown(unet.describe()))
print(f"{'step':14} {'simulated':>10} {'published':>10} {'util sim':>9} {'util paper':>11}")
for r in run(unet):
    print(f"{r.step:14} {r.throughput:>10.1f} {r.published_throughput:>10.1f} {r.utilisation:>9.0%} "
          f"{r.published_utilisation:>11.0%}")""",
    """md:Every simulated throughput is well below the paper's. The [ablation page](../ablation.md) shows why: the
counted kernels take about 1.5 times as long as a P40 really runs them (torchgpipe's one-GPU U-Net benchmark says
so, with no pipeline involved), and the paper's baseline pays more for its missing fork/join than the simulator's
model of it. The *steps* are what the simulator is about; read them below.

## The four timelines""",
    """from gpipe.schedule.plot import plot_side_by_side

timelines = [simulate_step(step, unet) for step in STEPS]
titles = [f"{s.name}: {t.makespan:.2f} s" for s, t in zip(STEPS, timelines, strict=True)]
plot_side_by_side(timelines, titles=titles, labels=False);""",
    """md:Read them top to bottom:

- **baseline**: no fork/join, so every gradient waits a backward before it is sent on, and the copies sit on the
  compute streams of both devices;
- **+ dependency**: the backward phase overlaps across devices again;
- **+ streams**: copies leave the compute streams and overlap compute;
- **+ portals**: the two long skips no longer ride along every boundary, so the copies of stages 0 and 1 shrink.

## Changing one cost

`counted_unet()` returns a `UNetSetup`: the counted numbers as plain per-stage seconds and bytes. It is a frozen
dataclass; `dataclasses.replace` gives a changed copy, and `run(setup)` simulates it.""",
    """from dataclasses import replace

from sim.planning.hardware import get_link


def show(setup, title):
    print(title)
    for r in run(setup):
        print(f"  {r.step:14} {r.throughput:6.1f} samples/s  {r.utilisation:4.0%}")


show(unet, "as counted (PCIe 3.0)")
show(replace(unet, link=get_link("nvlink2")), "NVLink 2.0")""",
    """md:## Exercises

**1.** On NVLink the *streams* step is worth much less than on PCIe. Why?""",
    "md:" + _answer("""Copies take about a tenth of the time on NVLink 2.0 (150 GB/s against 15.75 GB/s), so there
is little copy time left to hide: putting copies on their own streams saves what they cost, and they cost little.
The *dependency* step is still worth as much, because it is about *when* a gradient is sent, not how long it takes."""),
    """# Exercise 1: your code here
""",
    """md:**2.** Make every copy free (`activation_bytes` all zero, no `skips`). Which steps still help?""",
    "md:" + _answer("""Only *+ dependency*. Without copy time there is nothing for copy streams to hide and no bytes for
portals to save, but the missing fork/join still delays every gradient by one backward:

```python
show(replace(unet, activation_bytes=(0, 0, 0), skips=()), "free copies")
```"""),
    """# Exercise 2: your code here
""",
    """md:**3.** Double every skip tensor (`skips`, each a `Skip(source, destination, bytes)`). Which steps change
most, and why does the last one hardly move?""",
    "md:" + _answer("""The two steps without copy streams slow down most: their boundaries carry the skips, and every
byte is paid on the compute streams of both devices. *+ streams* loses a little (its copies are longer but mostly
hidden), and *+ portals* hardly moves: the long skips no longer cross the boundaries, and the short ones, stage 1 to
2, ride copy streams behind compute. So the *portals* step grows:

```python
show(replace(unet, skips=tuple(replace(s, bytes=2 * s.bytes) for s in unet.skips)), "skips twice as large")
```"""),
    """# Exercise 3: your code here
""",
    """md:**4.** Cut the same mini-batch into 16 and then 32 chunks (`counted_unet(chunks=16)`). The bubble shrinks
from `3/11` to `3/19` to `3/35`; why does 32 gain so little over 16?""",
    "md:" + _answer("""The setup is counted again at each micro-batch size, and every kernel pays a fixed cost and
runs narrower GEMMs as the micro-batch shrinks (Note [small micro-batches] in `sim.planning.costs_from_flops`): at 4
samples per micro-batch the kernels are less efficient, which eats most of what the smaller bubble gives back.

```python
show(counted_unet(chunks=16), "chunks 16")
show(counted_unet(chunks=32), "chunks 32")
```"""),
    """# Exercise 4: your code here
""",
    """md:**5.** `one_device_throughput()` predicts torchgpipe's one-P40 U-Net benchmark (`ONE_P40`: batch 40,
28.5 samples/s) from the same counts. Scale every compute second by the ratio (`unet.scaled_compute(...)`): which
steps come close to the paper, and which one stays far off?""",
    "md:" + _answer("""*+ streams* and *+ portals* come within a few percent of the paper, *+ dependency* near 10%; the
baseline stays far above it. So the kernel speed explains the later steps, and the paper's baseline pays more for
its missing fork/join than the simulator's one-backward-late model (its memory, 52.2 GiB against 19.1 GiB, shows
that it ran in a very different order):

```python
from sim.planning.ablation_counted import ONE_P40, one_device_throughput

show(unet.scaled_compute(one_device_throughput() / ONE_P40[1]), "kernels at the one-GPU speed")
```"""),
    """# Exercise 5: your code here
""",
]

PLANNING = [
    """md:# What-if capacity planning

How many GPUs of which kind, how deep a pipeline, how many micro-batches, checkpointing or not, for a model too
large to run here? The planner answers from a cost model built *without running the model*: it counts each layer's
FLOPs and bytes on PyTorch's `meta` device (nothing is allocated, so a 13-billion-parameter GPT costs nothing), divides
them by a device of the hardware catalog, and simulates every configuration. In this notebook you will

1. count a model and plan it on a GPU of the catalog,
2. read the ranked table and the recommendation,
3. ask what changes with a larger model, a memory limit, and a price.""",
    setup(pyplot=False),
    """md:## Counting a model

`get_model` knows a few real architectures (GPT sizes, ResNet-101, U-Net, AmoebaNet-D); `count_layers` runs the
model on meta tensors and records, per layer, the FLOPs and bytes of forward and backward, the activation sizes and
the parameters. The training policy says in which precision (mixed bf16 with Adam here: 16 bytes of model state per
parameter).""",
    """from sim.planning.flops import count_layers
from sim.planning.hardware import get_device
from sim.planning.models import get_model
from sim.planning.plan import default_training, plan

gpu = get_device("h100-sxm")
training = default_training(gpu)
small = get_model("gpt:1.3b")
profile = count_layers(small.module("meta"), small.sample(2, "meta"), dtype=training.torch_dtype)
print(small.description)
print(f"{len(profile)} layers, training {training.name}")""",
    """md:## Planning

`plan` sweeps GPU counts, pipeline depths (the rest of the GPUs are data-parallel replicas), chunks, checkpoint
policies and schedules; it balances each configuration, simulates it and checks it against the GPU's memory.""",
    """result = plan(profile, batch=512, device=gpu, gpus=[1, 2, 4, 8], link="nvlink", training=training,
              model_name=small.name)


def table(result, top=8):
    rows = sorted((r for r in result.rows if r.fits), key=lambda r: -r.throughput)[:top]
    print(f"{'gpus':>4} {'pp x dp':>8} {'chunks':>6} {'checkpoint':>11} {'sched':>6} {'samples/s':>10} "
          f"{'bubble':>7} {'GiB/dev':>8}")
    for r in rows:
        print(f"{r.gpus:>4} {f'{r.stages}x{r.replicas}':>8} {r.chunks:>6} {r.checkpoint:>11} {r.schedule:>6} "
              f"{r.throughput:>10.2f} {r.bubble_fraction:>7.1%} {r.peak_memory_bytes / 2**30:>8.1f}")


print(f"{len(result.rows)} configurations on {result.device} over {result.link}; the fastest that fit:")
table(result)""",
    """from sim.planning.plan_plot import plot_throughput

plot_throughput(result);""",
    """md:For a 1.3-billion-parameter model on H100s the answer is no pipeline at all: the model fits on one GPU, so
eight data-parallel replicas have no bubble, and NVLink makes their gradient all-reduce cheap.

## A model that does not fit on one GPU

A 13-billion-parameter GPT on A100s with 80 GB is another matter.""",
    """a100 = get_device("a100-80gb")
training13 = default_training(a100)
big = get_model("gpt:13b")
profile13 = count_layers(big.module("meta"), big.sample(2, "meta"), dtype=training13.torch_dtype)
result13 = plan(profile13, batch=512, device=a100, gpus=[8, 16], link="nvlink", training=training13,
                model_name=big.name)
table(result13)
best = result13.best
print(f"best: {best.gpus} GPUs as {best.stages} stages x {best.replicas} replicas, {best.chunks} chunks, "
      f"{best.schedule}, checkpoint {best.checkpoint}: {best.throughput:.2f} samples/s")""",
    """from sim.planning.plan_plot import plot_memory

plot_memory(result13, best);""",
    """md:## Exercises

**1.** On 8 A100s, what is the shallowest pipeline that fits the 13B model? Explain it with a back-of-the-envelope
count of model state alone (16 bytes per parameter).""",
    "md:" + _answer("""Four stages. Model state alone is `13e9 × 16 B ≈ 208 GB ≈ 194 GiB`: two stages would need
about 97 GiB each, more than the 80 GiB an A100 80GB reports (81,920 MiB), before a single activation. Three
stages would hold it (about 65 GiB each), but a pipeline's depth must divide the GPU count, so that every replica
gets the same pipeline: on 8 GPUs the depths are 1, 2, 4 and 8, and the planner tries only those. Four stages need
about 48 GiB each, which leaves room for the activations:

```python
fits = [r for r in result13.rows if r.fits and r.gpus == 8]
min(r.stages for r in fits)  # 4
```"""),
    """# Exercise 1: your code here
""",
    """md:**2.** The best 16-GPU configuration checkpoints (`except_last`). How much memory would the same configuration
need per device without checkpointing, and how much faster would it be if it fitted?""",
    "md:" + _answer("""Look up the row with the same GPUs, stages, chunks and schedule and `checkpoint="never"`: it
needs well over a terabyte per device (every micro-batch's activations of a quarter of a 13B GPT, at the turn),
and would be about a third faster (no recompute). Checkpointing is not optional here:

```python
same = [r for r in result13.rows if (r.gpus, r.stages, r.chunks, r.schedule)
        == (best.gpus, best.stages, best.chunks, best.schedule)]
for r in same:
    print(r.checkpoint, round(r.throughput, 2), round(r.peak_memory_bytes / 2**30), "GiB", r.fits)
```"""),
    """# Exercise 2: your code here
""",
    """md:**3.** At 2.50 USD per GPU-hour, is the fastest configuration also the cheapest per sample? Plan again with
`price_per_gpu_hour=2.5, objective="cost"`.""",
    "md:" + _answer("""No. Sixteen GPUs are fastest, but eight GPUs (4 stages × 2 replicas) deliver slightly more than
half the throughput at half the price, so they are a little cheaper per million samples. With twice the replicas each
pipeline gets half the samples, so it runs fewer micro-batches and has a larger bubble (7.1% against 5.6%), and the
all-reduce has more partners: throughput grows a little less than twofold.

```python
cheap = plan(profile13, batch=512, device=a100, gpus=[8, 16], link="nvlink", training=training13,
             price_per_gpu_hour=2.5, objective="cost")
print(cheap.best.gpus, cheap.best.cost_per_million)
```"""),
    """# Exercise 3: your code here
""",
    """md:**4.** (Open.) The planner's costs are FLOPs divided by the catalog's achievable FLOP/s plus a fixed cost per
kernel. Which of the assumptions listed on the site's page *The simulator's model of a device* would you check
first before buying the GPUs this notebook recommends?""",
    "md:" + _answer("""There is no single answer; good candidates are the efficiency factor (the fraction of peak a real
kernel reaches, an assumption per device), the all-reduce model (not overlapped with the backward, a ring over one
link), the memory model (no allocator overhead, no temporary buffers), and the network topology (every pair of GPUs
has its own link). Calibrating one stage on one real GPU (measure its forward and backward and compare with the
counted cost) checks the first and most important of these."""),
    """# Exercise 4: your code here
""",
]

NOTEBOOKS: dict[str, list[str]] = {
    "01_bubble.ipynb": BUBBLE,
    "02_checkpointing.ipynb": CHECKPOINTING,
    "03_copy_streams.ipynb": COPY_STREAMS,
    "04_executor_vs_simulator.ipynb": EXECUTOR,
    "05_capacity_planning.ipynb": PLANNING,
    "06_ablation.ipynb": ABLATION,
    "07_own_schedule.ipynb": OWN_SCHEDULE,
    "08_beyond_1f1b.ipynb": BEYOND_1F1B,
    "09_from_scratch.ipynb": FROM_SCRATCH,
}


def notebook(cells: list[str]) -> nbformat.NotebookNode:
    """A notebook without outputs from the cell strings (``"md:"`` prefix: markdown)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    for k, text in enumerate(cells):
        if text.startswith("md:"):
            cell = nbformat.v4.new_markdown_cell(text[3:].strip("\n"))
        else:
            cell = nbformat.v4.new_code_cell(text.strip("\n"))
        cell["id"] = f"cell-{k:02d}"  # stable ids: regenerating does not churn the files
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    """The text of notebook ``name`` as this script writes it."""
    return nbformat.writes(notebook(NOTEBOOKS[name])) + "\n"


def main() -> int:
    for name in NOTEBOOKS:
        (HERE / name).write_text(render(name), encoding="utf-8")
    sys.stdout.write(f"wrote {len(NOTEBOOKS)} notebooks into {HERE}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
