"""``gpipe-sim plan``'s layout options as given or, left out, today's practice for the model (Note [today's defaults]
in :mod:`sim.planning.request`), its context parallelism checked before the model is counted, the machine a
``--system`` names (Note [a system's flags]), and how many rows its table ranks exactly (Note [bounded sweep] in
:mod:`sim.planning.sweep_workers`)."""

from __future__ import annotations

import argparse

from sim.cli import CommandError
from sim.cli.options import MAX_INT, integer
from sim.planning.counting.models import ModelSpec, get_model
from sim.planning.counting.models.decoder_specs import FAMILIES
from sim.planning.counting.modules import MODULES
from sim.planning.hardware.systems import get_system
from sim.planning.parallel.context_parallel import CP_COMMS, check_context_parallel
from sim.planning.parallel.recompute import CHECKPOINTS, deepseek_modules, modules_policy
from sim.planning.parallel.zero import ZERO_STAGES
from sim.planning.request import GPUS_PER_NODE, PRACTICE_ZERO, practice_checkpoints, practice_degrees

__all__ = ["DECODERS", "LINK", "add_sharding_options", "context", "ints", "keep", "layout", "sharding", "system",
           "words"]

DECODERS = tuple(FAMILIES)  # the built-in decoders, each with a tensor-parallel split
LINK = "pcie"  # --link without --system: the PCIe generation of the device


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
    splits = words("--sequence-parallel", args.sequence_parallel or ("on" if decoder else "off"), ("off", "on"))
    if args.tensor_parallel is not None:
        degrees = ints("--tensor-parallel", args.tensor_parallel)
    elif decoder:
        integer("--gpus-per-node", args.gpus_per_node, 1, 1024)
        entry = get_model(args.model)
        degrees = list(practice_degrees(lambda t: _splits_over(entry, t, splits), gpus, args.gpus_per_node))
    else:
        degrees = [1]
    given = _recompute_modules(args)
    practice = deepseek_modules(*_mla_or_moe(get_model(args.model))) if decoder else ()
    if args.checkpoint is not None:
        if given and "modules" not in args.checkpoint:
            raise CommandError("--recompute-modules names what --checkpoint modules recomputes; add modules to "
                               "--checkpoint")
        checkpoints = [modules_policy(given or practice or ("layernorm",)) if w == "modules" else w
                       for w in words("--checkpoint", args.checkpoint, (*CHECKPOINTS, "modules"))]
    else:
        core = decoder and get_model(args.model).attention_core is not None
        checkpoints = list(practice_checkpoints(core, args.copy_streams, given or practice))
    return degrees, [w == "on" for w in splits], checkpoints


def _mla_or_moe(entry: ModelSpec) -> tuple[bool, bool]:
    """Whether ``entry``'s decoder has MLA blocks, and MoE blocks."""
    cfg = entry.config
    return (False, False) if cfg is None else (cfg.attention_kind == "mla", cfg.experts > 0)


def _recompute_modules(args: argparse.Namespace) -> tuple[str, ...]:
    """``--recompute-modules`` (none where not given): what ``--checkpoint modules`` recomputes, which is otherwise
    DeepSeek-V3's set of the modules the model has, ``layernorm`` alone for a dense one (Note [recompute modules] in
    :mod:`sim.planning.counting.modules`)."""
    if args.recompute_modules is None:
        return ()
    names = tuple(words("--recompute-modules", args.recompute_modules, MODULES))
    if not names:
        raise CommandError("--recompute-modules needs at least one module")
    return names


def _splits_over(entry: ModelSpec, t: int, splits: list[str]) -> bool:
    """Whether ``entry`` takes ``t`` tensor-parallel ranks with each sequence parallelism of ``splits``: its heads
    divide, and its tokens too where sequence parallelism is on (a 72-GPU NVLink domain offers t = 3, which GPT-3's
    96 heads take and its 2,048 tokens do not)."""
    try:
        for split in splits:
            entry.tensor_parallel(t, sequence_parallel=split == "on")
    except ValueError:
        return False
    return True


