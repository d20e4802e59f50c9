"""The cells of notebook 08, "Beyond 1F1B" (``make_notebooks.py`` renders them).

Each answer's code block runs after the notebook in the notebook test (``tests/docs/test_notebooks.py``), so an
answer states its numbers as assertions.
"""

from __future__ import annotations

from cells import answer, setup

BEYOND_1F1B = [
    """md:# Beyond 1F1B

GPipe and 1F1B leave the same bubble: on `p` devices each device waits `(p - 1)(t_f + t_b)` per step. The
schedules large models train with today attack the bubble itself, with two ideas: more, smaller stages per device
(interleaved 1F1B) and a backward split in two (the zero-bubble schedules ZB-H1, ZB-H2 and ZB-V). In this notebook
you will, each time predicting before you run,

1. measure interleaved 1F1B's bubble against the number `v` of stages per device, and what its extra sends cost,
2. watch ZB-H1 fill 1F1B's bubble with weight gradients, and ZB-H2 and ZB-V fill more of it,
3. read each schedule's memory per device, the price of filling the bubble,
4. train a small model with every one of them on your CPU: the plain model's gradients, the scheduled order, and
   the memory the simulator predicted, to the byte.

It runs on two CPU cores in seconds. The concepts are on the page [Beyond 1F1B](../concepts/beyond-1f1b.md).""",
    setup(),
    """md:## Two helpers

Every schedule here runs on `p = 4` devices with `m = 8` micro-batches. `build` makes a registered schedule for
that shape, with one stage per device or, for the schedules that place several, `v` per device. `costs` gives each
device's share of the model a forward `t_f`, an input gradient `t_b` and a weight gradient `t_w` per micro-batch,
and `A = 64 MiB` kept for backward; a stage of a `v`-stage device gets `1/v` of each, and a schedule that does not
split the backward runs `B` as one task of `t_b + t_w`.""",
    """from gpipe.schedule import SCHEDULES
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

A = 64 * MiB  # one micro-batch's activation on one device's share of the model


def build(name, m=8, p=4, v=None, checkpoint="never"):
    \"\"\"The registered schedule `name`, v stages on each of p devices (default 1, or 2 where it places several).\"\"\"
    v = v or (1 if SCHEDULES[name].place is None else 2)
    return SCHEDULES[name](m, v * p, checkpoint, devices=p)


def costs(schedule, t_f=1e-3, t_b=1e-3, t_w=1e-3, copy=0.0, weight_bytes=None):
    \"\"\"Per-stage costs: each device's share split evenly over its stages; copies of `copy` seconds.\"\"\"
    v = schedule.n // schedule.num_devices
    split = schedule.splits_weight_gradient
    stage = StageCost(forward=t_f / v, backward=(t_b if split else t_b + t_w) / v,
                      weight=t_w / v if split else 0.0, saved_bytes=A // v, checkpoint_bytes=A // 8,
                      weight_bytes=None if weight_bytes is None else weight_bytes // v)
    return CostModel((stage,) * schedule.n, copy_seconds=copy)""",
    """md:## Interleaved 1F1B: `v` stages per device

Cut the model into `n = v·p` stages and put stage `s` on device `s mod p`. Micro-batch 0 then leaves device 0
after `1/v` of its work instead of all of it, so the pipeline fills `v` times sooner. Here is the order for
`m = 4`, `p = 2`, `v = 2`: device 0 runs stages 0 and 2, and `F0@2` is micro-batch 0 back on device 0 after
stage 1.""",
    """print(build("interleaved-1f1b", m=4, p=2))""",
    """md:**Predict first.** 1F1B's step is `(m + p - 1)(t_f + t_b)`; with `v` stages per device the fill and the
drain shrink `v` times: `(m + (p - 1)/v)(t_f + t_b)`, a bubble of `(p - 1)/(m·v + p - 1)`. With `t_f = 1 ms`,
`t_b = 2 ms` (B and W as one task here), `m = 8`, `p = 4`, write down the makespan and bubble for `v = 1, 2, 4, 8`,
then run the cell.""",
    """m, p = 8, 4
print(f"{'v':>2} {'makespan':>10} {'formula':>9} {'bubble':>7} {'formula':>8}")
for v in (1, 2, 4, 8):
    tl = simulate(build("interleaved-1f1b", v=v), costs(build("interleaved-1f1b", v=v)))
    print(f"{v:>2} {tl.makespan * 1e3:>8.3f}ms {(m + (p - 1) / v) * 3:>7.3f}ms {tl.bubble_fraction():>7.3f} "
          f"{(p - 1) / (m * v + p - 1):>8.3f}")""",
    """md:The price is sends. A micro-batch now crosses `v·p - 1` stage boundaries instead of `p - 1`, and the
fill and the drain wait for their copies. Give every copy 0.25 ms and sweep `v` again:""",
    """vs = [1, 2, 4, 8]
fig, ax = plt.subplots(figsize=(6, 3.5))
for copy in (0.0, 0.25e-3):
    spans = [simulate(build("interleaved-1f1b", v=v), costs(build("interleaved-1f1b", v=v), copy=copy)).makespan
             for v in vs]
    ax.plot(vs, [s * 1e3 for s in spans], "o-", label=f"{copy * 1e3:g} ms per copy")
    print(f"{copy * 1e3:g} ms per copy:", "  ".join(f"v={v}: {s * 1e3:.2f} ms" for v, s in zip(vs, spans, strict=True)))
ax.set_xscale("log", base=2)
ax.set_xticks(vs, [str(v) for v in vs])
ax.set_xlabel("stages per device v")
ax.set_ylabel("makespan (ms)")
ax.legend();""",
    """md:With free copies every doubling of `v` halves what is left of the bubble. With 0.25 ms copies, `v = 2`
still gains, and past it the copies cost more than the smaller bubble saves.

## Splitting the backward: ZB-H1

A backward computes two things: the gradient of the stage's input, which the previous stage waits for (`B`), and
the gradient of the stage's weights, which nothing in the pipeline waits for (`W`). ZB-H1 is 1F1B with each
stage's `B` sent on at once and some of its `W`s held back: stage `j` runs `W` of the micro-batch `j` places
behind, and its last `j` weight gradients at the end, where 1F1B's device would wait.""",
    """print(build("zb-h1", m=6, p=3))""",
    """md:**Predict first.** Give `F`, `B` and `W` 1 ms each (1F1B runs `B` and `W` as one 2 ms task). 1F1B takes
`(m + p - 1)(t_f + t_b + t_w)`. In ZB-H1 a gradient travels back after `B` alone, `t_w` sooner per stage, and
a held-back `W` fills each of the `p - 1` waits: each wait shrinks by `2 t_w`, to `t_f + t_b - t_w`, and the step
is `m(t_f + t_b + t_w) + (p - 1)(t_f + t_b - t_w)`. ZB-H2 runs more forwards first and holds more `W`s back,
so each device runs without a gap from its first task to its last: `m(t_f + t_b + t_w) + (p - 1) t_f`. ZB-V runs
two stages per device in a V (device `d` holds stages `d` and `2p - 1 - d`), so every device both starts and ends
the pipeline: in a device's share of the work, `m(t_f + t_b + t_w) + (p - 1) t_f / 2`.""",
    """from gpipe.schedule.plot import plot_side_by_side

formulas = {"1f1b": (m + p - 1) * 3, "zb-h1": m * 3 + (p - 1) * 1, "zb-h2": m * 3 + (p - 1) * 1,
            "zb-v": m * 3 + (p - 1) * 0.5}  # ms, with t_f = t_b = t_w = 1 ms
split = {name: simulate(build(name), costs(build(name))) for name in formulas}
for name, tl in split.items():
    print(f"{name:6} makespan {tl.makespan * 1e3:5.2f} ms (formula {formulas[name]:5.2f})  "
          f"bubble {tl.bubble_fraction():.3f}")
plot_side_by_side([split["1f1b"], split["zb-h1"], split["zb-v"]], titles=["1F1B", "ZB-H1", "ZB-V"]);""",
    """md:In ZB-H1's picture each device's tail, where 1F1B's device waits for the last gradients, is filled with
held-back `W`s; each device still waits `(p - 1)(t_f + t_b - t_w)` = 3 ms, the last for its first input, the
first for its first gradient. With equal costs ZB-H2 reaches the same 27 ms:
every device is busy from its first forward to its last task, the least any schedule can take once the last
device has waited for its first input. The two part when `B` costs more than `W` (exercise 3). ZB-V shortens the
fill itself: its first stage-forward is half a share long.

## Memory per device

The bubble is filled with work that holds memory: a micro-batch keeps what its `B` needs until its `B`, and then
what its `W` needs until its `W`. Here a `W` keeps all that `B` held (`weight_bytes=None`). **Predict** each
device's peak in `A` before you run the next cell:

| schedule | peak on device `d`, in `A` | at `p = 4`, `m = 8` |
| --- | --- | --- |
| GPipe | `m` | 8 8 8 8 |
| 1F1B | `p - d` | 4 3 2 1 |
| interleaved 1F1B, `v` per device | `min(m·v, (v - 1)p + 2(p - 1 - d) + 1) · A/v` | 5.5 4.5 3.5 2.5 |
| ZB-H1 | `p - d` until their `B`, `d` more until their `W` | 4 4 4 4 |
| ZB-H2 | `min(m, 2p - 1)` on every device | 7 7 7 7 |
| ZB-V | at most `2p` stage-micro-batches of `A/2` | 4 4 4 4 |""",
    """names = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"]
peaks = {}
for name in names:
    tl = simulate(build(name), costs(build(name)))
    peaks[name] = [tl.peak_memory(d) / A for d in range(p)]
    print(f"{name:17} makespan {tl.makespan * 1e3:5.2f} ms   peak per device (A): {peaks[name]}")

fig, ax = plt.subplots(figsize=(7, 3.5))
width = 0.8 / len(names)
for k, name in enumerate(names):
    ax.bar([d + k * width for d in range(p)], peaks[name], width, label=name)
ax.set_xticks([d + 0.4 - width / 2 for d in range(p)], [f"device {d}" for d in range(p)])
ax.set_ylabel("peak, in A")
ax.set_ylim(0, 10)
ax.legend(fontsize=8, ncol=3, loc="upper center");""",
    """md:Read the two ends. GPipe holds every micro-batch; 1F1B's first device holds `p` and the others fewer.
Interleaving with `v = 2` adds 1.5 A on every device: its warm-up runs forwards of both stages before the
first backward. ZB-H1 keeps 1F1B's largest peak, but on every device, since each device holds back `W`s. ZB-H2
nearly doubles it (7 A) and gains nothing over ZB-H1 at equal costs (it pays off when `B` costs more than `W`,
exercise 3). ZB-V reaches the shortest step at ZB-H1's memory.

## On the executor

The executor runs the very same schedule objects. Train sixteen `Linear`/`ReLU` layers on four CPU "devices"
(one worker thread each) with every schedule, one step through `step()`, and check three things: the gradients
are the plain model's, each worker ran its device's list in order, and the bytes saved for backward (counted by
saved-tensor hooks) are what the simulator predicts from the bytes each forward held
(`timeline.meta["held_bytes"]`).""",
    """import copy

import torch
from torch import nn

from gpipe import GPipe

torch.set_num_threads(1)  # four workers on two cores: one thread each
torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(8) for layer in (nn.Linear(64, 64), nn.ReLU())])
x, y = torch.randn(64, 64), torch.randn(64, 64)
plain = copy.deepcopy(model)
nn.functional.mse_loss(plain(x), y).backward()


def train(name, checkpoint="never"):
    \"\"\"One recorded step of `name` (4 CPU devices, 8 micro-batches): the pipe, and whether its gradients agree.\"\"\"
    mine = copy.deepcopy(model)
    v = 1 if SCHEDULES[name].place is None else 2
    pipe = GPipe(mine, balance=[len(model) // (v * p)] * (v * p), devices=["cpu"] * p, chunks=m,
                 checkpoint=checkpoint, schedule=name, record=True)
    pipe.step(x, y, nn.functional.mse_loss)
    same = all(torch.allclose(a.grad, b.grad, atol=1e-6)
               for a, b in zip(mine.parameters(), plain.parameters(), strict=True))
    return pipe, same


def predicted(pipe):
    \"\"\"The simulator's timeline of the schedule `pipe` ran, with the bytes each of its tasks held (unit times).\"\"\"
    held, s = pipe.timeline.meta["held_bytes"], pipe.schedule
    stages = [StageCost(forward=1.0, backward=1.0, weight=1.0 if s.splits_weight_gradient else 0.0,
                        saved_bytes=held.get(f"R0@{j}") or held[f"F0@{j}"],
                        checkpoint_bytes=held[f"F0@{j}"] if f"R0@{j}" in held else 0) for j in range(s.n)]
    return simulate(s, CostModel(tuple(stages)))


pipes = {}
print(f"{'schedule':17} {'grads':>5} {'order':>5}  measured peak per device (KiB) = predicted")
for name in ["1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"]:
    pipe, same = train(name)
    pipes[name] = pipe
    tl = pipe.timeline
    order = all(tl.task_order(d) == list(pipe.schedule.tasks[d]) for d in range(p))
    measured = [tl.peak_memory(d) // 1024 for d in range(p)]
    sim = [predicted(pipe).peak_memory(d) // 1024 for d in range(p)]
    print(f"{name:17} {same!s:>5} {order!s:>5}  {measured} {'=' if measured == sim else '!='} {sim}")""",
    """md:Divide the schedules with one stage per device by a device's bytes per micro-batch and you get the peaks in
`A` of the section above: 1F1B's 4 3 2 1, ZB-H1's 4 4 4 4, ZB-H2's 7 7 7 7. A device keeps 6 KiB per
micro-batch, the last one 8 KiB (`pipes["zb-h1"].timeline.meta["held_bytes"]`): the loss is computed in the last
stage's forward and keeps its own tensors there. With two stages per device that extra sits on one stage of the
last device's pair, so the simple ratios bend; given each stage's bytes, the simulator still predicts every
device exactly.

Here is the measured ZB-V step. The times are your CPU's, and in a model this small they are mostly the
executor's per-task overhead; the order is the schedule's.""",
    """from gpipe.schedule.plot import plot_timeline

plot_timeline(pipes["zb-v"].timeline);""",
    """md:## Exercises

**1.** Interleaved 1F1B with as many micro-batches as devices, `m = p = 4`: predict the bubble for `v = 1, 2, 4`,
then simulate (`build("interleaved-1f1b", m=4, v=v)`).""",
    """# Exercise 1: your code here
""",
    "md:" + answer("""`(p - 1)/(m·v + p - 1)`: `3/7 = 42.9%`, `3/11 = 27.3%`, `3/19 = 15.8%`. With few micro-batches
interleaving is worth most: at `m = p` it cuts the bubble by more than half at `v = 4`.

```python
for v, bubble in ((1, 3 / 7), (2, 3 / 11), (4, 3 / 19)):
    s = build("interleaved-1f1b", m=4, v=v)
    assert abs(simulate(s, costs(s)).bubble_fraction() - bubble) < 1e-9
```"""),
    """md:**2.** In the sweep with 0.25 ms copies, `v = 8` is slower even than `v = 1`. Why? Which `v` is fastest?""",
    """# Exercise 2: your code here
""",
    "md:" + answer("""`v = 2` (32.0 ms, against 37.0 ms at `v = 1`); `v = 8` takes 44.5 ms. At `v = 8` a stage's
forward is 0.125 ms, half a copy: each hand-over now waits longer for its copy than the stage computes, so the
copies, `v·p - 1 = 31` of them on a micro-batch's way down and as many back up, set the pace instead of the
devices. Interleaving pays when a stage's compute is long against a copy.

```python
got = {v: simulate(build("interleaved-1f1b", v=v), costs(build("interleaved-1f1b", v=v), copy=0.25e-3)).makespan
       for v in (1, 2, 4, 8)}
assert min(got, key=got.get) == 2 and got[8] > got[1]
assert [round(got[v] * 1e3, 2) for v in (1, 2, 4, 8)] == [37.0, 32.0, 33.75, 44.5]
```"""),
    """md:**3.** Let the input gradient cost twice the weight gradient: `t_f = 1 ms`, `t_b = 2 ms`, `t_w = 1 ms`.
Predict the makespans of 1F1B, ZB-H1 and ZB-H2 from the formulas above, then simulate them.""",
    """# Exercise 3: your code here
""",
    "md:" + answer("""1F1B: `(8 + 3) × 4 = 44 ms`. ZB-H1: `8 × 4 + 3 × (1 + 2 - 1) = 38 ms`: each wait is
`t_f + t_b` long and a `W` fills only `t_w` of it. ZB-H2: `8 × 4 + 3 × 1 = 35 ms`: its extra forwards and
held-back `W`s fill every wait, so only the fill is left (its formula holds while `t_b ≤ 2 min(t_f, t_w)`).

```python
got = {name: simulate(build(name), costs(build(name), t_b=2e-3)).makespan for name in ("1f1b", "zb-h1", "zb-h2")}
assert [round(got[name] * 1e3, 6) for name in ("1f1b", "zb-h1", "zb-h2")] == [44, 38, 35]
```"""),
    """md:**4.** A weight gradient reads only each layer's input and output gradient, not all that `B` used. Say a
`W` keeps `A/4` (`costs(..., weight_bytes=A // 4)`). Predict the peaks per device of ZB-H1 and ZB-H2, then
simulate. Does ZB-V change?""",
    """# Exercise 4: your code here
""",
    "md:" + answer("""ZB-H1: device `d` holds `p - d` micro-batches until their `B` and `d` until their `W`:
`(p - d) + d/4` = 4, 3.25, 2.5, 1.75 A. ZB-H2: stage `j` runs `w_j = 2p - 1 - 2j` forwards first (7, 5, 3, 1)
and holds at most `min(m - w_j, 2j)` micro-batches for their `W` (0, 2, 4, 6): `w_j + min(m - w_j, 2j)/4` =
7, 5.5, 4, 2.5 A. ZB-V does not change (4 A everywhere): its peak comes while micro-batches wait for their `B`,
at an instant no micro-batch waits for its `W` alone (even `weight_bytes=0` leaves it at 4 A).

```python
quarter = {name: simulate(build(name), costs(build(name), weight_bytes=A // 4)) for name in ("zb-h1", "zb-h2", "zb-v")}
assert [quarter["zb-h1"].peak_memory(d) / A for d in range(p)] == [4, 3.25, 2.5, 1.75]
assert [quarter["zb-h2"].peak_memory(d) / A for d in range(p)] == [7, 5.5, 4, 2.5]
assert [quarter["zb-v"].peak_memory(d) / A for d in range(p)] == [4, 4, 4, 4]
```"""),
    """md:**5.** Checkpointing keeps only each stage's input until the recompute. Train ZB-H1 with
`checkpoint="always"` on the executor (`train("zb-h1", "always")`): which device holds the most, and is it less
than without checkpointing? Check the simulator's prediction too (`predicted(pipe)`).""",
    """# Exercise 5: your code here
""",
    "md:" + answer("""The last device, with 40 KiB against 32 KiB without checkpointing: checkpointing costs it memory.
Its `W`s run late, and a held-back `W` keeps the activation its recompute brought back, on top of the inputs the
later micro-batches keep; only devices whose `W`s follow their `B`s soon (device 0: 14 KiB against 24 KiB) gain.
The simulator predicts every device to the byte.

```python
pipe, same = train("zb-h1", "always")
measured = [pipe.timeline.peak_memory(d) // 1024 for d in range(p)]
assert same and measured == [predicted(pipe).peak_memory(d) // 1024 for d in range(p)]
assert measured == [14, 20, 26, 40] and pipes["zb-h1"].timeline.peak_memory(3) // 1024 == 32
```"""),
]
