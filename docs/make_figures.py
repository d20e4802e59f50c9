"""The site's figures and tables of simulated numbers: draw, compute and cache what ``docs/figures/`` registers.

Each page's figures and numbers are drawn by a module of its own, ``docs/figures/<page>.py``, and the page shows the
drawing code under its figure. Every PNG under ``docs/img/generated/`` comes from one function registered there with
:func:`figures.figure`; every ``<!-- generated: NAME -->`` marker in a page is replaced by the markdown that
:func:`fragments` returns under ``NAME``. The MkDocs hook (``docs/hooks/figures.py``) calls both; so can you::

    .venv/bin/python docs/make_figures.py            # draw every figure into docs/img/generated/
    .venv/bin/python docs/make_figures.py --force    # even if nothing changed
    .venv/bin/python docs/make_figures.py --readme   # redraw the README's picture (committed)

:func:`build` skips the drawing when the figures are there and no source they depend on (``gpipe/``,
``sim/``, the modules of ``docs/`` that draw or count) changed since they were drawn, so ``mkdocs serve`` does
not redraw in a loop.

The README's picture is the exception: GitHub shows the README without building the site, so that PNG is
committed (``docs/img/demo_timeline.png``) and redrawn on purpose with ``--readme``
(:func:`figures.readme.readme_figure`).
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
for _path in (ROOT, DOCS):  # the packages, and the docs' own modules (the docs are not a package)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import figures  # noqa: E402
from figures import FIGURES, FORGET, MARKDOWN  # noqa: E402

from gpipe.schedule.size import replace_file  # noqa: E402

__all__ = ["FIGURES", "build", "fragments", "main", "simulated_fragments"]

OUT = DOCS / "img" / "generated"

#: Every module of docs/figures/, imported once: importing one registers its figures and fragments.
MODULES = [importlib.import_module(f"figures.{m.name}") for m in pkgutil.iter_modules(figures.__path__)]


def _stamp() -> str:
    """A hash of every source the figures depend on."""
    import matplotlib

    h = hashlib.sha256(matplotlib.__version__.encode())
    for folder in ("gpipe", "sim"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            h.update(str(p.relative_to(ROOT)).encode())
            h.update(p.read_bytes())
    # every module of docs/ and docs/figures/: a page's module imports the docs' counting modules (cluster_numbers,
    # cp_numbers, ...), and one missing here would leave its figures and numbers stale
    for source in sorted(DOCS.glob("*.py")) + sorted((DOCS / "figures").glob("*.py")):
        h.update(source.read_bytes())
    return h.hexdigest()


def simulated_fragments() -> dict[str, str]:
    """The fragments computed by the simulator and the planner: every :func:`figures.markdown` function's."""
    out: dict[str, str] = {}
    for make in MARKDOWN:
        for name, text in make().items():
            if name in out:
                raise ValueError(f"two fragments named {name!r}")
            out[name] = text
    return out


def fragments(cache: Path | None = None) -> dict[str, str]:
    """Markdown for each ``<!-- generated: NAME -->`` marker: simulated numbers, schedule grids, benchmarks.

    Args:
        cache: a folder (the figures' folder) where the simulated fragments are kept with the stamp of the
            sources they came from; they are recomputed only when a source changed. Benchmark results are
            read anew every time.
    """
    import json

    from figures.benchmarks import benchmark_fragments

    out: dict[str, str] | None = None
    cache_file = cache / ".fragments.json" if cache is not None else None
    stamp = _stamp()
    if cache_file is not None and cache_file.exists():
        saved = json.loads(cache_file.read_text())
        if saved.get("stamp") == stamp:
            out = dict(saved["fragments"])
    if out is None:
        out = simulated_fragments()
        if cache_file is not None:  # written whole, then renamed: the tests and a build may read it meanwhile
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"stamp": stamp, "fragments": out})
            replace_file(cache_file, lambda path: path.write_text(text))
    out.update(benchmark_fragments())
    return out


def build(out: Path = OUT, *, force: bool = False, only: list[str] | None = None) -> list[Path]:
    """Draw the figures into ``out``; return the paths drawn (empty when they were up to date).

    Args:
        out: the folder for the PNGs (created if missing).
        force: draw even if the stamp says nothing changed.
        only: draw just these figure names (for tests); the stamp is then left alone.
    """
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    stamp_file = out / ".stamp"
    stamp = _stamp()
    names = list(FIGURES) if only is None else list(only)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise KeyError(f"no figure named {', '.join(unknown)}; have {', '.join(FIGURES)}")
    if (only is None and not force and stamp_file.exists() and stamp_file.read_text() == stamp
            and all((out / n).exists() for n in names)):
        return []
    for clear in FORGET:  # a long-lived process (mkdocs serve) must not keep an old answer
        clear()
    drawn = []
    for name in names:
        FIGURES[name](out / name)
        drawn.append(out / name)
    if only is None:
        stamp_file.write_text(stamp)
    return drawn


def main(argv: list[str] | None = None) -> int:
    import argparse

    from figures.readme import README_FIGURE, readme_figure

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="draw even if nothing changed")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder for the PNGs (default {OUT})")
    parser.add_argument("--readme", action="store_true",
                        help=f"redraw only the README's picture, {README_FIGURE.relative_to(ROOT)}, from the demo")
    args = parser.parse_args(argv)
    if args.readme:
        shows = readme_figure()
        print(f"drew {README_FIGURE.relative_to(ROOT)} ({shows})")
        return 0
    drawn = build(args.out, force=args.force)
    print(f"drew {len(drawn)} figures into {args.out}" if drawn else "figures up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
