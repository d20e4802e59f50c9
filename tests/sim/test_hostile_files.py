"""Output files against a hostile folder and a full disk (:mod:`sim.files`, Note [written whole] in
:mod:`gpipe.schedule.size`): a link planted where a temporary goes is never written through, and a run that
fails to write leaves its folder as it was, in one line on stderr."""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path

import pytest

from gpipe.schedule import gpipe, one_f_one_b, read_pipelining_csv, read_schedule, write_pipelining_csv, write_schedule
from gpipe.schedule.size import replace_file, write_beside
from sim.cli import main
from sim.files import MANIFEST, FolderError, OutputFile, OutputFolder

SIMULATE = ["simulate", "--stages", "2", "--chunks", "2", "--checkpoint", "never"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = {"trace.json", "timeline.json", "timeline.png", MANIFEST}


def _one_line(capsys: pytest.CaptureFixture[str], *parts: str) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, err
    return err


def _contents(folder: Path) -> dict[str, bytes]:
    """Every entry of ``folder``, hidden ones included; a link as its target's name."""
    return {p.name: (os.readlink(p).encode() if p.is_symlink() else p.read_bytes()) for p in folder.iterdir()}


def _no_space(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "VICTIM"
    path.write_text("the user's own file")
    return path


# -- a link planted at a temporary's name ----------------------------------------------------------------


def test_a_link_at_the_old_temporary_name_is_not_written_through(tmp_path: Path, victim: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``ln -s VICTIM linkout/.trace.partial.json`` once made ``simulate --out linkout`` write the trace into
    VICTIM, and trace.json a link to it."""
    out = tmp_path / "linkout"
    out.mkdir()
    (out / ".trace.partial.json").symlink_to(victim)
    assert main([*SIMULATE, "--out", str(out)]) == 0
    capsys.readouterr()
    assert victim.read_text() == "the user's own file"
    assert not (out / "trace.json").is_symlink() and (out / "trace.json").is_file()
    assert {p.name for p in out.iterdir()} == FILES | {".trace.partial.json"}  # no temporary left


def test_a_link_at_the_old_export_temporary_name_is_not_written_through(tmp_path: Path, victim: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``--export-schedule`` promises to refuse links; a link at its temporary's name once took the schedule."""
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / ".sched.partial.csv").symlink_to(victim)
    assert main([*SIMULATE, "--out", str(tmp_path / "out"), "--export-schedule", str(exp / "sched.csv")]) == 0
    capsys.readouterr()
    assert victim.read_text() == "the user's own file"
    assert not (exp / "sched.csv").is_symlink()
    assert read_pipelining_csv(exp / "sched.csv").tasks == gpipe(2, 2, "never").tasks
    assert {p.name for p in exp.iterdir()} == {"sched.csv", ".sched.partial.csv"}


def test_a_temporary_is_made_exclusively_so_a_name_taken_by_a_link_is_skipped(
        tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [written whole]: whatever name a link takes, the temporary is a new regular file of ours."""
    names = iter(["aaaa", "bbbb"])
    monkeypatch.setattr("gpipe.schedule.size.secrets.token_hex", lambda n: next(names))
    (tmp_path / ".f.aaaa.partial.txt").symlink_to(victim)
    seen: list[Path] = []

    def write(tmp: Path) -> None:
        seen.append(tmp)
        tmp.write_text("ours")

    assert replace_file(tmp_path / "f.txt", write) == tmp_path / "f.txt"
    assert seen == [tmp_path / ".f.bbbb.partial.txt"]  # the suffix kept: matplotlib picks its format by it
    assert victim.read_text() == "the user's own file" and (tmp_path / "f.txt").read_text() == "ours"
    assert not (tmp_path / "f.txt").is_symlink()


def test_the_library_writers_replace_a_link_instead_of_writing_through_it(tmp_path: Path, victim: Path) -> None:
    for name, write, read in [("s.csv", write_pipelining_csv, read_pipelining_csv), ("s.txt", write_schedule,
                                                                                     read_schedule)]:
        link = tmp_path / name
        link.symlink_to(victim)
        with pytest.raises(FileExistsError):
            write(one_f_one_b(4, 2), link)  # without overwrite, a link is a file that exists
        assert write(one_f_one_b(4, 2), link, overwrite=True) == link
        assert victim.read_text() == "the user's own file"
        assert not link.is_symlink() and read(link).tasks == one_f_one_b(4, 2).tasks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["VICTIM", "s.csv", "s.txt"]


def test_a_timeline_and_its_trace_replace_a_link_instead_of_writing_through_it(tmp_path: Path,
                                                                               victim: Path) -> None:
    from gpipe.schedule.timeline import Span, Timeline
    from gpipe.schedule.trace import write_chrome_trace

    timeline = Timeline([Span(0, "compute", one_f_one_b(2, 1).tasks[0][0], 0.0, 1.0)], num_devices=1)
    for name, write in [("t.json", timeline.to_json), ("trace.json", lambda p: write_chrome_trace(p, timeline))]:
        link = tmp_path / name
        link.symlink_to(victim)
        write(link)
        assert victim.read_text() == "the user's own file"
        assert not link.is_symlink() and link.read_text().startswith("{")


def test_a_temporary_swapped_for_a_link_during_the_write_is_never_moved_into_place(tmp_path: Path,
                                                                                   victim: Path) -> None:
    def swap(tmp: Path) -> None:
        tmp.unlink()
        tmp.symlink_to(victim)

    with pytest.raises(OSError, match="no longer the regular file"):
        write_beside(tmp_path / "f.txt", swap)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["VICTIM"]


# -- a full disk: the folder as it was -----------------------------------------------------------------------


def test_a_full_disk_leaves_no_folder_and_a_rerun_is_not_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC on the picture, after trace.json and timeline.json were written: once a traceback, and trace.json
    left behind unlisted in the manifest, so that the next run was refused."""
    out = tmp_path / "new" / "out"
    monkeypatch.setattr("gpipe.schedule.plot.plot_timeline", _no_space)
    assert main([*SIMULATE, "--out", str(out)]) == 2
    _one_line(capsys, f"gpipe-sim simulate: error: cannot write {out / 'timeline.png'}: No space left on device")
    assert not (tmp_path / "new").exists()  # the folders it made, removed
    monkeypatch.undo()
    assert main([*SIMULATE, "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == FILES


@pytest.mark.parametrize("failing", ["plot", "manifest", "export"])
def test_a_failed_forced_run_leaves_the_earlier_run_s_files_as_they_were(
        failing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out, export = tmp_path / "out", tmp_path / "s.csv"
    (tmp_path / "out").mkdir()
    (out / "notes.txt").write_text("mine")
    assert main([*SIMULATE, "--out", str(out), "--export-schedule", str(export)]) == 0
    capsys.readouterr()
    before, exported = _contents(out), export.read_bytes()
    if failing == "plot":
        monkeypatch.setattr("gpipe.schedule.plot.plot_timeline", _no_space)
    elif failing == "export":
        monkeypatch.setattr("sim.cli.schedule_files.write_pipelining_csv", _no_space)
    else:
        real = Path.write_text
        monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: _no_space() if "gpipe-sim" in self.name
                            else real(self, *a, **k))
    argv = [*SIMULATE, "--forward-time", "5", "--out", str(out), "--export-schedule", str(export), "--force"]
    assert main(argv) == 2
    _one_line(capsys, "gpipe-sim simulate: error: cannot write ", ": No space left on device")
    assert _contents(out) == before and export.read_bytes() == exported
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.csv"]


def test_a_run_abandoned_before_finish_leaves_nothing(tmp_path: Path) -> None:
    """Note [all or nothing]: an error between two writes (not in one) still leaves the folder as it was."""
    out = OutputFolder(tmp_path / "out", ("a.txt", "b.txt"))
    out.write_text("a.txt", "written")
    assert [p.name for p in (tmp_path / "out").iterdir()] != []  # its temporary, not a.txt
    assert not (tmp_path / "out" / "a.txt").exists()
    del out
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_a_write_error_is_a_folder_error_and_removes_every_temporary(tmp_path: Path) -> None:
    out = OutputFolder(tmp_path, ("a.txt", "b.png"))
    out.write_text("a.txt", "written")
    with pytest.raises(FolderError, match=f"cannot write {tmp_path / 'b.png'}: No space left on device"):
        out.write_with("b.png", _no_space)
    assert list(tmp_path.iterdir()) == []
    single = OutputFile(tmp_path / "c.json")
    with pytest.raises(FolderError, match="No space left on device"):
        single.write_with(_no_space)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_where_a_file_goes_is_found_before_any_file_moves(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    (out / "timeline.png").mkdir(parents=True)
    assert main([*SIMULATE, "--out", str(out), "--force"]) == 2
    _one_line(capsys, f"{out / 'timeline.png'} is a folder; gpipe-sim replaces only files")
    assert [p.name for p in out.iterdir()] == ["timeline.png"]


# -- a schedule file that is not a regular file ----------------------------------------------------------------


@pytest.mark.timeout(20)  # a FIFO once waited for a writer forever (reading it directly)
def test_import_names_a_folder_a_fifo_or_a_device_as_what_it_is(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Each was once 'no such file'."""
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    for path, what in [(tmp_path, "is a folder, not a file"), (fifo, "is a FIFO (named pipe), not a regular file"),
                       (Path("/dev/zero"), "is a character device, not a regular file")]:
        assert main([*SIMULATE, "--import-schedule", str(path), "--out", str(tmp_path / "out")]) == 2
        _one_line(capsys, f"gpipe-sim simulate: error: --import-schedule {path}: {what}: expected a CSV of actions")
    assert not (tmp_path / "out").exists()


def test_compare_names_a_schedule_file_that_is_a_fifo_or_a_folder(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    fifo, folder = tmp_path / "fifo.csv", tmp_path / "folder.txt"
    os.mkfifo(fifo)
    folder.mkdir()
    for path, what in [(fifo, "is a FIFO (named pipe), not a regular file"), (folder, "is a folder, not a file")]:
        assert main(["compare", f"{EXAMPLES / 'wide_mlp.py'}:model", "--schedule", str(path),
                     "--out", str(tmp_path / "out")]) == 2
        _one_line(capsys, f"gpipe-sim compare: error: --schedule {path}: {what}")
    assert not (tmp_path / "out").exists()
