"""Output folders and files: checked before a run, written whole, never overwritten unasked, never left stale.

Every ``gpipe-sim`` command that writes files goes through one :class:`OutputFolder`, made before any
work (so a bad ``--out`` costs no calibration) and written after it (which files are whose: Note [ours]; a
default folder is a fresh one: Note [fresh folder]; JSON is written by :func:`json_text`, Note [JSON])::

    out = OutputFolder(args.out, ("trace.json", "timeline.png"), force=args.force)   # checks; writes nothing
    ...                                                                           # the work
    out.write_json("trace.json", doc)     # each file written whole, beside its name
    out.finish()                          # all moved into place; stale files removed; the manifest written

A run that fails leaves the folder as it was (Note [all or nothing]). A command that writes one file the user
names (``hardware --out cpu.json``, ``--export-schedule s.csv``) goes through an :class:`OutputFile` by the same
rules: checked before the work, an existing file replaced only with ``--force``, written whole and moved into
place (Note [no links]).
"""

from __future__ import annotations

import json
import math
import os
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpipe.schedule.size import write_beside

__all__ = ["MANIFEST", "FolderError", "OutputFile", "OutputFolder", "check_folder", "fresh_folder", "json_text"]

#: The file that lists what the last run wrote into a folder (Note [ours]).
MANIFEST = ".gpipe-sim.json"
#: Kernel file systems: writing there is never what a user means by an output folder.
KERNEL_FOLDERS = (Path("/proc"), Path("/sys"))


class FolderError(ValueError):
    """An output folder that cannot be written, or that holds files a run would replace unasked."""


# Note [JSON]: JSON has no NaN and no infinity (Python writes them as ``NaN`` and ``Infinity``, which
# other readers refuse). :func:`json_text` refuses them and names where one is; a value with no finite
# answer (an error relative to zero) is written as ``null`` by whoever computes it.
def json_text(doc: Any, *, indent: int | None = None) -> str:
    """``doc`` as JSON text (Note [JSON]).

    Raises:
        ValueError: ``doc`` holds a NaN or an infinity; the message says where (``rows[1].cost is nan``).
    """
    try:
        return json.dumps(doc, indent=indent, allow_nan=False)
    except ValueError:
        where = _non_finite(doc, "")
        if where is None:
            raise
        raise ValueError(f"{where[0] or 'the value'} is {where[1]}: JSON has no NaN or infinity") from None


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    if isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    if isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            found = _non_finite(item, f"{path}[{k}]")
            if found:
                return found
    return None


