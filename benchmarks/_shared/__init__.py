"""What the benchmark scripts share, so that no script imports another (``tests/benchmarks/test_shared.py``).

One concept a module: :mod:`_shared.machine` (what a run records of the machine, the threads it sets, how busy
the machine is), :mod:`_shared.record` (the results as JSON, stamped) and :mod:`_shared.options` (the flags several
scripts take). None of them is a script: none has a ``main``. The scripts find this package beside them
(``benchmarks/`` is the first entry of ``sys.path`` when one of them runs).
"""
