"""``gpipe-sim plan``: what-if capacity planning, from FLOP counts to a ranked table of pipeline configurations.

The model is counted on the meta device (so ``gpt:175b`` works); every configuration of stages, replicas,
chunks, checkpointing, schedule (and stages per device, where the schedule places several) for the given GPU
counts is balanced and simulated on the hardware entry; the table lists the fastest first, the best fit ``*``::

    gpipe-sim plan --model gpt:1.3b --batch 512 --gpus 1,2,4,8 --hardware h100-sxm --link nvlink --price 2.5

The buyer's question names a target and several device types, and gets the cheapest configuration of each that
reaches the target and fits (``sim.planning.buyer``)::

    gpipe-sim plan --model gpt:13b --target-throughput 40 --hardware h100-sxm,a100-80gb \
        --price h100-sxm=2.5,a100-80gb=1.4

One published configuration is evaluated exactly with ``--balance`` (the partition), ``--replicas`` and
``--optimizer``; ``--json`` gives each row's memory per device part by part. ``--tensor-parallel`` splits every layer
of a ``gpt`` or ``llama`` model over ranks inside a node (Megatron-LM's tensor parallelism; its all-reduces run over
``--link``), each configuration then using ``t x stages x replicas`` GPUs; ``--context-parallel`` splits each
sequence over ``c`` more (:mod:`sim.planning.parallel.context_parallel`); ``--expert-parallel`` splits a mixture of
experts' routed experts over a stage's GPUs, its all-to-all priced as each task's communication
(:mod:`sim.planning.parallel.experts`, :mod:`sim.cli.plan_experts`)::

    gpipe-sim plan --model gpt:175b --batch 1536 --gpus 64 --hardware a100-80gb --link nvlink3 \
        --network infiniband-hdr --tensor-parallel 8 --stages 8 --schedule 1f1b --chunks 1536 \
        --checkpoint layers,selective

``--checkpoint layers``, ``selective`` and ``modules`` (``--recompute-modules``) recompute per layer
(:mod:`sim.planning.parallel.recompute`); ``--network``
(and ``--network-ports``) puts the nodes of ``--gpus-per-node`` GPUs on a network, which stage copies and data-parallel
all-reduces that cross nodes use (:mod:`sim.planning.parallel.cluster`); ``--system`` names the machine whole
(:mod:`sim.planning.hardware.systems`: ``gb200-nvl72`` is one NVLink domain of 72 GPUs). A sweep estimated past a minute
is refused before the count, with the flags that narrow it (:mod:`sim.planning.sweep_size`; ``--no-limit`` runs it).

``--model`` takes a built-in (``gpt:SIZE``, ``llama:SIZE``, ``gpt:layers=...``, ``llama:layers=...``, ``resnet101``,
``unet:B,C``, ``amoebanet:L,D``; ``--help`` has them) or a user's ``MODULE:FUNCTION`` (a dotted module or a file),
whose function takes no arguments and returns an ``nn.Sequential`` and a sample input (batch in dimension 0). Too
large a built-in (:mod:`sim.planning.counting.models.limits`) is refused with an estimate before anything is counted.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from torch import nn

from gpipe.interpreter.affinity import available_cores
from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES
from gpipe.schedule.trace import write_chrome_trace
from sim.cli import CommandError
from sim.cli.options import MAX_INT, add_force, integer, number, output_folder, schedule_names, schedules_help
from sim.cli.plan_defaults import DECODERS, LINK, add_sharding_options, context, ints, keep, layout, sharding, system
from sim.cli.plan_experts import add_expert_options, expert_options, routing_of, shards_of
from sim.cli.plan_table import print_answers, print_table
from sim.cli.user_code import Target, blame, call, layer_failure, load_target
from sim.core.size import check_simulation_size
from sim.files import json_text
from sim.planning.buyer import answer
from sim.planning.counting.flops import CountError, ModelProfile, count_layers
from sim.planning.counting.models import get_model
from sim.planning.counting.training import training_policy
from sim.planning.hardware.catalog import get_device
from sim.planning.parallel.memory import COPY_STREAMS
from sim.planning.parallel.recompute import CHECKPOINTS
from sim.planning.plan import (
    GPUS_PER_NODE,
    MAX_CHUNKS,
    VIRTUAL,
    Plan,
    PlanRequest,
    check_request,
    check_tensor_parallel,
    default_training,
    plan,
    resolve_link,
    resolve_network,
    row_timeline,
)
from sim.planning.search_plan import SEARCHED
from sim.planning.sweep_size import SweepSpace, check_sweep_size

__all__ = ["add_parser", "load_model", "run"]

BUILTIN_FAMILIES = (*DECODERS, "resnet101", "resnet", "unet", "amoebanet")
BUILTINS = ("gpt:SIZE, llama:SIZE, nemotron:SIZE, gpt:layers=..., llama:layers=..., nemotron:layers=..., "
            "resnet101, unet:B,C, amoebanet:L,D")
FILES = ("plan.json", "throughput.png", "memory.png", "best.trace.json")  # what --out receives
BUYER_FILES = ("answer.json", "answer.png")  # what --out receives with --target-throughput
BUYER_BATCH = 512  # the buyer's form without --batch: a common global batch for the GPT sizes
BUYER_GPUS = "4,8,16,32"  # and without --gpus
OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")
MAX_PRICE = 1e9  # USD per GPU-hour; far above any price, and every row's cost stays finite


def add_parser(subparsers: Any) -> None:
    """Register ``plan`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser("plan", help="what-if capacity planning: sweep pipeline configurations of a model",
                              description=__doc__.split("\n\n", 1)[0].split(": ", 1)[1] if __doc__ else None)
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="gpt:SIZE (125m..175b), llama:SIZE (8b, 70b, 405b), nemotron:SIZE (15b, 340b), "
                        "deepseek:v3, deepseek:v2, mixtral:8x7b, mixtral:8x22b, qwen3:235b-a22b, "
                        "gpt:layers=L,hidden=H,heads=A,seq=S,vocab=V[,ffn=F], "
                        "llama:layers=L,hidden=H,heads=A,kv-heads=K,ffn=F,seq=S,vocab=V, nemotron:layers=... (as "
                        "llama); any family's shape also takes kv-heads=K, mlp=gelu|swiglu|relu2, "
                        "norm=layernorm|rmsnorm, position=learned|rope, qkv=fused|split, bias=on|off, tied=on|off; "
                        "resnet101, unet:B,C, amoebanet:L,D, or MODULE:FUNCTION; a decoder runs by default "
                        "what Megatron-Core runs: FlashAttention (no s x s tensor kept) and the fused kernels; "
                        "attention=math writes attention out (for --checkpoint selective), kernels=eager runs every "
                        "operator as its own kernel (gpt:175b,kernels=eager,attention=math)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help=f"global batch, samples per step (required, but {BUYER_BATCH} with --target-throughput)")
    p.add_argument("--gpus", default=None, metavar="LIST",
                   help=f"GPU counts to try, e.g. 1,2,4,8 (required, but {BUYER_GPUS} with --target-throughput)")
    p.add_argument("--hardware", default=None, metavar="NAME",
                   help="catalog device (see gpipe-sim hardware); several, comma-separated, with --target-throughput "
                        "(required, but the system's with --system)")
    p.add_argument("--system", default=None, metavar="NAME",
                   help="catalog system (dgx-h100, gb200-nvl72, ...; see gpipe-sim hardware): sets --hardware, "
                        "--link, --gpus-per-node (its NVLink domain), --network and --network-ports; each of those "
                        "given explicitly wins over the system's")
    p.add_argument("--target-throughput", default=None, metavar="RATE",
                   help="samples/s to reach (40, or 40samples), or tokens/s for a gpt or llama model (2e6tokens): "
                        "answer with the cheapest configuration per device that reaches it")
    p.add_argument("--balance", default=None, metavar="LIST",
                   help="layers per stage, pinned (a published partition); only that many stages run")
    p.add_argument("--replicas", default=None, metavar="LIST", help="data-parallel copies to allow, e.g. 1")
    p.add_argument("--stages", "--pipeline", dest="stages", default=None, metavar="LIST",
                   help="pipeline depths (devices per replica) to allow, e.g. 8 (default: every divisor)")
    p.add_argument("--sequence-parallel", default=None, metavar="LIST",
                   help="sequence parallelism (Korthikanti et al., 2022) off, on, or off,on to try both; on splits "
                        "the norms and dropouts over the tensor-parallel ranks by tokens (gpt and llama; at tensor "
                        "parallel 1 it is off; default: on for gpt and llama, else off)")
    add_sharding_options(p)
    add_expert_options(p)
    p.add_argument("--tensor-parallel", default=None, metavar="LIST",
                   help="tensor-parallel degrees to try (gpt and llama models; each divides the heads, the KV heads "
                        "and a GPU count, at most --gpus-per-node; default: every such divisor of --gpus-per-node "
                        "for gpt and llama, else 1)")
    p.add_argument("--context-parallel", default="1", metavar="LIST",
                   help="context-parallel degrees to try (gpt and llama with FlashAttention): each sequence split "
                        "over c GPUs in 2c chunks that divide it, c x tensor parallel GPUs per pipeline device; "
                        "gradients reduced over the replicas and the c ranks (default: 1, none)")
    p.add_argument("--cp-comm", default="ring", metavar="NAME",
                   help="how context-parallel ranks pass keys and values: ring (Megatron-Core's default, p2p, "
                        "overlapped with attention) or all-gather (Llama 3's, exposed) (default: ring)")
    p.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs in a node (an NVLink domain), the most a tensor-parallel group spans (default: the "
                        f"system's, else {GPUS_PER_NODE})")
    p.add_argument("--network", default=None, metavar="NAME",
                   help="catalog link between nodes, one port (infiniband-hdr, infiniband-ndr, roce-400g, ...); "
                        "stage copies and data-parallel all-reduces that cross nodes use it (default: the system's, "
                        "else none: everything on --link)")
    p.add_argument("--network-ports", type=int, default=None, metavar="K",
                   help="network ports per node (default: the system's, else one per GPU, as in DGX A100/H100)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="optimizer, with the device's default precision (or name both with --training)")
    p.add_argument("--link", default=None, metavar="NAME",
                   help=f"catalog link, or nvlink/pcie for the generation of the device (default: the system's, else "
                        f"{LINK}); the link inside a node, which the tensor-parallel all-reduces use too")
    p.add_argument("--price", default=None, metavar="USD",
                   help="price per GPU-hour, to cost each row; per device as NAME=USD,NAME=USD")
    p.add_argument("--chunks", default=None, metavar="LIST",
                   help="micro-batch counts to try (default: powers of two up to the batch, at most 128)")
    p.add_argument("--checkpoint", default=None, metavar="LIST",
                   help=f"checkpoint policies to try, of {','.join(CHECKPOINTS)}: torchgpipe's per stage, "
                        "layers (each layer keeps its input and recomputes itself), selective (the attention "
                        "core alone recomputed) or modules (--recompute-modules recomputed) (default: "
                        f"{','.join(CHECKPOINT_MODES)},layers, selective for a model that writes its attention out, "
                        "attention=math, and modules for one with MLA or MoE blocks)")
    p.add_argument("--schedule", default=",".join(SCHEDULES), metavar="LIST",
                   help=f"schedules to try, of {schedules_help()} (default: {','.join(SCHEDULES)})")
    p.add_argument("--virtual", default=",".join(map(str, VIRTUAL)), metavar="LIST",
                   help="stages per device to try, for a schedule that places several on each device "
                        f"(default: {','.join(map(str, VIRTUAL))}; a schedule without a layout runs one)")
    p.add_argument("--training", default=None, metavar="POLICY",
                   help="precision and optimizer, e.g. bf16-adam, fp32-sgd, bf16-adam-fp32grad (Megatron-LM's 18 bytes "
                        "per parameter; default: the device's 16-bit "
                        "dtype with Adam, else fp32-adam)")
    p.add_argument("--efficiency", type=float, default=None, metavar="F",
                   help="fraction of peak compute and bandwidth reached, replacing the catalog's")
    p.add_argument("--objective", choices=("throughput", "cost"), default="throughput",
                   help="what 'best' means (cost needs --price; default: throughput)")
    p.add_argument("--copy-streams", choices=COPY_STREAMS, default="shared",
                   help="copies onto a device: on one shared stream (this executor; default) or on a stream per "
                        "micro-batch (torchgpipe), each keeping its own reservation")
    p.add_argument("--search", type=int, default=0, metavar="K",
                   help="after the sweep, search a schedule for the K fastest configurations that fit, for their own "
                        "stage costs (gpipe-sim search), and print what each gained over its named schedule; a faster "
                        "one joins the table as schedule 'searched' (default: 0, none)")
    p.add_argument("--top", type=int, default=20, metavar="K",
                   help="rows to print (default: 20; 0: all). Without --json, --out or --top 0 the sweep evaluates "
                        "only what may be among the K fastest of each GPU count (the others cannot be: their "
                        "compute alone is slower) and counts the rest as skipped")
    p.add_argument("--json", action="store_true", help="print the whole plan as one JSON object")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write plan.json, throughput.png and memory.png here; a folder that already holds them is "
                        "refused unless --force")
    add_force(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-limit", action="store_true",
                   help="run a sweep estimated past a minute (refused without it, with the flags that narrow it)")
    p.set_defaults(func=run)


def load_model(spec: str) -> tuple[str, nn.Sequential, Any]:
    """The model named by ``spec``: a built-in (on meta) or a user's ``MODULE:FUNCTION``.

    Returns:
        ``(name, module, sample)``.

    Raises:
        KeyError: an unknown built-in name.
        CommandError: a ``MODULE:FUNCTION`` that cannot be imported or returns something else.
    """
    name, module, sample, _ = _load(spec)
    return name, module, sample


def _load(spec: str) -> tuple[str, nn.Sequential, Any, Target | None]:
    """:func:`load_model`, and the user's target (``None`` for a built-in)."""
    family = spec.strip().lower().partition(":")[0]
    if family in BUILTIN_FAMILIES:
        entry = get_model(spec)
        return entry.name, entry.module("meta"), entry.sample(2, "meta"), None
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        get_model(spec)  # raises KeyError listing the built-ins
        raise CommandError(f"unknown model {spec!r}")
    try:
        target = load_target(spec, "--model: ")
    except CommandError as exc:
        raise CommandError(f"{exc}; known built-ins: {BUILTINS}") from None
    result = call(target)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Sequential)):
        raise CommandError(f"--model: {spec} must return (nn.Sequential, sample input), got {type(result).__name__}")
    return spec, result[0], result[1], target


def _prices(text: str | None, devices: list[str]) -> dict[str, float | None]:
    """``--price``: one number for every device, or ``NAME=USD`` pairs."""
    out: dict[str, float | None] = dict.fromkeys(devices)
    if text is None:
        return out
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = item.rpartition("=")
        try:
            usd = float(value)
        except ValueError:
            raise CommandError(f"--price takes USD or NAME=USD,NAME=USD, got {text!r}") from None
        number("--price", usd, unit="USD per GPU-hour", maximum=MAX_PRICE)
        if not sep:
            out = dict.fromkeys(devices, usd)
        elif name.strip().lower() not in out:
            raise CommandError(f"--price names {name.strip()!r}, which is not in --hardware ({', '.join(devices)})")
        else:
            out[name.strip().lower()] = usd
    return out


def _training(args: argparse.Namespace, device: Any) -> Any:
    if args.training and args.optimizer:
        raise CommandError("give the optimizer once: --training names precision and optimizer (fp32-rmsprop), "
                           "--optimizer the optimizer alone")
    if args.training:
        return training_policy(args.training)
    return default_training(device, args.optimizer or "adam")


def run(args: argparse.Namespace) -> int:
    """Count the model, sweep, print the table (or JSON) and write the files; return the exit status."""
    system(args)  # Note [a system's flags] in sim.cli.plan_defaults
    target = _target(args.target_throughput, args.model) if args.target_throughput is not None else None
    if args.batch is None and target is None:
        raise CommandError("--batch is required (the global batch, samples per step)")
    if args.gpus is None and target is None:
        raise CommandError("--gpus is required (GPU counts to try, e.g. 1,2,4,8)")
    args.batch = BUYER_BATCH if args.batch is None else args.batch
    args.gpus = BUYER_GPUS if args.gpus is None else args.gpus
    names = [h.strip().lower() for h in args.hardware.split(",") if h.strip()]
    if len(names) != 1 and target is None:
        raise CommandError(f"--hardware names {len(names)} devices; several need --target-throughput")
    prices = _prices(args.price, names)
    if target is None:
        args.price = prices[names[0]]
        return _run_one(args)
    if args.objective == "cost":
        raise CommandError("--target-throughput picks the cheapest configuration itself; leave out --objective")
    answers = answer([_sweep(args, name, prices[name])[0] for name in names], target)
    out = output_folder(args, BUYER_FILES) if args.out is not None else None
    if out is not None:
        from sim.planning.buyer import plot_answer

        out.write_json("answer.json", [a.to_dict() for a in answers], indent=1)
        out.write_with("answer.png", lambda path: plot_answer(answers, path))
        out.finish()
    if args.json:
        print(json_text([a.to_dict() for a in answers]))
        return 0
    print_answers(answers)
    return 0


def _target(text: str, model: str) -> float:
    """``--target-throughput`` in samples/s: a number of samples/s, or of tokens/s with the suffix ``tokens``."""
    value = text.strip().lower().removesuffix("/s")
    unit = "tokens" if value.endswith("tokens") else "samples"
    try:
        rate = float(value.removesuffix(unit).strip())
    except ValueError:
        raise CommandError(f"--target-throughput takes samples/s (40, 40samples) or tokens/s (2e6tokens), got "
                           f"{text!r}") from None
    number("--target-throughput", rate, unit=f"{unit}/s", positive=True, maximum=MAX_PRICE * 1e6)
    if unit == "samples":
        return rate
    tokens = _tokens(model)
    if tokens is None:
        raise CommandError(f"--target-throughput in tokens/s needs a model with a sequence (gpt or llama); give "
                           f"{model} a target in samples/s")
    return rate / tokens


def _sweep(args: argparse.Namespace, hardware: str, price: float | None) -> tuple[Plan, Any, PlanRequest]:
    """Check the options, count the model and sweep on one device; return the plan, the --out folder and the
    request swept."""
    integer("--batch", args.batch, -MAX_INT - 1)  # check_request below says what a batch needs
    integer("--top", args.top, -MAX_INT - 1)
    integer("--search", args.search, 0, 64)
    gpus = ints("--gpus", args.gpus)
    chunks = ints("--chunks", args.chunks) if args.chunks is not None else None
    balance = ints("--balance", args.balance) if args.balance is not None else None
    replicas = ints("--replicas", args.replicas) if args.replicas is not None else None
    stages = ints("--stages", args.stages) if args.stages is not None else None
    zero, reshard, shard_group = sharding(args)
    integer("--gpus-per-node", args.gpus_per_node, 1)
    schedules = schedule_names("--schedule", args.schedule)
    virtual = ints("--virtual", args.virtual)
    if min(virtual) < 1:
        raise CommandError(f"--virtual lists stages per device, each at least 1, got {args.virtual!r}")
    device = get_device(hardware)
    if args.efficiency is not None:
        if not 0 < args.efficiency <= 1:
            raise CommandError(f"--efficiency must be in (0, 1], got {args.efficiency}")
        device = replace(device, efficiency=args.efficiency)
    training = _training(args, device)
    device.achievable_flops(training.compute)  # KeyError now if the device lacks the dtype
    if args.objective == "cost" and price is None:
        raise CommandError("--objective cost needs --price")
    check_request(args.batch, gpus, chunks)  # before the (seconds-long) count
    degrees, splits, checkpoints = layout(args, gpus)  # Note [today's defaults] in sim.planning.request
    check_tensor_parallel(degrees, gpus, args.gpus_per_node)
    if stages is not None and min(stages) < 1:
        raise CommandError(f"--stages lists pipeline depths, each at least 1, got {args.stages!r}")
    link = resolve_link(args.link, device)
    network = resolve_network(args.network) if args.network is not None else None
    if args.network_ports is not None:
        integer("--network-ports", args.network_ports, 1)
    moe = expert_options(args, routing_of(args.model), gpus, stages, degrees)
    shards = shards_of(args.model, degrees, splits, moe, args.model.strip().lower().partition(":")[0] in
                       BUILTIN_FAMILIES)  # refuses a bad degree before counting
    tokens = _tokens(args.model)
    contexts, cp_comm = context(args, tokens)
    out = output_folder(args, FILES) if args.out is not None and args.target_throughput is None else None
    profiles: dict[tuple[int, bool] | tuple[int, bool, int, int], ModelProfile] = {}
    if shards is None:
        name, module, sample, target = _load(args.model)
    layers = len(module if shards is None else next(iter(shards.values())).module("meta"))  # built, not counted
    # the sweep's largest simulation, refused before the count if it would not fit (sim.core.size)
    m = min(max(chunks) if chunks is not None else MAX_CHUNKS, args.batch)
    n = len(balance) if balance is not None else min(layers, max(gpus) * max(virtual))
    check_simulation_size(m, n, given=f"{'--chunks ' if chunks is not None else 'up to '}{m} micro-batches on up to "
                          f"{n} stages", fix="lower --chunks or --gpus")
    if not args.no_limit:  # Note [sweep limit] in sim.planning.sweep_size: before the (seconds-long) count
        space = SweepSpace(args.batch, layers, gpus, degrees, contexts, splits, checkpoints, schedules, virtual, zero,
                           chunks, stages, replicas, balance, reshard, shard_group, moe.experts)
        check_sweep_size(space, bounded=keep(args) is not None, workers=len(available_cores()))
    if shards is None:
        try:
            with blame(target) if target is not None else nullcontext():  # the user's layers run on meta here
                profiles[(1, False)] = count_layers(module, sample, dtype=training.torch_dtype)
        except CountError as error:
            if target is None:
                raise
            raise layer_failure(target, error.layer, module[error.layer], error.error) from None
    else:
        name = next(iter(shards.values())).name
        for key, shard in shards.items():  # each shard counted once, its identical blocks once
            profiles[key] = shard.count(training.torch_dtype)
    request = PlanRequest(profile=profiles, batch=args.batch, device=device, gpus=gpus, link=link, training=training,
                          chunks=chunks, checkpoints=checkpoints, schedules=schedules, virtual=virtual,
                          price_per_gpu_hour=price, objective=args.objective, model_name=name, balance=balance,
                          replicas=replicas, copy_streams=args.copy_streams, tensor_parallel=degrees,
                          gpus_per_node=args.gpus_per_node, stages=stages, network=network,
                          network_ports=args.network_ports, tokens_per_sample=tokens, zero=zero,
                          sequence_parallel=splits, search=args.search, keep=keep(args),
                          context_parallel=contexts, cp_comm=cp_comm, reshard_after_forward=reshard,
                          shard_group=shard_group, routing=moe.routing, expert_parallel=moe.expert_parallel,
                          expert_tensor_parallel=moe.expert_tensor_parallel, expert_imbalance=moe.expert_imbalance)
    result = plan(request, progress=not args.no_progress and sys.stderr.isatty())
    return result, out, request


def _tokens(spec: str) -> int | None:
    """Tokens in one sample of a built-in decoder (its sequence), or ``None`` for another model."""
    if spec.strip().lower().partition(":")[0] not in DECODERS:
        return None
    return int(get_model(spec).sample(1, "meta").shape[1])


def _run_one(args: argparse.Namespace) -> int:
    result, out, request = _sweep(args, args.hardware.strip(), args.price)
    traced = ""
    if out is not None:
        from sim.planning.plan_plot import plot_memory, plot_throughput

        written = out.write_json("plan.json", result.to_dict(), indent=1)
        out.write_with("throughput.png", lambda path: plot_throughput(result, path))
        out.write_with("memory.png", lambda path: plot_memory(result, path=path))
        best = next((r for r in result.rows if r.best and r.schedule != SEARCHED), None)
        if best is not None:  # the best named schedule's predicted timeline, collectives and all, for Perfetto
            timeline = row_timeline(request, best)
            out.write_with("best.trace.json", lambda path: write_chrome_trace(path, timeline))
            traced = ", best.trace.json"
        out.finish()
    if args.json:
        print(json_text(result.to_dict()))
        return 0
    print_table(result, args.top)
    if out is not None:
        print(f"wrote {written}, throughput.png, memory.png{traced}")
    return 0