def check_folder(path: str | Path, flag: str = "--out") -> Path:
    """Check that ``path`` is a folder this process can write, or can be made one; nothing is created.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        FolderError: ``path`` is empty, a file or a link to nothing, lies under a file, a link to nothing or
            under ``/proc`` or ``/sys``, or its nearest existing folder is not writable; the message starts with
            ``flag`` and ``path``.
    """
    if not str(path):
        raise FolderError(f"{flag} '' names no folder (it would write into the current one): name a folder, e.g. "
                          f"{flag} out")
    folder = Path(path)
    where = f"{flag} {path}"
    _refuse_dangling(folder, where)
    resolved = folder.resolve()
    for kernel in KERNEL_FOLDERS:
        if resolved == kernel or kernel in resolved.parents:
            raise FolderError(f"{where}: under {kernel}, a kernel file system; name a folder of your own")
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise FolderError(f"{where}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FolderError(f"{where}: {existing} is not writable")
    return folder


def _refuse_dangling(path: Path, where: str) -> None:
    """Refuse a path that is, or lies under, a symbolic link to nothing: nothing can be made there."""
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            raise FolderError(f"{where}: {p} is a symbolic link to {os.readlink(p)}, which does not exist; name "
                              "another path, or remove the link")


# Note [no links]: a file gpipe-sim writes is written into a new temporary beside its final name, made
# exclusively (never a link or a file planted there), and moved into place by a rename, which replaces a link
# of that name instead of writing through it: a link planted where a file goes cannot make a run overwrite the
# file it points to (Note [written whole] in gpipe.schedule.size, the one rule for every writer). A single file
# the user names (OutputFile) that is a link is refused before the run, with or without --force.
class OutputFile:
    """One file a run writes, named by the user (Note [no links]); checked when made, before any work.

    Args:
        path: the file.
        force: replace an existing file.
        flag: the option that named it, for messages.
        example: a file name to suggest when ``path`` is a folder (``"cpu.json"``).

    Raises:
        FolderError: ``path`` is empty, a folder or a symbolic link; it exists and ``force`` is not set; its
            folder does not exist, is not writable or is under ``/proc`` or ``/sys``.
    """

    def __init__(self, path: str | Path, *, force: bool = False, flag: str = "--out", example: str = "out.json"
                 ) -> None:
        if not str(path):
            raise FolderError(f"{flag} '' names no file: name one, e.g. {flag} {example}")
        target = Path(path)
        where = f"{flag} {path}"
        if target.is_symlink():
            raise FolderError(f"{where} is a symbolic link (to {os.readlink(target)}); gpipe-sim does not write "
                              "through links: name the file itself")
        if target.is_dir():
            raise FolderError(f"{where} is a folder; name a file such as {target / example}")
        if target.exists() and not force:
            raise FolderError(f"{where} exists; choose another name, or add --force to replace it")
        if not target.parent.is_dir():
            _refuse_dangling(target.parent, where)
            raise FolderError(f"{where}: folder {target.parent} does not exist")
        check_folder(target.parent, flag)
        self.path = target
        self._staged = _Staged(self)

    def write_text(self, text: str) -> str:
        """Write ``text``; return the file's path."""
        return self.write_with(lambda tmp: tmp.write_text(text))

    def write_with(self, write: Callable[[Path], object]) -> str:
        """Call ``write`` with a temporary path beside the file (same suffix), then move it into place; return the
        file's path."""
        self.stage(write)
        return self.finish()

    def stage(self, write: Callable[[Path], object]) -> str:
        """Call ``write`` with a temporary path beside the file (same suffix); :meth:`finish` moves it into place,
        so a run that writes other files too puts them all in place at its end (Note [all or nothing]). Returns
        the path the file will have.

        Raises:
            FolderError: the write failed with an ``OSError`` (a full disk); nothing is left behind.
        """
        self._staged.discard()
        self._staged.write(self.path, write)
        return str(self.path)

    def finish(self) -> str:
        """Move the file :meth:`stage` wrote into place; return its path."""
        self._staged.move(self.path)
        return str(self.path)

    def discard(self) -> None:
        """Remove what :meth:`stage` wrote, for a run that fails before :meth:`finish` (Note [all or nothing])."""
        self._staged.discard()


# Note [all or nothing]: a run that fails leaves its output as it was before the run, so that running it
# again is neither refused (by files of a half-written run) nor misled (by a new trace beside an old picture).
# Every file is written into a temporary beside its name (the work that takes space and may fail: a full disk,
# a plot that raises); only when all are written does finish() rename them into place, the manifest last. A
# failure before that removes the temporaries and the folders the run made; so does a run abandoned without
# finish() (the interpreter's exit, or the objects' collection, runs the cleanup). A rename in one folder takes
# no space; a file that cannot be renamed over (a folder of that name) is found before any is moved.
class _Staged:
    """The temporaries of one run, by the final path each goes to, and the folders the run made."""

    def __init__(self, owner: object) -> None:
        self.files: dict[Path, Path] = {}  # final path -> its temporary
        self.folders: list[Path] = []  # made by this run, innermost first
        weakref.finalize(owner, self.discard)  # Note [all or nothing]: a run abandoned

    def write(self, final: Path, write: Callable[[Path], object]) -> None:
        """Write ``final``'s temporary (a second write of one file replaces the first); on any error, discard
        everything this run wrote, and report an ``OSError`` as a :class:`FolderError`."""
        try:
            tmp = write_beside(final, write)
        except OSError as error:
            self.discard()
            raise FolderError(f"cannot write {final}: {error.strerror or error}") from None
        except BaseException:
            self.discard()
            raise
        earlier = self.files.pop(final, None)
        if earlier is not None:
            earlier.unlink(missing_ok=True)
        self.files[final] = tmp

    def move(self, *finals: Path) -> None:
        """Rename the temporaries of ``finals``, in that order, onto their final paths; once none is left, the
        folders made are kept.

        Raises:
            FolderError: a final path of any file written is a folder (found before anything is moved), or a
                rename failed; the temporaries left are discarded.
        """
        for final in self.files:
            if final.is_dir() and not final.is_symlink():
                self.discard()
                raise FolderError(f"{final} is a folder; gpipe-sim replaces only files: remove it, or name another "
                                  "path")
        for final in (f for f in finals if f in self.files):
            try:
                os.replace(self.files[final], final)
            except OSError as error:
                self.discard()
                raise FolderError(f"cannot write {final}: {error.strerror or error}") from None
            del self.files[final]
        if not self.files:
            self.folders.clear()

    def discard(self) -> None:
        """Remove the temporaries, then the folders this run made (each only if it is empty)."""
        for tmp in self.files.values():
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        self.files.clear()
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:  # not empty (another's file, or one this run moved in): kept, and those above it
                break
        self.folders.clear()


# Note [fresh folder]: a command run twice with its default folder must not fail the second time, nor
# replace the first run's files: a folder left at its default (``./demo``, ``./out``) is *fresh*, the
# default name if it is free (absent, or an empty folder), else the first free ``NAME-2``, ``NAME-3``, ...
# (:func:`fresh_folder`). It is chosen before the work and made at the first write; if another run made it
# meanwhile and wrote into it, the next free name is taken then. A folder the user names is never renamed.
def fresh_folder(path: str | Path) -> Path:
    """``path`` if it is free (absent, or an empty folder), else the first free ``path-2``, ``path-3``, ...
    (Note [fresh folder]); nothing is created."""
    folder = Path(path)
    candidate, k = folder, 1
    while not _free(candidate):
        k += 1
        candidate = folder.with_name(f"{folder.name}-{k}")
    return candidate


def _free(folder: Path) -> bool:
    """Absent, or an empty folder (not a link to one)."""
    if not folder.exists() and not folder.is_symlink():
        return True
    return folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())


