"""The user's own code behind a ``MODULE:FUNCTION`` argument: loading it, and telling its errors from ours.

A wrong argument (no such module, file or function) is the user's input, and is one line with exit
status 2 like any other (:class:`~sim.cli.CommandError`). An exception raised *by* the user's code (on
import, in the function, or in a layer's ``forward`` while the experiment runs) is a bug in it: the
command prints its traceback, from the user's first frame on, under a line that says whose it is
(:class:`UserCodeError`, exit status 1)::

    gpipe-sim compare: error in your code (models:build): KeyError: 'encoder'
    Traceback (most recent call last):
      File "/home/me/models.py", line 12, in build
        return layers["encoder"], torch.randn(8, 4)
    KeyError: 'encoder'

A layer of the user's model that fails inside a library's code (its input shape does not match the layer before
it: ``torch`` raises in ``F.linear``) is the user's model, but no frame of theirs: one line names the layer and
the error, exit status 2 (:func:`layer_failure`)::

    gpipe-sim compare: error: models:build: layer 2 of your model, Linear(in_features=16, out_features=2, bias=True),
    fails on the output of the layers before it: RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x8 and 16x2)

Note [whose frame]: a frame is the user's when its file is the target's own module file, or is none
of this project's packages (``gpipe``, ``sim``), of Python's library or of the installed packages
(``torch`` among them): so a layer the user defines in a sibling module counts, a shape error that
``torch`` raises inside a user's ``nn.Linear`` does not (it reaches the user as Python reports it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from sim.cli import CommandError

__all__ = ["Target", "UserCodeError", "blame", "call", "layer_failure", "load_target"]


class UserCodeError(Exception):
    """An exception raised by the user's code; :func:`sim.cli.main` prints its traceback (exit status 1).

    Attributes:
        target: the ``MODULE:FUNCTION`` the code came from.
        error: the exception itself.
        traceback: its traceback from the user's first frame (Note [whose frame]).
    """

    def __init__(self, target: str, error: BaseException, tb: TracebackType | None) -> None:
        super().__init__(f"{target}: {type(error).__name__}: {error}")
        self.target, self.error, self.traceback = target, error, tb

    def report(self) -> str:
        """The traceback, as Python prints it, from the user's first frame on."""
        return "".join(traceback.format_exception(type(self.error), self.error, self.traceback))


@dataclass(frozen=True)
class Target:
    """A loaded ``MODULE:FUNCTION``: the spec as given, the function, and the module's file."""

    spec: str
    function: Callable[[], Any]
    file: str | None


def load_target(spec: str, what: str = "") -> Target:
    """Import ``MODULE`` of ``MODULE:FUNCTION`` and find ``FUNCTION``.

    Args:
        spec: ``MODULE:FUNCTION``; ``MODULE`` a dotted module importable from the current folder, or a
            path to a ``.py`` file.
        what: a prefix for messages (``"--model: "``).

    Raises:
        CommandError: a malformed spec, a module or file that is not there, a function that is not there,
            is not callable or cannot be called with no arguments.
        UserCodeError: the module raised while it was imported.
    """
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise CommandError(f"{what}expected MODULE:FUNCTION, got {spec!r}")
    module = _import(module_name, spec, what)
    func = getattr(module, func_name, None)
    if func is None:
        raise CommandError(f"{what}module {module_name!r} has no function {func_name!r}")
    if not callable(func):
        raise CommandError(f"{what}{spec} is a {type(func).__name__}, not a function")
    _check_no_arguments(func, spec, what)
    return Target(spec, func, getattr(module, "__file__", None))


