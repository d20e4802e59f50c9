"""Benchmark scripts: each prints a table and writes its results as JSON; ``README.md`` lists them.

Run one as a module from the repository's root: ``.venv/bin/python -m benchmarks.NAME``. ``_shared`` holds what
several scripts use; ``investigations`` holds scripts that each answered one question behind a stated finding.
"""
