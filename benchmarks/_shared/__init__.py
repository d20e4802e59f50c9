"""What the benchmark scripts share, so that no script imports another (``tests/benchmarks/test_shared.py``).

One concept a module: :mod:`_shared.machine` (what a run records of the machine, the threads it sets, how busy
the machine is), :mod:`_shared.record` (the results as JSON, stamped), :mod:`_shared.options` (the flags several
scripts take), :mod:`_shared.workload` and :mod:`_shared.rounds` (the speed benchmarks' model and how they time
it), :mod:`_shared.pipelining` (torch.distributed.pipelining beside our schedules), :mod:`_shared.prediction` (the
simulator's figure for the speed workload), :mod:`_shared.fidelity` (the fidelity grid's models and axes) and
:mod:`_shared.cuda_tasks` (what a GPU run says about its tasks). None of them is a script: none has a ``main``. The
scripts import it as ``benchmarks._shared``: they run as modules from the repository's root.
"""
