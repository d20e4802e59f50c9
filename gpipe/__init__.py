"""gpipe: pipeline parallelism for PyTorch, driven by the same schedule objects the simulator runs.

``from gpipe import GPipe`` is all a torchgpipe user changes. See :class:`gpipe.pipe.GPipe`.
"""

from gpipe.batchnorm import DeferredBatchNorm
from gpipe.phase import is_checkpointing, is_recomputing
from gpipe.pipe import GPipe

__all__ = ["DeferredBatchNorm", "GPipe", "is_checkpointing", "is_recomputing"]
__version__ = "0.1.0"
