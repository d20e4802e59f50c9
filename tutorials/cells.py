"""Pieces every notebook's cells share: the first code cell, and an exercise's answer to reveal."""

from __future__ import annotations

__all__ = ["answer", "setup"]


def setup(pyplot: bool = True) -> str:
    """The first code cell: make the project importable from the repository root or from tutorials/."""
    plt = "import matplotlib.pyplot as plt\n\n" if pyplot else ""
    return f"""\
# Run from the repository root or from tutorials/: make the project importable either way.
import sys
from pathlib import Path

{plt}%matplotlib inline
root = Path.cwd() if (Path.cwd() / "gpipe").is_dir() else Path.cwd().parent
sys.path.insert(0, str(root))
MiB = 2**20"""


def answer(text: str) -> str:
    return f"<details><summary>Answer</summary>\n\n{text.strip()}\n\n</details>"
