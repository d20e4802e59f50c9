"""The executor on ``torch.distributed``: one process per schedule device, launched by torchrun (issue 23).

::

    distributed/
      faults.py       a failure reaches every rank; every wait is bounded
      shapes.py       a dry run on fake tensors: a shape mismatch between stages refused before a step
      clock.py        one time base: clock offsets by ping-pong, the ranks' timelines merged on rank 0
      group.py        the process group, this rank's device, the store
      loopback.py     ranks all on this machine: a group listening on the loopback interface only
      materialize.py  meta layers made real, the same weights whatever the ranks
      replicas.py     replicas of the pipeline on a (pp, dp) device mesh: each one's batch, one timeline
      reduction.py    a stage's gradients all-reduced over its replicas in buckets during the backward, as spans
      pipe.py         DistributedGPipe: this rank's stages, step()

Its transport, the wire between ranks, is :mod:`gpipe.transport.wire` (with :mod:`~gpipe.transport.routes` and
:mod:`~gpipe.transport.structure`).

Note [a light package]: :class:`DistributedGPipe` is imported when first asked for, so that the transport's
wire, which reports through :mod:`gpipe.distributed.faults`, can be imported first without a circle at run time.
"""

from typing import TYPE_CHECKING, Any

from gpipe.distributed.faults import PipelineFailed
from gpipe.distributed.materialize import materialize

if TYPE_CHECKING:
    from gpipe.distributed.pipe import DistributedGPipe


def __getattr__(name: str) -> Any:
    if name == "DistributedGPipe":
        from gpipe.distributed.pipe import DistributedGPipe
        return DistributedGPipe
    raise AttributeError(f"module 'gpipe.distributed' has no attribute {name!r}")


__all__ = ["DistributedGPipe", "PipelineFailed", "materialize"]
