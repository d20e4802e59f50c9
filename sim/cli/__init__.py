"""The ``gpipe-sim`` command line: one subcommand per module in this package.

Each subcommand module defines ``add_parser(subparsers)``, which registers its parser and sets
``func`` to a function ``run(args) -> int``. Bad input is reported as one line on stderr with exit
status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["CommandError", "main"]

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS = ("demo", "simulate", "compare", "plan", "hardware")


class CommandError(Exception):
    """Bad input to a subcommand: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpipe-sim",
        description="Pipeline parallelism, simulated and measured: GPipe schedules, a SimPy simulator "
        "and a PyTorch executor that speak one language.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"sim.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"sim.cli.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (CommandError, ValueError, KeyError, FileNotFoundError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"gpipe-sim {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
