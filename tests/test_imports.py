"""Imports point one way: no circle among the modules of gpipe and sim, no arrow from gpipe to sim, sim uses
only gpipe's public names, and each package's layers hold (gpipe's folders import each other in no circle).

The graph is read from the source with ``ast``, nothing is imported: every ``import`` and ``from ... import``
counts, at module level, inside functions and under ``if TYPE_CHECKING:`` alike: a function-level import that
closes a circle is a circle still, only a later one, and a type-only one still makes each module know the
other. An import of a package that contains the importing module adds no edge: that package's ``__init__`` is
already running.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpipe", "sim")


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted name to file of every module of ``packages`` under ``root`` (a package by its ``__init__.py``)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``node``, wherever it is."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        for child in ast.iter_child_nodes(node):
            yield from imports(child)


def imported(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """What ``node`` in ``module`` imports: ``(dotted module, name)`` pairs; ``name`` is None for a whole
    module, else a name that ``from ... import`` takes from it (which may itself be a submodule)."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [(base, alias.name) for alias in node.names]


def graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Each module's imports of other modules of ``packages`` (Note in the module docstring)."""
    found = modules(root, packages)

    def known(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        for node in imports(ast.parse(path.read_text(encoding="utf-8"))):
            for base, name in imported(module, path, node):
                target = known(f"{base}.{name}" if name is not None and f"{base}.{name}" in found else base)
                if target is not None and target != module and not module.startswith(target + "."):
                    edges[module].add(target)
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def unit(module: str) -> str:
    """The folder or top-level module that ``module`` belongs to: ``gpipe.interpreter`` for
    ``gpipe.interpreter.worker``, ``gpipe.pipe`` for itself, ``gpipe`` for the package."""
    return ".".join(module.split(".")[:2])


def units(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` between units: an arrow from one folder or top-level module into another."""
    found: dict[str, set[str]] = {unit(m): set() for m in edges}
    for module, targets in edges.items():
        found[unit(module)] |= {unit(t) for t in targets} - {unit(module)}
    return found


def upward(edges: dict[str, set[str]], layers: tuple[set[str], ...],
           unit_of: Callable[[str], str] = unit) -> list[str]:
    """Each import of a module of a higher layer than the importer's, as ``"a -> b"``; ``layers`` holds units
    (``unit_of`` a module), the bottom layer first, and a module whose unit is in no layer is not checked."""
    level = {u: k for k, layer in enumerate(layers) for u in layer}
    return sorted(f"{m} -> {t}" for m, targets in edges.items() if unit_of(m) in level
                  for t in targets if level.get(unit_of(t), -1) > level[unit_of(m)])


def private_names(root: Path, user: str = "sim", owner: str = "gpipe") -> list[str]:
    """Each private name of ``owner`` that a module of ``user`` imports or reaches by attribute, as
    ``"file:line: name"``: ``from gpipe.x import _y``, ``import gpipe._x``, ``gpipe.x._y``."""

    def private(dotted: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))

    problems = []
    for module, path in modules(root, (user,)).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = f"{path.relative_to(root)}"
        bound: dict[str, str] = {}  # a local name for a module of owner -> that module's dotted name
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for base, name in imported(module, path, node):
                if base.split(".")[0] != owner:
                    continue
                dotted = base if name is None else f"{base}.{name}"
                if private(dotted):
                    problems.append(f"{where}:{node.lineno}: {dotted}")
                if isinstance(node, ast.Import):
                    alias = next(a for a in node.names if a.name == base)
                    bound[alias.asname or base.split(".")[0]] = base if alias.asname else owner
                else:
                    alias = next(a for a in node.names if a.name == name)
                    bound[alias.asname or str(name)] = dotted
        attributes = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
        inner = {id(node.value) for node in attributes}  # a.b of a.b.c: read as part of the whole chain
        for node in attributes:
            if id(node) not in inner:
                chain, value = [node.attr], node.value
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in bound:
                    dotted = ".".join([bound[value.id], *reversed(chain)])
                    if private(dotted):
                        problems.append(f"{where}:{node.lineno}: {dotted}")
    return sorted(set(problems))


# -- the project --------------------------------------------------------------------------------------


@functools.cache
def project(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """:func:`graph` of this repository's ``packages``, read once for all the tests below (none changes it)."""
    return graph(ROOT, packages)


def test_no_import_circle() -> None:
    found = cycle(project())
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_gpipe_never_imports_sim() -> None:
    arrows = sorted(f"{m} -> {t}" for m, targets in project().items() if m.split(".")[0] == "gpipe"
                    for t in targets if t.split(".")[0] == "sim")
    assert not arrows, "gpipe imports sim: " + ", ".join(arrows)


def test_sim_uses_only_public_gpipe_names() -> None:
    found = private_names(ROOT)
    assert not found, "sim imports private names of gpipe:\n" + "\n".join(found)


#: The simulator's layers (the docstring of :mod:`sim`): what each may import of sim; ``sim.files`` serves those
#: that write, ``sim.workers`` those that start processes.
LAYERS = {
    "sim.core": {"sim.core"},
    "sim.planning": {"sim.core", "sim.planning", "sim.workers"},
    "sim.ablation": {"sim.core", "sim.planning", "sim.ablation"},
    "sim.calibration": {"sim.core", "sim.calibration", "sim.files", "sim.workers"},
    "sim.cli": {"sim.core", "sim.planning", "sim.calibration", "sim.cli", "sim.files", "sim.workers"},
}


def test_the_simulator_imports_only_the_layers_below_it() -> None:
    arrows = sorted(f"{m} -> {t}" for m, targets in project().items() if unit(m) in LAYERS
                    for t in targets if t.startswith("sim") and t != "sim" and unit(t) not in LAYERS[unit(m)])
    assert not arrows, "a layer of sim imports one above it: " + ", ".join(arrows)


# Note [planning rooms]: sim.planning's rooms, the bottom first. Counting knows nothing of devices; the hardware's
# rooflines price the kinds of kernel a count names, so hardware sits above counting. Parallelism lays a
# configuration's groups on nodes and prices each dimension on the catalog's links (rings for ZeRO and context).
# Costs divide a count by a device with the tensor- and context-parallel traffic and recompute included, and measuring
# this machine's roofline runs through that cost model, so both sit above parallel. The planner (request, sweep,
# rows, plan: the package's own modules) uses them all.
PLANNING_ROOMS: tuple[set[str], ...] = (
    {"sim.planning.counting"}, {"sim.planning.hardware"}, {"sim.planning.parallel"}, {"sim.planning.costs"},
    {"sim.planning"},
)


def room(module: str) -> str:
    """The room of sim.planning that ``module`` is in: ``sim.planning.counting`` for
    ``sim.planning.counting.models.gpt``, ``sim.planning`` (the planner) for ``sim.planning.sweep``."""
    parts = module.split(".")
    return ".".join(parts[:3]) if (ROOT / Path(*parts[:3])).is_dir() else "sim.planning"


def _planning_graph() -> dict[str, set[str]]:
    """sim.planning's imports of itself."""
    return {m: {t for t in targets if t.startswith("sim.planning")} for m, targets in project().items()
            if m.startswith("sim.planning")}


def test_every_room_of_the_planner_has_a_layer() -> None:
    placed = set().union(*PLANNING_ROOMS)
    missing = sorted({room(m) for m in _planning_graph()} - placed)
    assert not missing, "give each a layer in PLANNING_ROOMS: " + ", ".join(missing)


def test_the_planners_rooms_import_only_the_rooms_below_them() -> None:
    arrows = upward(_planning_graph(), PLANNING_ROOMS, room)
    assert not arrows, "a room of sim.planning imports one above it: " + ", ".join(arrows)


#: The executor's layers (the docstring of :mod:`gpipe`), the bottom first: a module imports its own layer and
#: those below it, and the units (folders and top-level modules) import each other in no circle.
#: DistributedGPipe is built by the front-end as GPipe is, so ``gpipe.distributed`` sits above it, beside GPipe.
GPIPE_LAYERS: tuple[set[str], ...] = (
    {"gpipe.schedule"},  # the shared language, pure Python
    {"gpipe.autograd", "gpipe.skip", "gpipe.checks", "gpipe.microbatch", "gpipe.loss", "gpipe.batchnorm"},
    {"gpipe.transport"},  # the interface, and the hand-offs behind it
    {"gpipe.interpreter"},
    {"gpipe.profiling"},  # pins its timed passes to cores as the interpreter pins its workers
    {"gpipe.frontend"},
    {"gpipe.pipe", "gpipe.distributed", "gpipe.balance"},
    {"gpipe"},
)

#: Imports up the layers, known and pending their fix: none (the wire between ranks lives in gpipe.distributed, beside
#: the clock, faults and group it reports through). A pending pair leaves once it is gone (the test below).
PENDING: set[tuple[str, str]] = set()


def _gpipe_graph() -> dict[str, set[str]]:
    """gpipe's imports of itself, the pending ones left out."""
    edges = project(("gpipe",))
    return {m: {t for t in targets if (m, t) not in PENDING} for m, targets in edges.items()}


def test_every_unit_of_the_executor_has_a_layer() -> None:
    placed = set().union(*GPIPE_LAYERS)
    missing = sorted({unit(m) for m in project(("gpipe",))} - placed)
    assert not missing, "give each a layer in GPIPE_LAYERS: " + ", ".join(missing)


def test_the_executor_imports_only_the_layers_below_it() -> None:
    arrows = upward(_gpipe_graph(), GPIPE_LAYERS)
    assert not arrows, "a layer of gpipe imports one above it: " + ", ".join(arrows)


def test_the_executors_units_import_each_other_in_no_circle() -> None:
    found = cycle(units(_gpipe_graph()))
    assert found is None, "import circle between units of gpipe: " + " -> ".join(found or [])


def test_each_pending_import_is_still_there() -> None:
    """A pending import that is gone leaves :data:`PENDING`, so the layers hold it from then on."""
    edges = project(("gpipe",))
    gone = sorted(f"{m} -> {t}" for m, t in PENDING if t not in edges.get(m, set()))
    assert not gone, "no longer imported, take it out of PENDING: " + ", ".join(gone)


# -- the reader itself, on small trees ----------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _tree(tmp_path, {
        "gpipe/__init__.py": "from gpipe.a import A\n",
        "gpipe/a.py": "from gpipe import b\nA = 1\n",
        "gpipe/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpipe.sub import D\n"
                       "def f():\n    from . import c\n"),
        "gpipe/c.py": "import torch\n",
        "gpipe/sub/__init__.py": "from .d import D\n",
        "gpipe/sub/d.py": "from ..c import _hidden\nfrom gpipe.sub import other\nD = 1\n",
        "sim/__init__.py": "",
        "sim/x.py": ("import gpipe.c\nfrom gpipe import a as alias\nfrom gpipe.c import _hidden\n"
                     "def g():\n    return gpipe.c._secret, alias.__name__, alias._y.z\n"),
    })


def test_the_graph_counts_function_level_relative_and_type_checking_imports(tree: Path) -> None:
    assert graph(tree) == {
        "gpipe": {"gpipe.a"},
        "gpipe.a": {"gpipe.b"},
        "gpipe.b": {"gpipe.c", "gpipe.sub"},  # the function's import and the TYPE_CHECKING one
        "gpipe.c": set(),
        "gpipe.sub": {"gpipe.sub.d"},
        "gpipe.sub.d": {"gpipe.c"},  # its own package is no edge
        "sim": set(),
        "sim.x": {"gpipe.c", "gpipe.a"},
    }
    assert cycle(graph(tree)) is None


def test_a_circle_is_named_from_its_first_module(tree: Path) -> None:
    (tree / "gpipe/c.py").write_text("def h():\n    import gpipe.a\n")
    assert cycle(graph(tree)) == ["gpipe.a", "gpipe.b", "gpipe.c", "gpipe.a"]


def test_units_and_layers_are_read_per_folder(tree: Path) -> None:
    edges = graph(tree)
    assert units(edges)["gpipe.b"] == {"gpipe.c", "gpipe.sub"} and units(edges)["gpipe.sub"] == {"gpipe.c"}
    layers = ({"gpipe.c"}, {"gpipe.sub", "gpipe.b"}, {"gpipe.a"}, {"gpipe"})
    assert upward(edges, layers) == []
    swapped = ({"gpipe.sub"}, {"gpipe.c"}, {"gpipe.b"}, {"gpipe.a"}, {"gpipe"})
    assert upward(edges, swapped) == ["gpipe.sub.d -> gpipe.c"]
    (tree / "gpipe/sub/e.py").write_text("E = 1\n")
    (tree / "gpipe/c.py").write_text("def h():\n    import gpipe.sub.e\n")  # a circle of units, not of modules
    assert cycle(graph(tree)) is None
    assert cycle(units(graph(tree))) == ["gpipe.c", "gpipe.sub", "gpipe.c"]


def test_private_names_imported_or_reached_by_attribute_are_found(tree: Path) -> None:
    assert private_names(tree) == ["sim/x.py:3: gpipe.c._hidden", "sim/x.py:5: gpipe.a._y.z",
                                   "sim/x.py:5: gpipe.c._secret"]
