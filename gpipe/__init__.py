"""gpipe: pipeline parallelism for PyTorch, driven by the same schedule objects the simulator runs.

``from gpipe import GPipe`` is all a torchgpipe user changes. See :class:`gpipe.pipe.GPipe`.

At the top, the front-end: what a user constructs and what it decides before any step runs::

    pipe.py        GPipe: a pipeline on threads, one per device
    frontend.py    the construction GPipe and DistributedGPipe share: partitions, placement, schedules
    checks.py      the argument checks of that construction
    batchnorm.py   DeferredBatchNorm: a mini-batch's statistics over its micro-batches
    microbatch.py  sizes(), scatter() and gather(): a mini-batch into micro-batches and back
    loss.py        the loss of a whole mini-batch from per-micro-batch parts, exactly

and in folders, the layers under it::

    schedule/      the shared language, pure Python: tasks, schedules, timelines, plots (the simulator speaks it)
    interpreter/   one device's program over a schedule; the threads that run every device's
    transport/     what crosses between stages: in one process, or between ranks
    autograd/      split backward, random state, saved tensors, phase flags
    profiling/     layer profiles before a run, a step's spans during one
    distributed/   DistributedGPipe: one process per device under torchrun
    balance/       balance_by_time(), balance_by_size()
    skip/          skip connections across stages
"""

from gpipe.autograd.phase import is_checkpointing, is_recomputing
from gpipe.batchnorm import DeferredBatchNorm
from gpipe.pipe import GPipe

__all__ = ["DeferredBatchNorm", "GPipe", "is_checkpointing", "is_recomputing"]
__version__ = "0.1.0"
