"""``gpipe-sim plan``'s expert-parallel options (``--expert-parallel``, ``--expert-tensor-parallel``,
``--expert-imbalance``, ``--node-limit``), as given or, for a mixture of experts left without them, today's practice
(Note [default expert parallelism]); every refusal comes before the model is counted
(:mod:`sim.planning.parallel.experts`). ``--recompute-modules`` is registered here too, as the recompute that MoE and
MLA models' default sweep adds (:mod:`sim.cli.plan_defaults`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sim.cli import CommandError
from sim.cli.options import integer, number
from sim.cli.plan_defaults import DECODERS, ints
from sim.planning.counting.models import ModelSpec, get_model
from sim.planning.counting.modules import MODULES
from sim.planning.parallel.experts import Routing, check_experts, check_fold, folds
from sim.planning.request import shard_keys

__all__ = ["ExpertOptions", "add_expert_options", "expert_options", "routing_of", "shards_of"]

MAX_IMBALANCE = 1e3  # far above any measured routing skew; the busiest rank cannot receive more than every token


def add_expert_options(p: argparse.ArgumentParser) -> None:
    """Register the expert-parallel options on ``plan``'s parser."""
    p.add_argument("--expert-parallel", default=None, metavar="LIST",
                   help="expert-parallel degrees to try, for a mixture of experts: its routed experts split over ep "
                        "GPUs, folded onto each stage's tensor x context x data-parallel GPUs (Megatron-Core's "
                        "parallel folding); each divides the experts (default: each such divisor up to the "
                        "stage's GPUs)")
    p.add_argument("--expert-tensor-parallel", default="1", metavar="LIST",
                   help="expert tensor-parallel degrees to try: each expert's FFN split over 1 or --tensor-parallel "
                        "ranks (default: 1)")
    p.add_argument("--expert-imbalance", type=float, default=1.0, metavar="F",
                   help="the busiest expert-parallel rank's tokens over a balanced share, >= 1 (default: 1.0, "
                        "perfectly balanced routing)")
    p.add_argument("--node-limit", type=int, default=None, metavar="M",
                   help="node-limited routing: each token's experts on at most M nodes, its all-to-all in two hops "
                        "(DeepSeek-V3's; default: the model's)")
    p.add_argument("--recompute-modules", default=None, metavar="LIST",
                   help=f"what --checkpoint modules recomputes inside each backward, of {','.join(MODULES)} "
                        "(Megatron-Core's --recompute-modules; default: DeepSeek-V3's, those of them the model has, "
                        "which the default sweep tries for a model with MLA or MoE blocks)")


@dataclass(frozen=True)
class ExpertOptions:
    """The expert-parallel part of a request: :class:`~sim.planning.request.PlanRequest`'s ``routing``,
    ``expert_parallel``, ``expert_tensor_parallel`` and ``expert_imbalance``."""

    routing: Routing | None
    expert_parallel: tuple[int, ...] = (1,)
    expert_tensor_parallel: tuple[int, ...] = (1,)
    expert_imbalance: float = 1.0

    @property
    def experts(self) -> tuple[tuple[int, int], ...]:
        """The ``(expert_parallel, expert_tensor_parallel)`` pairs swept."""
        return tuple((ep, etp) for ep in self.expert_parallel for etp in self.expert_tensor_parallel)


