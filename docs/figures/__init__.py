"""The site's figures and generated markdown, one module per page: each module draws what its page shows.

A module here registers the PNGs of its page with :func:`figure` (a function ``draw(path)`` that makes
``docs/img/generated/<name>``) and the markdown that replaces its page's ``<!-- generated: NAME -->`` markers with
:func:`markdown` (a function returning ``{NAME: text}``). The page shows each drawing function's own source, cut
from the module between its ``# --8<-- [start:NAME]`` and ``# --8<-- [end:NAME]`` markers by ``pymdownx.snippets``,
so what a reader sees is what drew the figure. ``docs/make_figures.py`` imports every module here, draws, computes
and caches; ``common.py`` holds what the pages share.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["FIGURES", "FORGET", "MARKDOWN", "figure", "forget", "markdown"]

#: name of the PNG -> the function that draws it into a path.
FIGURES: dict[str, Callable[[Path], None]] = {}
#: Functions returning markdown fragments by marker name, computed once per change of the sources.
MARKDOWN: list[Callable[[], dict[str, str]]] = []
#: Functions that forget a cached answer; each build calls them (a long-lived ``mkdocs serve`` must not keep an old
#: answer).
FORGET: list[Callable[[], None]] = []


def figure(name: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    """Register a function ``draw(path)`` as the maker of ``docs/img/generated/<name>``."""

    def register(draw: Callable[[Path], None]) -> Callable[[Path], None]:
        if name in FIGURES:
            raise ValueError(f"two figures named {name!r}")
        FIGURES[name] = draw
        return draw

    return register


def markdown(make: Callable[[], dict[str, str]]) -> Callable[[], dict[str, str]]:
    """Register a function that returns markdown fragments ``{NAME: text}`` for ``<!-- generated: NAME -->``."""
    MARKDOWN.append(make)
    return make


def forget(clear: Callable[[], None]) -> None:
    """Register ``clear`` (a cache's ``cache_clear``) to be called before each build."""
    FORGET.append(clear)
