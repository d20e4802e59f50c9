"""Scripts that each answered one question, kept beside the finding they support (each docstring names it).

Run one as ``.venv/bin/python -m benchmarks.investigations.NAME``; their results go to ``benchmarks/results``.
"""
