"""The flags several benchmarks take, each defined once: ``--quick``, ``--out`` (alias ``--json``), ``--threads``."""

from __future__ import annotations

import argparse
from pathlib import Path

from .machine import THREADS

__all__ = ["add_out", "add_quick", "add_threads", "parser"]


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's parser, described by the first paragraph of its docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])


def add_quick(parser: argparse.ArgumentParser, help: str) -> None:
    """``--quick``: what the script's smoke test runs (``help`` says what it leaves out)."""
    parser.add_argument("--quick", action="store_true", help=help)


def add_out(parser: argparse.ArgumentParser, default: Path | None, help: str | None = None) -> None:
    """``--out PATH`` (also spelled ``--json``), read as ``args.out``: where the results go."""
    parser.add_argument("--out", "--json", dest="out", type=Path, default=default, metavar="PATH",
                        help=help or f"where to write the results (default {default})")


def add_threads(parser: argparse.ArgumentParser, default: int = THREADS) -> None:
    """``--threads N``: torch's intra-op threads per worker and per rank, read as ``args.threads`` (Note [threads]
    in :mod:`_shared.machine`: the default is deliberate, and the results record what ran)."""
    parser.add_argument("--threads", type=_positive, default=default,
                        help=f"intra-op threads per worker and per rank (default {default}, on purpose: Note "
                             "[threads] in benchmarks/_shared/machine.py)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"need a positive integer, got {text}")
    return value
