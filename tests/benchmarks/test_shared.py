"""The benchmarks share one package and import no other script: a script that needs another's code finds it in
``benchmarks/_shared``, which is no script (no ``main``); its results stamp and its flags.

Imports are read from the source with ``ast``, nothing is imported: every ``import`` and ``from ... import`` counts,
at module level and inside functions alike (relative ones resolved), and so does ``importlib.import_module`` of a
literal name.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SHARED = BENCHMARKS / "_shared"
SCRIPTS = sorted(p for folder in (BENCHMARKS, BENCHMARKS / "investigations") for p in folder.glob("*.py")
                 if p.name != "__init__.py")


def module_name(path: Path) -> str:
    """``benchmarks/investigations/x.py`` -> ``benchmarks.investigations.x``."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imported_names(path: Path) -> Iterator[tuple[int, str]]:
    """The full name of each module ``path`` imports, with its line (:func:`imports`)."""
    return imports(path.read_text(), module_name(path).split(".")[:-1])


def imports(source: str, package: list[str]) -> Iterator[tuple[int, str]]:
    """The full name of each module ``source`` imports, with its line: for ``from A import b``, ``A`` and ``A.b``
    (``b`` may be a module); relative imports resolved against ``package`` (``["benchmarks", "_shared"]``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[:len(package) + 1 - node.level] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
              in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def test_there_are_scripts_and_a_shared_package() -> None:
    assert len(SCRIPTS) >= 20 and (SHARED / "__init__.py").exists()


def test_imports_are_read_in_full() -> None:
    source = "from benchmarks import fidelity\nfrom . import rounds\nfrom ..x import y\nimport_module('a.b')\n"
    assert sorted(name for _, name in imports(source, ["benchmarks", "_shared"])) == [
        "a.b", "benchmarks", "benchmarks._shared", "benchmarks._shared.rounds", "benchmarks.fidelity", "benchmarks.x",
        "benchmarks.x.y"]


@pytest.mark.parametrize("path", [*SCRIPTS, *sorted(SHARED.glob("*.py"))], ids=lambda p: p.name)
def test_no_script_is_imported(path: Path) -> None:
    scripts = {module_name(p) for p in SCRIPTS}
    found = [f"{path.name}:{line} imports {name}" for line, name in imported_names(path) if name in scripts]
    assert not found, "; ".join(found) + ": move what is shared into benchmarks/_shared"


@pytest.mark.parametrize("path", sorted(SHARED.glob("*.py")), ids=lambda p: p.name)
def test_the_shared_package_is_not_a_script(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name)}
    assert "main" not in names, f"{path.name} defines main: a script belongs in benchmarks/, not in _shared"
    assert "__main__" not in path.read_text(), f"{path.name} runs as a script"


def test_the_results_are_stamped(tmp_path: Path) -> None:
    from benchmarks._shared.machine import facts
    from benchmarks._shared.record import command_line, write_json

    script = str(BENCHMARKS / "investigations" / "x.py")
    out = write_json(tmp_path / "deep" / "x.json", {"rows": [{"a": 1}], "note": "n"},
                     command=command_line(script, ["--quick", "--out", "a b.json"]),
                     machine={"threads_per_worker": 1})
    doc = json.loads(out.read_text())
    assert list(doc)[:3] == ["command", "date", "machine"] and doc["rows"] == [{"a": 1}] and doc["note"] == "n"
    assert doc["command"] == ".venv/bin/python -m benchmarks.investigations.x --quick --out 'a b.json'"
    assert doc["date"].endswith(" UTC") and len(doc["date"]) == len("2026-12-06 08:28 UTC")
    assert set(facts()) <= set(doc["machine"]) and doc["machine"]["threads_per_worker"] == 1
    assert doc["machine"]["cpus"] >= 1 and out.read_text().endswith("}\n")
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]  # no .tmp left behind


def test_a_command_is_a_module_of_the_package(tmp_path: Path) -> None:
    from benchmarks._shared.record import command_line

    assert command_line(str(BENCHMARKS / "fidelity.py"), []) == ".venv/bin/python -m benchmarks.fidelity"
    with pytest.raises(ValueError):
        command_line(str(tmp_path / "benchmarks" / "x.py"), [])


@pytest.mark.parametrize(("payload", "machine", "named"), [({"date": "yesterday"}, None, "date"),
                                                          ({"command": "x", "machine": "y"}, None, "command, machine"),
                                                          ({}, {"cpus": 64}, "cpus")])
def test_a_stamp_is_never_overwritten(tmp_path: Path, payload: dict[str, str], machine: dict[str, int] | None,
                                      named: str) -> None:
    from benchmarks._shared.record import write_json

    with pytest.raises(ValueError, match=named):
        write_json(tmp_path / "x.json", payload, command="c", machine=machine)
    assert not (tmp_path / "x.json").exists()


def test_the_shared_flags() -> None:
    from benchmarks._shared.options import add_out, add_quick, add_threads, parser

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
