"""What crosses between stages, behind one interface, and the hand-offs between the threads of one process.

::

    transport/
      base.py        Transport, Message, the driver's stage: the interface every worker talks through
      inprocess.py   InProcess: hand-offs between the threads of one process (GPipe)
      routes.py      which messages each rank sends each other rank, in order, on one tag per pair
      structure.py   a message's structure in a fixed header, exchanged once per kind

Between ranks the interface is :class:`gpipe.distributed.wire.Wire`'s, with the routes and structures above.
"""