def context(args: argparse.Namespace, tokens: int | None) -> tuple[list[int], str]:
    """``--context-parallel`` and ``--cp-comm``, checked before the model is counted: degrees of at least 1 whose
    ``2c`` chunks divide the sequence of ``tokens``, above 1 only for a built-in decoder with FlashAttention.

    Raises:
        CommandError: a degree above 1 for a model that is not a built-in decoder, or one that writes its attention
            out (``attention=math``).
        ValueError: a degree below 1, or whose chunks do not divide the sequence
            (:func:`sim.planning.parallel.context_parallel.check_context_parallel`).
    """
    degrees = ints("--context-parallel", args.context_parallel)
    comm = words("--cp-comm", args.cp_comm, CP_COMMS)
    if len(comm) != 1:
        raise CommandError(f"--cp-comm takes one of {', '.join(CP_COMMS)}, got {args.cp_comm!r}")
    big = max(degrees)
    if big > 1 and args.model.strip().lower().partition(":")[0] not in DECODERS:
        raise CommandError(f"--context-parallel {big} splits a decoder's sequence (a built-in gpt or llama); "
                           f"{args.model} is not one")
    if big > 1 and get_model(args.model).attention_core is not None:
        raise CommandError(f"--context-parallel {big} splits FlashAttention (attention=flash, the default), as "
                           f"Megatron-Core's needs a fused attention; {args.model} writes its attention out")
    check_context_parallel(degrees, comm[0], tokens)
    return degrees, comm[0]


# Note [a system's flags]: ``--system NAME`` fills ``--hardware``, ``--link``, ``--gpus-per-node``, ``--network`` and
# ``--network-ports`` from the catalog's system (sim.planning.hardware.systems), and a flag given explicitly wins: a
# system is the machine a buyer names, and asking what changes with one part of it replaced (``--system dgx-h100
# --network roce-400g``; ``--system gb200-nvl72 --gpus-per-node 36`` for an NVL36) is the question that follows.
def system(args: argparse.Namespace) -> None:
    """Fill the machine's options left out from ``--system`` (Note [a system's flags]), then from their defaults.

    Raises:
        CommandError: neither ``--hardware`` nor ``--system``.
        KeyError: an unknown system (the message lists the known ones).
    """
    if args.system is not None:
        machine = get_system(args.system)
        given = {"hardware": machine.device, "link": machine.link, "gpus_per_node": machine.gpus_per_node,
                 "network": machine.network, "network_ports": machine.network_ports}
        for option, value in given.items():
            if getattr(args, option) is None:
                setattr(args, option, value)
    if args.hardware is None:
        raise CommandError("--hardware is required (a catalog device; gpipe-sim hardware lists them), or --system")
    args.link = LINK if args.link is None else args.link
    args.gpus_per_node = GPUS_PER_NODE if args.gpus_per_node is None else args.gpus_per_node


def add_sharding_options(p: argparse.ArgumentParser) -> None:
    """``--zero``, ``--reshard-after-forward`` and ``--shard-group``: how the data parallelism shards."""
    p.add_argument("--zero", default=None, metavar="LIST",
                   help="ZeRO stages of the data parallelism to try, of 0,1,2,3: 1 shards the optimizer state (and "
                        "32-bit master weights) over the replicas, 2 also the gradients, 3 also the weights (FSDP); "
                        "each layer's collectives run as tasks beside its compute "
                        f"(default: {','.join(map(str, PRACTICE_ZERO))})")
    p.add_argument("--reshard-after-forward", default="on", metavar="LIST",
                   help="ZeRO-3 (FSDP): on gathers each layer again before its backward (FSDP's default), off keeps "
                        "a stage's layers gathered from its first forward to the step's end; on,off tries both "
                        "(default: on)")
    p.add_argument("--shard-group", type=int, default=None, metavar="N",
                   help="hybrid sharding (HSDP): ZeRO shards within groups of N replicas and all-reduces each "
                        "reduced shard across the groups (default: over every replica)")


def sharding(args: argparse.Namespace) -> tuple[list[int], list[bool], int | None]:
    """The ZeRO stages, the resharding choices and the hybrid sharding group the options ask for."""
    zero = ints("--zero", args.zero) if args.zero is not None else list(PRACTICE_ZERO)
    if any(z not in ZERO_STAGES for z in zero):
        raise CommandError(f"--zero lists ZeRO stages, of {','.join(map(str, ZERO_STAGES))}; got {args.zero!r}")
    reshard = [w == "on" for w in dict.fromkeys(words("--reshard-after-forward", args.reshard_after_forward,
                                                       ("on", "off")))]
    if not reshard:
        raise CommandError("--reshard-after-forward needs on, off or on,off")
    if args.shard_group is not None:
        integer("--shard-group", args.shard_group, 1)
    return zero, reshard, args.shard_group


def keep(args: argparse.Namespace) -> int | None:
    """The rows of each GPU count to rank exactly (Note [bounded sweep] in :mod:`sim.planning.sweep_workers`): the
    table's ``--top`` (and ``--search``'s), or every one for ``--json``, ``--out`` or ``--top 0``, which show all."""
    if args.json or args.out is not None or args.top == 0:
        return None
    return max(args.top, args.search, 1)
