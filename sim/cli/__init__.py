"""The ``gpipe-sim`` command line: one subcommand per module in this package.

Each subcommand module defines ``add_parser(subparsers)``, which registers its parser and sets
``func`` to a function ``run(args) -> int``. Bad input is reported as one line on stderr with exit
status 2, without a traceback; an error raised by the user's own code (``compare MODULE:FUNCTION``,
``plan --model MODULE:FUNCTION``) prints its traceback, marked as theirs, with exit status 1
(:mod:`sim.cli.user_code`). When the reader of the output goes away (``gpipe-sim hardware | head -1``)
the command ends quietly with the status of a closed pipe, 141.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["CommandError", "main"]

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS = ("demo", "simulate", "search", "compare", "plan", "hardware")


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


#: The exit status of a command whose reader closed the pipe: 128 + SIGPIPE, as the shell reports a killed one.
CLOSED_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    from sim.cli.user_code import UserCodeError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except UserCodeError as exc:
        print(f"gpipe-sim {args.command}: error in your code ({exc.target}): {type(exc.error).__name__}: "
              f"{exc.error}", file=sys.stderr)
        print(exc.report(), end="", file=sys.stderr)
        return 1
    except (CommandError, ValueError, KeyError, FileNotFoundError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"gpipe-sim {args.command}: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return CLOSED_PIPE
    except KeyboardInterrupt:
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for the closed pipe goes nowhere at exit, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind stdout
        pass
