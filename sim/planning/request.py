"""What a plan is asked: :class:`PlanRequest`, checked when it is built, and the checks and resolutions it runs
(the training default, the numbers of a request; links named by family and the network are
:mod:`sim.planning.links`').

:func:`sim.planning.plan.plan` takes a request and trusts it; ``gpipe-sim plan`` calls the checks that need no model
(:func:`check_request`, :func:`check_tensor_parallel`) before counting one, so a bad request costs nothing; each
refusal is one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, schedule_kind
from sim.core.link import LinkSpec
from sim.planning.counting.counts import ModelProfile
from sim.planning.counting.training import Training, training_policy
from sim.planning.hardware.catalog import DeviceSpec, get_device
from sim.planning.links import resolve_link, resolve_network
from sim.planning.parallel.context_parallel import check_context_parallel, check_splittable
from sim.planning.parallel.experts import Routing, check_experts, check_fold
from sim.planning.parallel.memory import COPY_STREAMS
from sim.planning.parallel.recompute import check_checkpoint, modules_policy
from sim.planning.parallel.zero import ZERO_STAGES

__all__ = ["GPUS_PER_NODE", "PRACTICE_ZERO", "VIRTUAL", "PlanRequest", "check_request", "check_search",
           "check_tensor_parallel", "check_zero_stages", "default_training", "practice_checkpoints",
           "practice_degrees", "resolve_link", "resolve_network", "shard_keys"]

GPUS_PER_NODE = 8  # a tensor-parallel group stays inside a node (Note [tensor parallel ranks])
VIRTUAL = (1, 2, 4)  # default stages per device for a schedule with a layout (Note [virtual stages], configurations.py)

def default_training(device: DeviceSpec, optimizer: str = "adam") -> Training:
    """Mixed precision in the device's 16-bit dtype (bf16, else fp16), else fp32; Adam by default."""
    for dtype in ("bf16", "fp16"):
        if dtype in device.peak_flops:
            return training_policy(f"{dtype}-{optimizer}")
    return training_policy(f"fp32-{optimizer}")


# Note [today's defaults]: asked without layout flags, the planner sweeps what practitioners run (Megatron-Core,
# TorchTitan, the Llama 3 and Nemotron reports): tensor parallelism over each degree inside a node that the model's
# heads take, with sequence parallelism (it only saves memory: its collectives move what the all-reduces did);
# per-layer recompute (``layers``, ``selective`` where the model writes its attention core out, and DeepSeek-V3's
# ``modules:layernorm+mla_up_proj+moe_act`` for a model with MLA or MoE blocks: Note [recompute modules]) beside
# torchgpipe's per-stage policies; and ZeRO-1 beside plain data parallelism (Megatron's distributed optimizer).
# ZeRO-2 and -3 and sequence parallelism off stay options: they never win where ZeRO-1 fits, or cost a sweep.
# Context parallelism is 1 unless asked (``--context-parallel``), with Megatron-Core's ring (its default
# ``cp_comm_type``, p2p): practitioners turn it on for long sequences, whose one sample's activations do not fit a
# pipeline stage (Llama 3 at 128K tokens; Megatron-Core's long-context recipes), and pick its degree with the
# sequence; a sweep of every degree would multiply every other dimension's.
PRACTICE_ZERO = (0, 1)


def practice_degrees(takes: Callable[[int], bool], gpus: Sequence[int], gpus_per_node: int = GPUS_PER_NODE
                     ) -> tuple[int, ...]:
    """The tensor-parallel degrees of Note [today's defaults]: each divisor of a node's GPUs that the model
    ``takes`` (its heads divide) and that divides one of ``gpus``."""
    return tuple(t for t in range(1, gpus_per_node + 1)
                 if gpus_per_node % t == 0 and any(g % t == 0 for g in gpus) and (t == 1 or takes(t)))


def practice_checkpoints(attention_core: bool, copy_streams: str = "shared", modules: Sequence[str] = ()
                         ) -> tuple[str, ...]:
    """The recompute policies of Note [today's defaults]: torchgpipe's, ``layers`` (with one copy stream),
    ``selective`` (for a model with an attention core) and, for a model with MLA or MoE blocks, DeepSeek-V3's modules
    of those it has (``modules``: :func:`~sim.planning.parallel.recompute.deepseek_modules`)."""
    return (*CHECKPOINT_MODES, *(("layers",) if copy_streams == "shared" else ()),
            *(("selective",) if attention_core else ()), *((modules_policy(modules),) if modules else ()))


