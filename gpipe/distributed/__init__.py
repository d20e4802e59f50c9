"""The executor on ``torch.distributed``: one process per schedule device, launched by torchrun (issue 23).

::

    distributed/
      structure.py    a message's structure in a fixed header, exchanged once per kind
      routes.py       which messages each rank sends each other rank, in order
      faults.py       a failure reaches every rank; every wait is bounded
      wire.py         the Transport over isend/irecv, receives posted ahead
      shapes.py       a dry run on fake tensors: a shape mismatch between stages refused before a step
      clock.py        one time base: clock offsets by ping-pong, the ranks' timelines merged on rank 0
      group.py        the process group, this rank's device, the store
      loopback.py     ranks all on this machine: a group listening on the loopback interface only
      materialize.py  meta layers made real, the same weights whatever the ranks
      pipe.py         DistributedGPipe: this rank's stages, step()
"""

from gpipe.distributed.faults import PipelineFailed
from gpipe.distributed.materialize import materialize
from gpipe.distributed.pipe import DistributedGPipe

__all__ = ["DistributedGPipe", "PipelineFailed", "materialize"]
