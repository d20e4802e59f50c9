"""The executor on ``torch.distributed``: one process per schedule device, launched by torchrun.

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
      sharded.py      a stage sharded over its replicas with FSDP2 (ZeRO-3), its gathers and reductions as spans
      wire.py         Wire: isend/irecv between ranks, receives posted ahead (the transport's interface between ranks,
                      with :mod:`~gpipe.transport.routes` and :mod:`~gpipe.transport.structure`)
      pipe.py         DistributedGPipe: this rank's stages, step()

Note [a light package]: :class:`DistributedGPipe` is imported when first asked for, so that what needs only a rank's
machinery (:mod:`~gpipe.distributed.faults`' waits, the calibration's probes) does not load the executor.
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