def check_request(batch: int, gpus: Sequence[int], chunks: Sequence[int] | None = None) -> None:
    """Reject a batch below 1 or below every chunk count asked for, and fewer than one GPU.

    Raises:
        ValueError: with a one-line message.
    """
    if batch < 1:
        raise ValueError(f"the batch needs at least one sample, got {batch}")
    if not gpus or min(gpus) < 1:
        raise ValueError(f"need at least one GPU, got {list(gpus)}")
    if chunks is not None:
        if not chunks or min(chunks) < 1:
            raise ValueError(f"chunks must be >= 1, got {list(chunks)}")
        if min(chunks) > batch:
            raise ValueError(f"batch {batch} is smaller than the number of chunks ({min(chunks)})")


# Note [tensor parallel ranks]: ``t`` ranks split every layer (Megatron-LM's tensor parallelism), each running its
# shard of the model (its own count: :mod:`sim.planning.counting.tensor_parallel`) with the shard's all-reduces inside
# its stages, priced on the link. They work in lockstep, so one rank's pipeline is simulated and stands for all ``t``;
# a configuration uses ``t * stages * replicas`` GPUs. The group stays inside a node (``t <= gpus_per_node``),
# where the link is. With a network, the pipeline's copies and the data-parallel all-reduce that cross nodes use
# it (:mod:`sim.planning.parallel.cluster`); without one, they are priced on the link as in one node.
def check_tensor_parallel(tensor_parallel: Sequence[int], gpus: Sequence[int],
                          gpus_per_node: int = GPUS_PER_NODE) -> None:
    """Reject tensor-parallel degrees below 1, above a node, or dividing none of the GPU counts (Note [tensor
    parallel ranks]).

    Raises:
        ValueError: with a one-line message.
    """
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"GPUs per node must be an integer >= 1, got {gpus_per_node!r}")
    if not tensor_parallel or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tensor_parallel):
        raise ValueError(f"tensor parallel degrees are integers >= 1, got {list(tensor_parallel)}")
    for t in tensor_parallel:
        if t > gpus_per_node:
            raise ValueError(f"tensor parallel {t} spans more than a node of {gpus_per_node} GPUs; a tensor-parallel "
                             "group stays inside a node")
        if all(g % t for g in gpus):  # a count it does not divide is skipped (configurations.configurations)
            them = f"{gpus[0]} GPUs" if len(gpus) == 1 else f"any of {', '.join(map(str, gpus))} GPUs"
            raise ValueError(f"tensor parallel {t} does not divide {them}")


# Note [sequence parallel needs ranks]: sequence parallelism splits the tokens over the tensor-parallel ranks; at
# t = 1 there is nothing to split, so it is the same as none (as Megatron-LM runs it), and a sweep prices t = 1
# without it: ``--tensor-parallel 1,2 --sequence-parallel on`` prices (1, off) and (2, on).
def shard_keys(degrees: Sequence[int], splits: Sequence[bool]) -> list[tuple[int, bool]]:
    """The ``(tensor_parallel, sequence_parallel)`` pairs a sweep prices, each once (Note [sequence parallel needs
    ranks])."""
    return list(dict.fromkeys((t, bool(sp) and t > 1) for t in dict.fromkeys(degrees) for sp in dict.fromkeys(splits)))


