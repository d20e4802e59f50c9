"""What crosses between stages, behind one interface: in one process, or between ranks over torch.distributed.

::

    transport/
      base.py        Transport, Message, the driver's stage: the interface every worker talks through
      inprocess.py   InProcess: hand-offs between the threads of one process (GPipe)
      wire.py        Wire: isend/irecv between ranks, receives posted ahead (DistributedGPipe)
      routes.py      which messages each rank sends each other rank, in order, on one tag per pair
      structure.py   a message's structure in a fixed header, exchanged once per kind
"""