# Note [default expert parallelism]: asked without --expert-parallel, a mixture of experts is swept over each
# divisor of its experts that folds onto a stage's GPUs for some pipeline depth: from 1 (every expert on each GPU)
# to the stage's whole tensor x context x data group (Megatron-Core's and DeepSeek's layouts sit in between: EP 8
# in a node, DeepSeek-V3's EP 64 over 8 nodes); a configuration keeps those that fold onto its own groups.
def expert_options(args: argparse.Namespace, routing: Routing | None, gpus: Sequence[int],
                   stages: Sequence[int] | None, degrees: Sequence[int]) -> ExpertOptions:
    """The expert-parallel options of ``args`` for a model routed by ``routing`` (``None``: a dense model), checked
    (Note [default expert parallelism]).

    Raises:
        CommandError: an option that is not a number, or a node limit past the nodes an expert group can span.
        ValueError: as :func:`~sim.planning.parallel.experts.check_experts` and
            :func:`~sim.planning.parallel.experts.check_fold`.
    """
    number("--expert-imbalance", args.expert_imbalance, unit="times a balanced share", maximum=MAX_IMBALANCE)
    etps = ints("--expert-tensor-parallel", args.expert_tensor_parallel)
    if args.expert_parallel is not None:
        eps = ints("--expert-parallel", args.expert_parallel)
    elif routing is None:
        eps = [1]
    else:
        eps = [ep for ep in range(1, routing.experts + 1) if routing.experts % ep == 0
               and any(g % p == 0 and folds(1, 1, g // p, ep, 1) for g in gpus for p in (stages or range(1, g + 1)))]
    check_experts(routing, eps, etps, args.expert_imbalance)
    if any(etp not in (1, *degrees) for etp in etps):
        raise ValueError(f"expert tensor parallel degrees are 1 or a tensor-parallel degree "
                         f"({', '.join(map(str, degrees))}), got {etps}")
    check_fold(gpus, stages, eps, etps)
    if routing is None:
        if args.node_limit is not None:
            raise CommandError("--node-limit routes a mixture of experts' tokens; this model has none")
        return ExpertOptions(None)
    if args.node_limit is not None:
        integer("--node-limit", args.node_limit, 1)
        spans = max(math.ceil(ep * etp / args.gpus_per_node) for ep in eps for etp in etps)
        if args.node_limit > spans:
            raise CommandError(f"--node-limit {args.node_limit} is more nodes than an expert-parallel group spans "
                               f"({spans} of {args.gpus_per_node} GPUs at the most)")
        routing = replace(routing, node_limit=args.node_limit)
    return ExpertOptions(routing, tuple(eps), tuple(etps), float(args.expert_imbalance))


def routing_of(spec: str) -> Routing | None:
    """The router of the built-in decoder ``spec`` (its experts, ``k`` and node limit), from its config before
    anything is built; ``None`` for a dense model or one that is not a built-in decoder."""
    if spec.strip().lower().partition(":")[0] not in DECODERS:
        return None
    cfg = get_model(spec).config
    return Routing(cfg.experts, cfg.experts_per_token, cfg.node_limit) if cfg is not None and cfg.experts else None


def shards_of(spec: str, degrees: list[int], splits: list[bool], experts: ExpertOptions, builtin: bool
              ) -> dict[tuple[int, bool, int, int], ModelSpec] | None:
    """The spec of one rank's shard per ``(tensor parallel, sequence parallel, expert parallel, expert tensor
    parallel)``, for a built-in decoder (counted with its identical blocks once), and ``(1, False, 1, 1)``, the whole
    model, for a dense one; ``None`` for another model without tensor parallelism (loaded as it always was).
    ``builtin``: ``spec`` names a built-in.

    Raises:
        CommandError: tensor or sequence parallelism asked of a model without them.
        ValueError: a degree the model's heads do not take.
    """
    family = spec.strip().lower().partition(":")[0]
    if family not in DECODERS:
        if degrees != [1] and builtin:
            get_model(spec).tensor_parallel(max(degrees))  # a ValueError: the model has no split
        if degrees != [1] or any(splits):
            what = f"--tensor-parallel {max(degrees)}" if degrees != [1] else "--sequence-parallel on"
            whose = "the user's" if not builtin else "not a decoder"
            raise CommandError(f"{what} needs a built-in gpt or llama model, whose layers it splits; {spec} is "
                               f"{whose}")
        return None
    entry = get_model(spec)
    out = {} if experts.routing is not None else {(1, False, 1, 1): entry}
    for t, sp in shard_keys(degrees, splits):  # t = 1 without sequence parallelism (Note [sequence parallel needs
        # ranks] in sim.planning.request)
        shard = entry.tensor_parallel(t, sequence_parallel=sp)
        for ep, etp in ((ep, etp) for ep in experts.expert_parallel for etp in experts.expert_tensor_parallel
                        if etp in (1, t)):
            out[(t, sp, ep, etp)] = shard if experts.routing is None else \
                shard.expert_parallel(ep, etp, experts.expert_imbalance)
    return out