def _check_no_arguments(func: Callable[..., Any], spec: str, what: str) -> None:
    """Refuse a function that cannot be called with no arguments: the spec names the wrong function, which is the
    user's input (one line), not a bug in their code. A ``TypeError`` raised inside the function stays theirs."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin or extension without a signature: its call will tell
        return
    try:
        signature.bind()
    except TypeError:
        required = [p.name for p in signature.parameters.values() if p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        raise CommandError(f"{what}{spec} takes arguments ({', '.join(required)}); name a function of no arguments "
                           "that returns (nn.Sequential, sample input)") from None


def call(target: Target) -> Any:
    """``target.function()``; whatever it raises is the user's (:class:`UserCodeError`)."""
    with blame(target, always=True):
        return target.function()


@contextmanager
def blame(target: Target, *, always: bool = False) -> Iterator[None]:
    """Turn an exception raised in a frame of the user's (Note [whose frame]) into a :class:`UserCodeError`.

    ``always``: every exception is the user's (the block only calls the user's code).
    """
    try:
        yield
    except (CommandError, UserCodeError, KeyboardInterrupt):
        raise
    except Exception as exc:
        tb = _users_traceback(exc.__traceback__, target.file)
        if tb is None and not always:
            raise
        raise UserCodeError(target.spec, exc, tb if tb is not None else exc.__traceback__) from None


def layer_failure(target: Target, k: int, layer: object, error: BaseException) -> Exception:
    """What to raise when layer ``k`` (``layer``) of the user's model raised ``error``: a :class:`UserCodeError`
    where a frame of its traceback is the user's (Note [whose frame]), else a one-line :class:`CommandError` that
    names the layer and the error (its first line)."""
    tb = _users_traceback(error.__traceback__, target.file)
    if tb is not None:
        return UserCodeError(target.spec, error, tb)
    text = repr(layer).splitlines()[0] if repr(layer) else type(layer).__name__
    lines = str(error).strip().splitlines()
    return CommandError(f"{target.spec}: layer {k} of your model, {text if len(text) <= 100 else text[:97] + '...'}, "
                        f"fails on the output of the layers before it: {type(error).__name__}"
                        + (f": {lines[0]}" if lines else ""))


def _import(module_name: str, spec: str, what: str) -> ModuleType:
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise CommandError(f"{what}no Python file {module_name!r}")
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        if loader_spec is None or loader_spec.loader is None:
            raise CommandError(f"{what}cannot load {module_name!r} as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        with blame(Target(spec, lambda: None, str(path.resolve())), always=True):
            loader_spec.loader.exec_module(module)
        return module
    cwd = str(Path.cwd())
    sys.path.insert(0, cwd)  # a console script does not have the current directory on its path
    try:
        with blame(Target(spec, lambda: None, None), always=True):
            try:
                return importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name is None or not _names_the_target(exc.name, module_name):
                    raise  # a module the user's code imports is missing: theirs, with its traceback
                raise CommandError(f"{what}cannot import {module_name!r}: no module named {exc.name!r}") from None
    finally:
        sys.path.remove(cwd)


def _names_the_target(missing: str, module_name: str) -> bool:
    """Whether the missing module is the one asked for, or a package above it."""
    return module_name == missing or module_name.startswith(missing + ".")


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Folders whose code is not the user's: this project's packages, Python's library, installed packages."""
    here = Path(__file__).resolve().parents[1]  # sim/
    roots = {str(here), str(here.parent / "gpipe")}
    paths = sysconfig.get_paths()
    roots |= {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(os.path.realpath(r) for r in roots)


def _is_users(filename: str, own: str | None) -> bool:
    """Note [whose frame]."""
    if filename.startswith("<"):  # frozen import machinery, exec'd strings
        return False
    path = os.path.realpath(filename)
    if own is not None and path == os.path.realpath(own):
        return True
    return not any(path == root or path.startswith(root + os.sep) for root in _library_roots())


def _users_traceback(tb: TracebackType | None, own: str | None) -> TracebackType | None:
    """``tb`` from its first frame of the user's on, or ``None`` when no frame is theirs."""
    while tb is not None:
        if _is_users(tb.tb_frame.f_code.co_filename, own):
            return tb
        tb = tb.tb_next
    return None