def check_zero_stages(zero: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``zero`` lists ZeRO stages (:data:`sim.planning.parallel.zero.ZERO_STAGES`)."""
    if not zero or any(isinstance(z, bool) or z not in ZERO_STAGES for z in zero):
        raise ValueError(f"zero lists ZeRO stages, of {', '.join(map(str, ZERO_STAGES))}; got {list(zero)}")


def check_search(top: int) -> None:
    """Raise ``ValueError`` unless ``top`` is a number of configurations to search, an integer >= 0."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"search takes the number of configurations to search, an integer >= 0, got {top!r}")


# Note [a request checked once]: a PlanRequest refuses bad input when it is built (``__post_init__``), so the planner
# and the sweep take it as valid and do not check it again (pricing still refuses what only pricing finds: a device
# without the policy's dtype). It keeps what it was given (a device, link or policy by name stays a name; ``None``
# stays the default) and resolves on use (:attr:`PlanRequest.device_spec`, ...), so it reads like the call it
# replaced; ``dataclasses.replace`` checks the changed request again. Its sequences become tuples: a request is
# immutable and hashable (the counts aside: a mapping has no hash).
@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What :func:`sim.planning.plan.plan` sweeps (Note [a request checked once]); keyword fields, checked when built.

    Raises:
        KeyError: unknown device, link, network or training policy.
        TypeError: a list field given something else (a string or a number).
        ValueError: a batch below 1 or below the chunks asked for, fewer than one GPU, an unknown checkpoint mode,
            schedule, objective or copy streams, a price below 0, a balance that does not cover the model's layers,
            a tensor-parallel degree above a node, not dividing a GPU count or without its shard's count, a model
            counted in another precision than the policy's, a context-parallel degree below 1, whose ``2c`` chunks
            do not divide the sequence, that no GPU count takes, or of a model without FlashAttention, an
            expert-parallel degree that does not divide the experts or fold onto a stage's GPUs (or without its
            count), an expert tensor-parallel degree neither 1 nor a tensor-parallel one, an imbalance below 1.
    """

    profile: ModelProfile | Mapping[Any, ModelProfile] = field(hash=False)
    """The counted model (:func:`sim.planning.counting.flops.count_layers`, in the policy's dtype), or for each
    tensor-parallel degree the count of one rank's shard (``{1: whole, 2: shard, ...}``; a key ``(t, True)`` for a
    sequence-parallel shard, ``(t, sp, ep, etp)`` for one rank of an expert-parallel group)."""
    batch: int
    """Global batch, samples per step."""
    device: DeviceSpec | str
    """A :class:`~sim.planning.hardware.catalog.DeviceSpec` or catalog name."""
    gpus: Sequence[int]
    """GPU counts to try."""
    link: LinkSpec | str = "pcie"
    """A :class:`~sim.core.link.LinkSpec`, a catalog name, or ``nvlink``/``pcie`` (the generation that comes with the
    device)."""
    training: Training | str | None = None
    """Precision and optimizer (:data:`sim.planning.counting.training.TRAINING`); ``None``: :func:`default_training`."""
    chunks: Sequence[int] | None = None
    """Micro-batch counts to try; ``None``: powers of two up to the batch per replica (at most 128)."""
    checkpoints: Sequence[str] = CHECKPOINT_MODES
    """Checkpoint policies to try (:data:`sim.planning.parallel.recompute.CHECKPOINTS`, or ``modules:A+B``)."""
    schedules: Sequence[str] | None = None
    """Schedule names to try; ``None``: every registered one (:data:`gpipe.schedule.SCHEDULES`) when the plan runs."""
    stages: Sequence[int] | None = None
    """Pipeline depths (devices per replica) to allow; ``None``: every divisor of each GPU count."""
    virtual: Sequence[int] = VIRTUAL
    """Stages per device to try for a schedule registered with a layout (Note [virtual stages] in
    :mod:`sim.planning.parallel.configurations`)."""
    balance: Sequence[int] | None = None
    """Layers per stage, pinned (a published partition): only pipelines of ``len(balance)`` stages run, and none is
    balanced by the planner."""
    replicas: Sequence[int] | None = None
    """Data-parallel copies to allow; ``None``: every one the GPU counts give."""
    price_per_gpu_hour: float | None = None
    """Dollars, to price each row per million samples."""
    objective: str = "throughput"
    """``throughput`` (the fastest row that fits is best) or ``cost`` (the cheapest per sample; needs a price)."""
    kernel_seconds: float | None = None
    """Fixed cost per kernel; ``None``: the device's (:mod:`sim.planning.costs.from_flops`)."""
    model_name: str = ""
    """For the result's display."""
    copy_streams: str = "shared"
    """``shared`` (this project's executor) or ``per_microbatch`` (torchgpipe's copy streams; Note [a copy stream per
    micro-batch] in :mod:`sim.planning.parallel.memory`)."""
    tensor_parallel: Sequence[int] | None = None
    """Tensor-parallel degrees to try (Note [tensor parallel ranks]); ``None``: the degrees of ``profile`` (1 for one
    count). Their all-reduces run over ``link``."""
    gpus_per_node: int = GPUS_PER_NODE
    """GPUs in a node, the most a tensor-parallel group spans."""
    network: LinkSpec | str | None = None
    """One port of the network between nodes (a catalog name or a LinkSpec); ``None``: every transfer on ``link``, as
    in one node. With it, stages and replicas are laid out on nodes (:mod:`sim.planning.parallel.cluster`): a stage copy
    that crosses nodes and a data-parallel all-reduce that spans them use the network."""
    network_ports: int | None = None
    """Network ports per node; ``None``: one per GPU."""
    tokens_per_sample: int | None = None
    """Tokens in one sample (a decoder's sequence), for tokens per second; ``None``: none."""
    zero: Sequence[int] = (0,)
    """ZeRO stages to try (:mod:`sim.planning.parallel.zero`); a configuration with one replica runs stage 0 only."""
    reshard_after_forward: Sequence[bool] = (True,)
    """ZeRO-3 only, FSDP's switch: gather each unit again before its backward (``True``, FSDP's default) and/or keep
    the stage's units gathered from its first forward to the step's end (``False``; Note [zero traffic])."""
    shard_group: int | None = None
    """Hybrid sharding (HSDP): ZeRO shards within groups of this many replicas and all-reduces each reduced shard
    across the groups; ``None``, or a group no smaller than the replicas: over all of them."""
    sequence_parallel: Sequence[bool] = (False,)
    """Sequence parallelism off and/or on, for tensor-parallel degrees above 1; on needs the counts of the
    sequence-parallel shards (keys ``(t, True)`` of ``profile``)."""
    search: int = 0
    """After the sweep, search a schedule for this many of the fastest configurations that fit, for their own stage
    costs (Note [search in a plan] in :mod:`sim.planning.search_plan`): their rows join the plan as schedule
    ``searched`` and :attr:`~sim.planning.rows.Plan.searches` says what each gained; 0: none."""

    context_parallel: Sequence[int] = (1,)
    """Context-parallel degrees to try (:mod:`sim.planning.parallel.context_parallel`): each sample's tokens split over
    ``c`` ranks, in ``2c`` chunks that divide :attr:`tokens_per_sample`; a configuration then uses ``t * c * stages *
    replicas`` GPUs. Above 1 it needs a decoder counted with FlashAttention."""
    cp_comm: str = "ring"
    """How the context-parallel ranks pass keys and values: ``ring`` (Megatron-Core's default) or ``all-gather``
    (Llama 3's; :data:`sim.planning.parallel.context_parallel.CP_COMMS`)."""

    keep: int | None = None
    """Rank exactly the ``keep`` fastest configurations of each GPU count and skip those a lower bound shows cannot be
    among them (Note [bounded sweep] in :mod:`sim.planning.sweep_workers`): the best row is the full sweep's; ``None``:
    evaluate every configuration."""

    routing: Routing | None = None
    """A mixture of experts' router (:class:`~sim.planning.parallel.experts.Routing`); ``None``: a dense model."""
    expert_parallel: Sequence[int] = (1,)
    """Expert-parallel degrees to try (:mod:`sim.planning.parallel.experts`), each dividing the routed experts and
    folding onto a stage's ``t x c x d`` GPUs; each needs the count of one of its ranks, key ``(t, sp, ep, etp)``."""
    expert_tensor_parallel: Sequence[int] = (1,)
    """Expert tensor-parallel degrees to try: 1, or a tensor-parallel degree (each expert's FFN split as the MLP)."""
    expert_imbalance: float = 1.0
    """The busiest expert-parallel rank's tokens over a balanced share (>= 1; 1.0: perfectly balanced routing)."""

    def __post_init__(self) -> None:
        if isinstance(self.profile, Mapping):
            object.__setattr__(self, "profile", MappingProxyType(dict(self.profile)))
        for name in ("gpus", "checkpoints", "virtual", "zero", "sequence_parallel", "context_parallel",
                     "reshard_after_forward", "expert_parallel", "expert_tensor_parallel"):
            object.__setattr__(self, name, _tuple(name, getattr(self, name)))
        for name in ("chunks", "schedules", "stages", "replicas", "tensor_parallel"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _tuple(name, getattr(self, name)))
        if self.balance is not None:
            object.__setattr__(self, "balance", tuple(int(b) for b in _tuple("balance", self.balance)))
        self._check()

    # -- what the request resolves to (Note [a request checked once]) ---------------------------------------------

    @property
    def device_spec(self) -> DeviceSpec:
        return get_device(self.device) if isinstance(self.device, str) else self.device

    @property
    def policy(self) -> Training:
        """The training policy: :attr:`training`, or the device's default."""
        if self.training is None:
            return default_training(self.device_spec)
        return training_policy(self.training) if isinstance(self.training, str) else self.training

    @property
    def link_spec(self) -> LinkSpec:
        return resolve_link(self.link, self.device_spec)

    @property
    def network_spec(self) -> LinkSpec | None:
        return None if self.network is None else resolve_network(self.network)

    @property
    def counts(self) -> dict[tuple[int, bool, int, int], ModelProfile]:
        """The counts keyed ``(tensor_parallel, sequence_parallel, expert_parallel, expert_tensor_parallel)``: a key
        ``t`` is ``(t, False, 1, 1)``, a key ``(t, sp)`` is ``(t, sp, 1, 1)``."""
        if isinstance(self.profile, ModelProfile):
            return {(self.profile.tensor_parallel, False, 1, 1): self.profile}
        return {(k, False, 1, 1) if isinstance(k, int) else
                (int(k[0]), bool(k[1]), *((int(k[2]), int(k[3])) if len(k) == 4 else (1, 1))): v
                for k, v in self.profile.items()}

    @property
    def schedule_names(self) -> tuple[str, ...]:
        """The schedules swept: :attr:`schedules`, or every one registered now."""
        return tuple(SCHEDULES) if self.schedules is None else tuple(self.schedules)

    @property
    def degrees(self) -> tuple[int, ...]:
        """The tensor-parallel degrees swept, each once: :attr:`tensor_parallel`, or those of the counts."""
        if self.tensor_parallel is None:
            return tuple(dict.fromkeys(key[0] for key in self.counts))
        return tuple(dict.fromkeys(self.tensor_parallel))

    @property
    def splits(self) -> tuple[bool, ...]:
        """Sequence parallelism off and/or on, each once."""
        return tuple(dict.fromkeys(bool(x) for x in self.sequence_parallel))

    @property
    def experts(self) -> tuple[tuple[int, int], ...]:
        """The ``(expert_parallel, expert_tensor_parallel)`` pairs swept, each once."""
        return tuple((ep, etp) for ep in dict.fromkeys(self.expert_parallel)
                     for etp in dict.fromkeys(self.expert_tensor_parallel))

    @property
    def shards(self) -> list[tuple[int, bool, int, int]]:
        """The ``(tensor_parallel, sequence_parallel, expert_parallel, expert_tensor_parallel)`` counts the sweep
        prices: each tensor-parallel pair asked, less sequence parallelism at ``t = 1`` (:func:`shard_keys`), with each
        expert pair whose ``etp`` is 1 or ``t``."""
        return [(t, sp, ep, etp) for t, sp in shard_keys(self.degrees, self.splits) for ep, etp in self.experts
                if etp in (1, t)]

    @property
    def contexts(self) -> tuple[int, ...]:
        """The context-parallel degrees swept, each once."""
        return tuple(dict.fromkeys(self.context_parallel))

    @property
    def layers(self) -> int:
        """The model's layers (every shard has as many)."""
        return len(self.counts[self.shards[0]])

    def _check(self) -> None:
        """Refuse a bad request with a one-line error (the class docstring lists them)."""
        device = self.device_spec  # an unknown device, policy or link: a KeyError now
        policy = self.policy
        resolve_link(self.link, device)
        counts = self.counts
        check_tensor_parallel(self.degrees, self.gpus, self.gpus_per_node)
        if not self.splits:
            raise ValueError("sequence_parallel lists False and/or True, got none")
        check_zero_stages(self.zero)
        if not self.reshard_after_forward or any(not isinstance(x, bool) for x in self.reshard_after_forward):
            raise ValueError(f"reshard_after_forward lists True and/or False, got {list(self.reshard_after_forward)}")
        group = self.shard_group
        if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
            raise ValueError(f"shard_group is a number of replicas, an integer >= 1, got {group!r}")
        check_search(self.search)
        keep = self.keep
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < max(1, self.search)):
            raise ValueError(f"keep is the number of fastest configurations per GPU count to rank exactly, an integer "
                             f">= 1 and >= search ({self.search}), got {keep!r}")
        check_experts(self.routing, self.expert_parallel, self.expert_tensor_parallel, self.expert_imbalance)
        if any(etp not in (1, *self.degrees) for etp in self.expert_tensor_parallel):
            raise ValueError(f"expert tensor parallel degrees are 1 or a tensor-parallel degree "
                             f"({', '.join(map(str, self.degrees))}), got {list(self.expert_tensor_parallel)}")
        for key in self.shards:
            t, sp, ep, etp = key
            if key not in counts or (counts[key].tensor_parallel, counts[key].sequence_parallel,
                                     counts[key].expert_parallel) != (t, sp, ep):
                what = " with sequence parallelism" if sp else ""
                what += f" and expert parallel {ep} x {etp}" if (ep, etp) != (1, 1) else ""
                raise ValueError(f"tensor parallel {t}{what} needs the count of one rank's shard (a model built with "
                                 f"tensor_parallel={t}{', sequence_parallel=True' if sp else ''}"
                                 f"{f', expert_parallel={ep}, expert_tensor_parallel={etp}' if ep * etp > 1 else ''})"
                                 f"; got counts for {sorted(counts)}")
            _check_count(counts[key], self, policy)
        check_fold(self.gpus, self.stages, self.expert_parallel, self.expert_tensor_parallel)
        if any(len(counts[k]) != self.layers for k in self.shards):
            raise ValueError("the counts of the tensor-parallel shards have different numbers of layers")
        check_context_parallel(self.context_parallel, self.cp_comm, self.tokens_per_sample)
        for c in self.contexts:
            if c > 1:
                for k in self.shards:
                    check_splittable(counts[k])
            if all(g % (t * c) for t in self.degrees for g in self.gpus):
                raise ValueError(f"context parallel {c} times each tensor-parallel degree divides none of "
                                 f"{', '.join(map(str, self.gpus))} GPUs")
        if self.copy_streams not in COPY_STREAMS:
            raise ValueError(f"copy_streams must be one of {', '.join(COPY_STREAMS)}, got {self.copy_streams!r}")
        if self.copy_streams == "per_microbatch" and "layers" in self.checkpoints:
            # Note [a copy stream per micro-batch] counts a stage's checkpoint as the input it received
            raise ValueError("checkpoint layers (Megatron-LM's) runs with one copy stream; per_microbatch copy streams "
                             "are torchgpipe's, whose checkpoint is a stage's input")
        if self.objective not in ("throughput", "cost"):
            raise ValueError(f"objective must be 'throughput' or 'cost', got {self.objective!r}")
        price = self.price_per_gpu_hour
        if price is not None and not 0 <= price < math.inf:
            raise ValueError(f"the price per GPU-hour must be a finite number >= 0, got {price}")
        if not self.virtual or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.virtual):
            raise ValueError(f"virtual lists stages per device, integers >= 1, got {list(self.virtual)}")
        _check_pins(self.balance, self.replicas, self.layers)
        ports = self.network_ports
        if ports is not None and (isinstance(ports, bool) or not isinstance(ports, int) or ports < 1):
            raise ValueError(f"network ports per node must be an integer >= 1, got {ports!r}")
        if self.network is not None:
            resolve_network(self.network)