# Note [ours]: a folder records the files a run wrote in a manifest (``.gpipe-sim.json``, beside them).
# A file is ours when the manifest lists it; every other file is the user's. A run refuses to start
# when the folder holds a file it would write (whoever made it) or a file of ours from an earlier run,
# unless ``force``; with ``force`` it replaces the first and, once written, removes those of the second
# it did not write again, so the folder never shows a stale ``timeline.png`` beside a new trace. Files
# of the user's are never removed, whatever the flag.
class OutputFolder:
    """Where one run writes its files (Note [ours]).

    Args:
        path: the folder; made, with its parents, at the first write.
        names: the files this run may write (plain names, no folders).
        force: replace files this run writes and remove the stale ones of earlier runs.
        flag: the option that named the folder, for messages.
        fresh: ``path`` is a default name, not the user's: write into :func:`fresh_folder` of it instead
            (Note [fresh folder]); ``force`` is then ignored, as nothing is there to replace.

    Raises:
        FolderError: see :func:`check_folder`; or, without ``force``, the folder holds a file this run
            may write or a file of ours from an earlier run (the message names them and ``--force``).
    """

    def __init__(self, path: str | Path, names: Iterable[str], *, force: bool = False, flag: str = "--out",
                 fresh: bool = False) -> None:
        self.path = check_folder(fresh_folder(path) if fresh else path, flag)
        self.names = tuple(names)
        self.written: list[str] = []  # the names this run wrote; emptied if it fails (Note [all or nothing])
        self._fresh = Path(path) if fresh else None  # the default name, to choose again from (Note [fresh folder])
        self._made = False
        self._staged = _Staged(self)  # this run's files until finish() (Note [all or nothing])
        self._earlier = self._manifest()
        present = [n for n in (*self.names, *self._earlier) if (self.path / n).exists()]
        clash = list(dict.fromkeys(present))
        if clash and not force:
            them = "it" if len(clash) == 1 else "them"
            raise FolderError(f"{flag} {path} already holds {', '.join(clash)}: pass --force to replace {them} "
                              f"(gpipe-sim removes only files it wrote), or name another {flag}")

    def write_text(self, name: str, text: str) -> str:
        """Write ``text`` as ``name``; return the file's path."""
        return self.write_with(name, lambda tmp: tmp.write_text(text))

    def write_json(self, name: str, doc: Any, *, indent: int | None = None) -> str:
        """Write ``doc`` as ``name`` through :func:`json_text` (no NaN, no infinity); return the file's path."""
        return self.write_text(name, json_text(doc, indent=indent))

    def write_with(self, name: str, write: Callable[[Path], object]) -> str:
        """Call ``write`` with a temporary path beside ``name`` (same suffix); :meth:`finish` moves it into place.
        Returns the path the file will have.

        A file is never seen half written, one the user may not write to is replaced, not edited, and a link of
        that name is replaced, not written through (Note [no links]). A write that fails leaves the folder as it
        was before the run (Note [all or nothing]).

        Raises:
            FolderError: the write failed with an ``OSError`` (a full disk: "cannot write PATH: No space left on
                device"); whatever else ``write`` raises, after the same cleanup.
        """
        if name not in self.names:
            raise ValueError(f"{name!r} is not among the files this run declared: {', '.join(self.names)}")
        self._make()
        try:
            self._staged.write(self.path / name, write)
        except BaseException:
            self.written.clear()  # Note [all or nothing]: the run wrote nothing after all
            raise
        if name not in self.written:
            self.written.append(name)
        return str(self.path / name)

    def finish(self) -> None:
        """Write the manifest, move every file written into place, the manifest last, and remove the files of
        ours an earlier run left that this one did not write (Note [all or nothing]).

        Raises:
            FolderError: the manifest cannot be written (the folder is left as it was), or a file cannot be moved
                into place.
        """
        self._make()
        manifest = json_text({"written_by": "gpipe-sim", "files": self.written}, indent=1)
        try:
            self._staged.write(self.path / MANIFEST, lambda tmp: tmp.write_text(manifest))  # before any moves
            self._staged.move(*(self.path / name for name in self.written))
        except BaseException:
            self.written.clear()  # Note [all or nothing]: the run wrote nothing after all
            raise
        for name in self._earlier:
            stale = self.path / name
            if name not in self.written and (stale.is_file() or stale.is_symlink()):
                stale.unlink()
        self._staged.move(self.path / MANIFEST)

    def _make(self) -> None:
        """Make the folder, at the first write; a fresh one taken meanwhile by another run is chosen again. The
        folders made are noted, to be removed if the run fails (Note [all or nothing])."""
        if self._made:
            return
        try:
            while self._fresh is not None:
                made = _absent(self.path)
                try:
                    self.path.mkdir(parents=True)
                    self._staged.folders = made
                    break
                except FileExistsError:
                    if _free(self.path):
                        break
                    self.path = fresh_folder(self._fresh)
            if self._fresh is None:
                made = _absent(self.path)
                self.path.mkdir(parents=True, exist_ok=True)
                self._staged.folders = made
        except OSError as error:
            raise FolderError(f"cannot make the folder {self.path}: {error.strerror or error}") from None
        self._made = True

    def _manifest(self) -> list[str]:
        """The files the manifest says an earlier run wrote: plain names only; none if it is unreadable."""
        try:
            doc = json.loads((self.path / MANIFEST).read_text())
            files = doc["files"] if isinstance(doc, dict) else []
        except (OSError, ValueError, KeyError):
            return []
        return [f for f in files if isinstance(f, str) and f and f == Path(f).name and f not in (".", "..", MANIFEST)]


def _absent(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, innermost first: what making it would make."""
    return [p for p in (folder, *folder.parents) if not p.exists() and not p.is_symlink()]
