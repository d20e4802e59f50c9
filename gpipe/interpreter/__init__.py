"""One device's program over a schedule, and the threads that run every device's in one process.

::

    interpreter/
      worker.py     Step (what one step shares) and Worker: a device's tasks in order, checkpointing, the loss
      pipeline.py   Pipeline: what a front-end decided (partitions, devices, skips), frozen for every step
      portals.py    Portals: a worker's skip tensors that cross partitions, sent and received through the transport
      recorder.py   Recorder: a step's spans, host clock on CPU and CUDA events on streams, into a Timeline
      threads.py    ThreadRun: one mini-batch on threads, a worker thread per schedule device (GPipe's driver)
      parking.py    workers parked between a step's forward and backward phases
      affinity.py   worker threads pinned to cores on a CPU device
      gil.py        the interpreter's switch interval while a step runs

A :class:`worker.Worker` knows nothing of threads or processes: it takes and hands over messages through a
:class:`gpipe.transport.base.Transport`, so ``GPipe`` (threads) and ``DistributedGPipe`` (a process per device)
run the same interpreter.
"""