def _tuple(name: str, value: Any) -> tuple[Any, ...]:
    """``value`` as a tuple; a string or a number is refused (a list of one is meant)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} takes a list, got {value!r}")
    return tuple(value)


def _check_count(profile: ModelProfile, request: PlanRequest, training: Training) -> None:
    """Refuse a request one count cannot run: its numbers, checkpoints, schedules, or another precision."""
    check_request(request.batch, request.gpus, request.chunks)
    for ck in request.checkpoints:
        check_checkpoint(ck)
        if ck == "selective" and profile.attention_core is None:
            raise ValueError("checkpoint selective recomputes the attention core, which this model has not "
                             "(a built-in gpt or llama with the math attention has)")
    for s in request.schedule_names:
        schedule_kind(s)  # unknown: a ValueError that lists the registered names
    size = {2: "16-bit", 4: "32-bit"}
    counted = profile.dtype.itemsize
    if counted != training.torch_dtype.itemsize:
        raise ValueError(f"the model was counted in {size.get(counted, profile.dtype)} but the training policy "
                         f"{training.name!r} computes in {training.compute}; count it in {training.torch_dtype}")


def _check_pins(balance: Sequence[int] | None, replicas: Sequence[int] | None, layers: int) -> None:
    if replicas is not None and (not replicas or any(isinstance(r, bool) or not isinstance(r, int) or r < 1
                                                     for r in replicas)):
        raise ValueError(f"replicas lists data-parallel copies, integers >= 1, got {list(replicas)}")
    if balance is not None and (not balance or min(balance) < 1 or sum(balance) != layers):
        raise ValueError(f"balance {list(balance)} must give every stage at least one layer and cover the model's "
                         f"{layers} layers exactly (it covers {sum(balance)})")
