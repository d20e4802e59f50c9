"""``gpipe-sim plan``'s layout options as given or, left out, today's practice for the model (Note [today's defaults]
in :mod:`sim.planning.request`), and how many rows its table ranks exactly (Note [bounded sweep] in
:mod:`sim.planning.sweep_workers`)."""

from __future__ import annotations

import argparse

from sim.cli import CommandError
from sim.cli.options import MAX_INT, integer
from sim.planning.models import get_model
from sim.planning.recompute import CHECKPOINTS
from sim.planning.request import practice_checkpoints, practice_degrees

__all__ = ["DECODERS", "ints", "keep", "layout", "words"]

DECODERS = ("gpt", "llama")  # the built-ins with a tensor-parallel split


def ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise CommandError(f"{flag} needs at least one value")
    for v in values:  # the lower bounds are sim.planning.request.check_request's
        integer(flag, v, -MAX_INT - 1)
    return values


def words(flag: str, text: str, known: tuple[str, ...]) -> list[str]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    for w in words:
        if w not in known:
            raise CommandError(f"{flag}: unknown value {w!r}; use {', '.join(known)}")
    return words


def layout(args: argparse.Namespace, gpus: list[int]) -> tuple[list[int], list[bool], list[str]]:
    """``--tensor-parallel``, ``--sequence-parallel`` and ``--checkpoint``, each as given or, left out, today's
    practice for the model (Note [today's defaults] in :mod:`sim.planning.request`)."""
    family = args.model.strip().lower().partition(":")[0]
    decoder = family in DECODERS
    if args.tensor_parallel is not None:
        degrees = ints("--tensor-parallel", args.tensor_parallel)
    elif decoder:
        integer("--gpus-per-node", args.gpus_per_node, 1, 1024)
        degrees = list(practice_degrees(get_model(args.model).splits_over, gpus, args.gpus_per_node))
    else:
        degrees = [1]
    splits = words("--sequence-parallel", args.sequence_parallel or ("on" if decoder else "off"), ("off", "on"))
    if args.checkpoint is not None:
        checkpoints = words("--checkpoint", args.checkpoint, CHECKPOINTS)
    else:
        core = decoder and get_model(args.model).attention_core is not None
        checkpoints = list(practice_checkpoints(core, args.copy_streams))
    return degrees, [w == "on" for w in splits], checkpoints


def keep(args: argparse.Namespace) -> int | None:
    """The rows of each GPU count to rank exactly (Note [bounded sweep] in :mod:`sim.planning.sweep_workers`): the
    table's ``--top`` (and ``--search``'s), or every one for ``--json``, ``--out`` or ``--top 0``, which show all."""
    if args.json or args.out is not None or args.top == 0:
        return None
    return max(args.top, args.search, 1)
