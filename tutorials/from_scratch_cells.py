"""The cells of notebook 09, "Pipeline parallelism from scratch" (``make_notebooks.py`` renders them).

The loop the notebook shows and runs is in ``from_scratch.py``: spawned processes import it by name. Each answer's
code block runs after the notebook in the notebook test (``tests/docs/test_notebooks.py``), so an answer states its
numbers as assertions.
"""

from __future__ import annotations

from cells import answer, setup

FROM_SCRATCH = [
    """md:# Pipeline parallelism from scratch

Every pipeline library is, at its heart, a loop: each process runs its part of the model, receives activations
from the process before it, sends its own on, and sends gradients back. In this notebook you will

1. cut a small model in two and write 1F1B's order for each half,
2. read a complete 1F1B training step written with `torch.distributed` sends and receives, in under fifty lines,
3. run it on two processes and check its gradients against the plain model's,
4. run the same model under `gpipe.distributed.DistributedGPipe` and see which lines of the loop the library makes
   exact and general,
5. put the step the library recorded beside the simulator's prediction of it.

The processes talk through gloo on this machine's loopback interface and listen nowhere else. The notebook runs on
two CPU cores in under a minute, most of it spent starting processes (each one imports PyTorch).""",
    setup(),
    """md:## A model cut in two

The model is four `Linear(512, 512)` layers, each followed by `Tanh`; a mini-batch is 512 samples. `stages_of`
cuts it into one stage per process: rank 0 holds the first two pairs, rank 1 the last two. Each process builds the
whole model from the same seed and keeps its own stage.""",
    """import inspect

import torch

from tutorials import from_scratch

model, x = from_scratch.build()
for rank, stage in enumerate(from_scratch.stages_of(model, 2)):
    print(f"rank {rank}:", ", ".join(f"{type(layer).__name__}" for layer in stage))
print(f"mini-batch {tuple(x.shape)}")""",
    """md:## The order: 1F1B

With `m = 4` micro-batches, each rank runs four forwards and four backwards. 1F1B's order on rank `r` of `p`:
`p - 1 - r` forwards to fill the pipeline, then one forward and one backward in turn, then the backwards left. So
rank 0 holds at most two micro-batches' activations, where GPipe's order (every forward first) would hold four.
Here is the whole function, and its output beside the library's schedule of the same name:""",
    """print(inspect.getsource(from_scratch.one_f_one_b_order))

from gpipe.schedule import one_f_one_b

m = 4
library = one_f_one_b(m, 2)
for rank in range(2):
    mine = from_scratch.one_f_one_b_order(rank, 2, m)
    theirs = [(task.op.value, task.microbatch) for task in library.tasks[rank]]
    print(f"rank {rank}: {' '.join(f'{op}{i}' for op, i in mine):24}  the library's order: {mine == theirs}")
print()
print(library)""",
    """md:## The loop

`train_step` runs one rank's tasks in that order. A forward `F i` takes micro-batch `i` (the first rank reads the
input; the others receive the previous rank's output), runs the stage and sends the output on, keeping its input
and output for the backward. A backward `B i` receives the gradient of that output from the next rank (the last
rank starts from the loss instead), runs `backward` through the stage, and sends the gradient of the stage's input
back. The last rank divides each micro-batch's loss by `m`, so the gradients add up to those of the whole
mini-batch's mean.

Two things to notice. Sends are `isend`: they return at once and complete later. On gloo a blocking `send` returns
only once the other rank has posted its receive, and in 1F1B both ranks send at the same moment (rank 0 the
activation of micro-batch 1, rank 1 the gradient of micro-batch 0): two blocking sends would wait for each other
forever. And every receive knows its shape in advance, `(rows / m, 512)`: a hand-written loop knows its model.""",
    """source = inspect.getsource(from_scratch.train_step)
print(source)
print(f"{len(source.splitlines())} lines")""",
    """md:## Two processes

`from_scratch.run` spawns one process per rank. Each joins a gloo group on the loopback interface, runs
`train_step` on its stage, and returns its gradients; then, on a fresh copy of the same model, it runs one step of
the library. Every wait is bounded: a receive that nobody answers fails after `wait` seconds, a rank that fails
sends its traceback here, and no process outlives the call.""",
    """import time

t0 = time.perf_counter()
result = from_scratch.run(world=2, m=4)
print(f"one step by hand and one by the library on two processes: {time.perf_counter() - t0:.1f} s")
for rank, report in enumerate(result.reports):
    print(f"rank {rank}: sent {report['sent']} messages, held at most {report['peak_kept']} micro-batch(es)")

loss, plain = from_scratch.plain_gradients()
by_hand = max((result.scratch[k] - plain[k]).abs().max().item() for k in plain)
by_library = max((result.library[k] - plain[k]).abs().max().item() for k in plain)
print(f"loss: plain model {loss:.6f}, by hand {result.reports[-1]['loss']:.6f}, library {result.library_loss:.6f}")
print(f"largest difference from the plain model's gradients: by hand {by_hand:.1e}, library {by_library:.1e}")
assert all(torch.allclose(result.scratch[k], plain[k], atol=1e-6) for k in plain)
assert all(torch.allclose(result.library[k], plain[k], atol=1e-6) for k in plain)""",
    """md:Both match the plain model to rounding: cutting a model into stages and micro-batches changes where and when
each operation runs, not what it computes.

## The same model in the library

In each rank, the library's step is three lines:

```python
pipe = DistributedGPipe(model, [4, 4], chunks=4, checkpoint="never", schedule="1f1b")
loss = pipe.step(x if rank == 0 else None, target if rank == 1 else None, nn.functional.mse_loss)
pipe.close()
```

It is the same loop, each hard-coded line made exact and general:

| the loop above | `DistributedGPipe` |
| --- | --- |
| 1F1B's order, written in the loop | any schedule, as data: GPipe, 1F1B, interleaved, zero-bubble, yours |
| one stage per rank, ranks in a chain | several stages per rank where a schedule places them (interleaved, V) |
| receives of a shape it knows | shapes and structure exchanged once, a mismatch refused before a step |
| the loss divided by `m`, equal micro-batches | the plain model's loss, uneven micro-batches, any reduction |
| a receive that hangs until gloo's timeout | every wait bounded; a failure reaches every rank, naming the task |
| keeps every activation | checkpointing with recompute, random draws replayed exactly, skip connections |
| nothing to see | a recorded timeline of every task and copy, gathered to rank 0 on one clock |

The last row is the next section.""",
    """md:## Measured against predicted

`run_processes` (what `gpipe-sim demo --processes 2` runs) takes the same model on two ranks: they time the link
between them by ping-pong, train a few steps with `DistributedGPipe` recording each (`pipe.gather_timeline()`), and
after every step each rank times its own stage's forward and backward. The simulator then predicts the same 1F1B
step from those seconds and the link, and the step of median length is compared with the prediction.""",
    """from sim.calibration.processes import run_processes
from sim.calibration.setup import Setup

t0 = time.perf_counter()
setup = Setup(chunks=4, checkpoint="never", schedule="1f1b", balance=(4, 4), steps=5)
outcome = run_processes(from_scratch.build, setup, 2, timeout=50)
print(f"calibrated, trained {setup.warmup_steps + setup.steps} steps and predicted: {time.perf_counter() - t0:.1f} s")
print(f"link: latency {outcome.link.latency * 1e6:.0f} us, {outcome.link.bandwidth / 1e9:.2f} GB/s")
print()
print(outcome.comparison.table())""",
    """from gpipe.schedule.plot import plot_side_by_side

plot_side_by_side([outcome.predicted, outcome.measured],
                  titles=[f"predicted: {outcome.predicted.makespan * 1e3:.1f} ms",
                          f"measured on two processes: {outcome.measured.makespan * 1e3:.1f} ms"]);""",
    """md:Read the table from the bottom. The order agrees everywhere, and the peak memory per rank is predicted to the
byte: both follow from the schedule alone. The times are the hard part: two processes on two cores share them with
gloo's threads and with whatever else the machine runs, so a step varies from one to the next (the table compares
the median one), and the prediction's error here is a fact about this machine at this moment as much as about the
model. The page [The simulator's model of a device](../concepts/simulator-model.md) says what the prediction models
and what it leaves out.

## Exercises""",
    """md:**1.** Feed the loop GPipe's order instead: every forward, then every backward in reverse. Predict first: do
the gradients change? How many micro-batches does each rank hold at once, under each order?""",
    "md:" + answer("""The gradients do not change (the same operations, in another order), but memory does: under
GPipe's order every rank holds all `m = 4` micro-batches before its first backward, where 1F1B holds `p - r`: two
on rank 0, one on rank 1.

```python
def gpipe_order(rank, world, m):
    return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]


other = from_scratch.run(orders=[gpipe_order(r, 2, 4) for r in range(2)])
assert all(torch.allclose(other.scratch[k], plain[k], atol=1e-6) for k in plain)
assert [r["peak_kept"] for r in other.reports] == [4, 4]
assert [r["peak_kept"] for r in result.reports] == [2, 1]
```"""),
    """# Exercise 1: your code here
""",
    """md:**2.** How many messages does each rank send in a step, and how many bytes cross between the two ranks in
each direction?""",
    "md:" + answer("""Each rank sends `m = 4`: rank 0 one activation per micro-batch, rank 1 one gradient per
micro-batch. Each message is a micro-batch's boundary tensor, `128 × 512` float32 values (256 KiB), so 1 MiB goes
each way per step, whatever the order.

```python
rows, width = from_scratch.ROWS // 4, from_scratch.WIDTH
assert [r["sent"] for r in result.reports] == [4, 4]
assert 4 * rows * width * 4 == 2**20
```"""),
    """# Exercise 2: your code here
""",
    """md:**3.** Give the ranks orders that disagree: rank 0 runs 1F1B, rank 1 GPipe's order. Predict what happens,
then run it with `wait=3` (each receive gives up after three seconds).""",
    "md:" + answer("""A deadlock. Rank 0 runs `F0 F1` and then waits for the gradient of micro-batch 0; rank 1 runs
`F0 F1` and then waits for micro-batch 2's activation, which rank 0 sends only after that gradient. Neither message
ever comes, so the first receive to time out fails its rank, and the error reaches the notebook with that rank's
traceback (gloo's "Timed out waiting 3000ms for recv"). Notebook 07's
validator finds the same cycle on paper, before anything runs.

```python
orders = [from_scratch.one_f_one_b_order(0, 2, 4), [("F", i) for i in range(4)] + [("B", i) for i in (3, 2, 1, 0)]]
try:
    from_scratch.run(orders=orders, wait=3)
except RuntimeError as error:
    print(str(error).splitlines()[0], "...", str(error).splitlines()[-1])
    assert str(error).startswith("rank ")
else:
    raise AssertionError("the ranks should have waited for each other")
```"""),
    """# Exercise 3: your code here
""",
    """md:**4.** Run the loop on three processes (`run(world=3)`). What in `train_step` has to change? What does each
rank hold at most?""",
    "md:" + answer("""Nothing changes: the loop only ever talks to `rank - 1` and `rank + 1`, and the order comes from
`one_f_one_b_order(rank, 3, m)`. The first rank now fills the pipeline with two forwards, so the ranks hold 3, 2
and 1 micro-batches, `p - r`, and the gradients still match.

```python
three = from_scratch.run(world=3)
assert [r["peak_kept"] for r in three.reports] == [3, 2, 1]
assert all(torch.allclose(three.scratch[k], plain[k], atol=1e-6) for k in plain)
```"""),
    """# Exercise 4: your code here
""",
    """md:**5.** Use the calibrated costs to ask the simulator a what-if: a mini-batch twice as large, cut into
`m = 8` micro-batches of the same size. Does the step take twice as long?""",
    "md:" + answer("""No: the work doubles but the fill and the drain do not. 1F1B on two balanced stages takes
`(m + 1)(t_f + t_b)`, so going from `m = 4` to `m = 8` multiplies the step by about `9/5`, and the bubble shrinks
from about `1/5` to about `1/9`.

```python
from sim.calibration.processes import process_config
from sim.core.engine import simulate

eight = simulate(one_f_one_b(8, 2), outcome.cost, process_config(outcome.link))
print(f"m=4: {outcome.predicted.makespan * 1e3:.1f} ms, bubble {outcome.predicted.bubble_fraction():.0%}; "
      f"m=8: {eight.makespan * 1e3:.1f} ms, bubble {eight.bubble_fraction():.0%}")
assert outcome.predicted.makespan < eight.makespan < 2 * outcome.predicted.makespan
assert eight.bubble_fraction() < outcome.predicted.bubble_fraction()
```"""),
    """# Exercise 5: your code here
""",
]
