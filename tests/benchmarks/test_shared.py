"""What the benchmarks share (``benchmarks/_shared``): the stamp on their results and their common flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_the_results_are_stamped(tmp_path: Path) -> None:
    from _shared.machine import facts
    from _shared.record import command_line, write_json

    out = write_json(tmp_path / "deep" / "x.json", {"rows": [{"a": 1}], "note": "n"},
                     command=command_line("/somewhere/benchmarks/x.py", ["--quick", "--out", "a b.json"]),
                     machine={"threads_per_worker": 1})
    doc = json.loads(out.read_text())
    assert list(doc)[:3] == ["command", "date", "machine"] and doc["rows"] == [{"a": 1}] and doc["note"] == "n"
    assert doc["command"] == ".venv/bin/python benchmarks/x.py --quick --out 'a b.json'"
    assert doc["date"].endswith(" UTC") and len(doc["date"]) == len("2026-12-06 08:28 UTC")
    assert set(facts()) <= set(doc["machine"]) and doc["machine"]["threads_per_worker"] == 1
    assert doc["machine"]["cpus"] >= 1 and out.read_text().endswith("}\n")
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]  # no .tmp left behind


@pytest.mark.parametrize(("payload", "machine", "named"), [({"date": "yesterday"}, None, "date"),
                                                          ({"command": "x", "machine": "y"}, None, "command, machine"),
                                                          ({}, {"cpus": 64}, "cpus")])
def test_a_stamp_is_never_overwritten(tmp_path: Path, payload: dict[str, str], machine: dict[str, int] | None,
                                      named: str) -> None:
    from _shared.record import write_json

    with pytest.raises(ValueError, match=named):
        write_json(tmp_path / "x.json", payload, command="c", machine=machine)
    assert not (tmp_path / "x.json").exists()


def test_the_shared_flags() -> None:
    from _shared.options import add_out, add_quick, add_threads, parser

    made = parser("First paragraph.\n\nSecond.")
    add_quick(made, "smoke")
    add_out(made, Path("d.json"))
    add_threads(made)
    assert made.description == "First paragraph."
    args = made.parse_args([])
    assert (args.quick, args.out, args.threads) == (False, Path("d.json"), 1)
    assert made.parse_args(["--json", "j.json"]).out == made.parse_args(["--out", "j.json"]).out == Path("j.json")
    with pytest.raises(SystemExit):
        made.parse_args(["--threads", "0"])
