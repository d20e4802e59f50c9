"""gpipe: pipeline parallelism for PyTorch, driven by the same schedule objects the simulator runs.

``from gpipe import GPipe`` is all a torchgpipe user changes. See :class:`gpipe.pipe.GPipe`.

In layers, each importing only the layers below it (``tests/test_imports.py`` holds them), the top first::

    pipe.py        GPipe: a pipeline on threads, one per device
    distributed/   DistributedGPipe: one process per device under torchrun
    balance/       balance_by_time(), balance_by_size()
    ---
    frontend.py    the construction GPipe and DistributedGPipe share: partitions, placement, schedules
    ---
    profiling/     layer profiles before a run (balancing, calibration)
    ---
    interpreter/   one device's program over a schedule, its recorded spans; the threads that run every device's
    ---
    transport/     what crosses between stages, behind one interface: in one process, or between ranks
    ---
    autograd/      split backward, random state, saved tensors, phase flags
    skip/          skip connections across stages: declared, and where each is stashed and popped
    checks.py      the argument checks of a pipeline's construction
    microbatch.py  sizes(), scatter() and gather(): a mini-batch into micro-batches and back
    loss.py        the loss of a whole mini-batch from per-micro-batch parts, exactly
    batchnorm.py   DeferredBatchNorm: a mini-batch's statistics over its micro-batches
    ---
    schedule/      the shared language, pure Python: tasks, schedules, timelines, plots (the simulator speaks it)

Note [torch on first use]: ``import gpipe.schedule`` runs this file first, and the shared language must not pay for
torch (the simulator imports it alone). So the executor's names below are imported from their modules on first
use (``__getattr__``): ``from gpipe import GPipe`` imports the executor then.
"""

TYPE_CHECKING = False  # typing's constant, without importing typing (Note [torch on first use])
if TYPE_CHECKING:
    from gpipe.autograd.phase import is_checkpointing, is_recomputing
    from gpipe.batchnorm import DeferredBatchNorm
    from gpipe.pipe import GPipe

__all__ = ["DeferredBatchNorm", "GPipe", "is_checkpointing", "is_recomputing"]
__version__ = "0.1.0"

#: Where each exported name lives (Note [torch on first use]).
_HOMES = {"DeferredBatchNorm": "gpipe.batchnorm", "GPipe": "gpipe.pipe",
          "is_checkpointing": "gpipe.autograd.phase", "is_recomputing": "gpipe.autograd.phase"}


def __getattr__(name: str) -> object:
    """An exported name, imported from its module on first use and kept (Note [torch on first use])."""
    home = _HOMES.get(name)
    if home is None:  # an AttributeError lets ``from gpipe import skip`` import the submodule
        raise AttributeError(f"module 'gpipe' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
