"""Per-stage costs from FLOP and byte counts: a :class:`~sim.planning.counting.flops.ModelProfile` divided by a device
spec.

Each operator the counter saw takes the roofline of its kind and GEMM shape, plus a fixed cost per kernel, from
the device's :class:`~sim.planning.hardware.roofline.Roofline` (matrix multiplies, convolutions and memory-bound kernels
each at their own fraction). A device without one falls back to one ``efficiency`` for all work
(Note [one efficiency]): ``max(flops / (peak * efficiency), bytes / (bandwidth * efficiency)) + kernel_seconds``.
:class:`FlopCosts` turns a profile, a device and a :class:`Training` policy into the
:class:`~sim.core.cost.CostModel` of a balance.

Model state per parameter comes from a :class:`Training` policy: mixed-precision Adam keeps 16-bit
weights and gradients, 32-bit master weights and two 32-bit moments: 2 + 2 + 4 + 4 + 4 = 16 bytes
(Rajbhandari et al., 2020, ZeRO, section 3.1), 18 with 32-bit gradients (``bf16-adam-fp32grad``, as Megatron-LM
accumulates and reduces its gradients). An FP8 policy (``fp8-adam``) runs the linear products of the inner layers in
FP8, each fed by a cast kernel (Note [fp8 training] in :mod:`sim.planning.counting.fp8`), and everything else in BF16.

A tensor-parallel shard's collectives (:data:`~sim.planning.counting.counts.COLLECTIVE`,
:mod:`sim.planning.counting.tensor_parallel`) are priced on the link given for tensor parallelism, each as a ring of its
kind (all-reduce, reduce-scatter, all-gather) among the profile's ``tensor_parallel`` ranks (Note [collectives in the
stage]). A context-parallel rank's key/value traffic joins its layers' seconds the same way
(:mod:`sim.planning.parallel.context_parallel`). An expert-parallel rank's all-to-alls
(:data:`~sim.planning.counting.counts.ALL_TO_ALL`) are not compute: their seconds are the stage's
:attr:`~sim.core.cost.StageCost.communication` (:mod:`sim.planning.parallel.experts`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from sim.core.cost import IDEAL_RUNNER, CostModel, RunnerCosts, StageCost
from sim.core.link import LinkSpec
from sim.core.rings import allgather_seconds, allreduce_seconds, reduce_scatter_seconds
from sim.planning.costs.efficiency import KERNEL_SECONDS
from sim.planning.costs.op_arrays import OpArrays, op_arrays
from sim.planning.counting.counts import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    CONVOLUTION,
    MATMUL,
    REDUCE_SCATTER,
    VECTOR_MATH,
)
from sim.planning.counting.flops import ModelProfile
from sim.planning.counting.training import Training, training_policy
from sim.planning.hardware.catalog import DeviceSpec
from sim.planning.hardware.roofline import KIND_NAMES, MissingDeviceParameterError, roofline_seconds
from sim.planning.parallel.context_parallel import ContextParallel, kv_bytes
from sim.planning.parallel.experts import ExpertParallel
from sim.planning.parallel.recompute import core_table, inside_backward, inside_table, layer_saved

__all__ = ["FlopCosts"]

#: The ring that prices each collective: ``(bytes, ranks, link) -> seconds`` (:mod:`sim.core.rings`).
_RING = {ALL_REDUCE: allreduce_seconds, REDUCE_SCATTER: reduce_scatter_seconds, ALL_GATHER: allgather_seconds}


# Note [collectives in the stage]: a tensor-parallel collective runs between the GEMMs it joins, on the critical
# path of its rank (Megatron-LM overlaps few of them with compute), so it is priced into its layer's forward or
# backward seconds, as a ring on the tensor-parallel link with ``bytes`` its whole message: an all-reduce
# ``2 (t - 1) / t * bytes / bandwidth + 2 (t - 1) * latency``, a reduce-scatter or an all-gather (sequence
# parallelism's) half of that, ``(t - 1) / t * bytes / bandwidth + (t - 1) * latency``. The ranks of a group run
# the same shapes at the same time, so one rank's stage time stands for the group's. The data-parallel collectives,
# which overlap compute, are tasks of their own on the timeline instead (sim.core.collectives).


# Note [one efficiency]: applying ``efficiency`` to the bandwidth too is a modelling assumption, not a
# measurement: datasheet bandwidth is no more reachable than datasheet FLOP/s, and one number keeps calibration to
# one measurement; ``memory_efficiency`` replaces it where a separate figure is known (1.0: the datasheet rate).
# It matters for pipelines because it sets how much of a stage's time is memory-bound work (the early,
# high-resolution layers of a CNN), and so how time splits between stages; ``benchmarks/published.py`` prints both
# variants against torchgpipe's ResNet-101 speed-ups. The bytes it divides already count batch norm's second pass
# (:mod:`sim.planning.counting.operators`, Note [one operator, several kernels]).
class FlopCosts:
    """The costs of one counted model on one device under one training policy, for any balance and micro-batch.

    Per-layer times are cached per micro-batch size (a sweep asks for few distinct sizes).
    """

    def __init__(self, profile: ModelProfile, device: DeviceSpec, training: Training | str = "fp32-adam",
                 kernel_seconds: float | None = None, memory_efficiency: float | None = None,
                 tensor_link: LinkSpec | None = None, context: ContextParallel | None = None,
                 experts: ExpertParallel | None = None) -> None:
        """Args:
            profile: the counts (:func:`sim.planning.counting.flops.count_layers`).
            device: the hardware: its roofline times each kernel; without one its ``efficiency`` scales every rate.
            training: a :class:`Training` or its name.
            kernel_seconds: fixed cost per kernel; ``None``: the roofline's, or :data:`KERNEL_SECONDS`
                (Note [small micro-batches] in :mod:`sim.planning.costs.efficiency`).
            memory_efficiency: the fraction of the datasheet bandwidth memory-bound work reaches, vector-math
                kernels included; ``None``: the roofline's (``memory`` and ``vector_math``), or the device's
                ``efficiency`` (Note [one efficiency]).
            tensor_link: what the tensor-parallel collectives run over (Note [collectives in the stage]); needed
                by a profile counted with ``tensor_parallel > 1``.
            context: the context-parallel group of a profile split by
                :func:`~sim.planning.parallel.context_parallel.split_sequence`, whose key/value traffic joins each
                layer's seconds (Note [context parallel traffic] in :mod:`sim.planning.parallel.context_parallel`);
                needed by such a profile.
            experts: the expert-parallel group of a profile counted as one of its ranks, pricing its all-to-alls.

        Raises:
            KeyError: the device has no peak for the policy's compute dtype, or an unknown policy;
                :class:`~sim.planning.hardware.roofline.MissingDeviceParameterError` (a ``KeyError``) when the model
                runs an operator whose fraction the device's roofline lacks (the message names both).
            ValueError: a negative ``kernel_seconds``, a ``memory_efficiency`` outside (0, 1], a tensor-parallel
                profile without ``tensor_link``, or a context-parallel one without its ``context`` of that degree, or an
                expert-parallel one without its ``experts`` of that degree.
        """
        self.profile = profile
        self.device = device
        self.training = training_policy(training) if isinstance(training, str) else training
        roofline = device.roofline
        if kernel_seconds is None:
            kernel_seconds = KERNEL_SECONDS if roofline is None else roofline.kernel_seconds
        if kernel_seconds < 0:
            raise ValueError(f"kernel_seconds must be >= 0, got {kernel_seconds!r}")
        if memory_efficiency is not None and not 0 < memory_efficiency <= 1:
            raise ValueError(f"memory_efficiency is a fraction of the datasheet bandwidth in (0, 1], "
                             f"got {memory_efficiency!r}")
        if profile.tensor_parallel > 1 and tensor_link is None:
            raise ValueError(f"the model was counted as a shard of {profile.tensor_parallel} tensor-parallel ranks; "
                             "give the link their collectives run over (tensor_link)")
        if (context.degree if context is not None else 1) != profile.context_parallel:
            raise ValueError(f"the model was counted as one of {profile.context_parallel} context-parallel ranks; give "
                             "a context of that degree")
        if (experts.degree if experts is not None else 1) != profile.expert_parallel:
            raise ValueError(f"the model was counted as one of {profile.expert_parallel} expert-parallel ranks; give "
                             "experts of that degree")
        self.tensor_link, self.context, self.experts = tensor_link, context, experts
        self._kv = np.array([kv_bytes(x, profile.dtype.itemsize) for x in profile.layers])
        self.kernel_seconds = kernel_seconds
        memory_efficiency_given = memory_efficiency
        if memory_efficiency is None:
            memory_efficiency = device.efficiency if roofline is None else roofline.memory
        self.memory_efficiency = memory_efficiency
        self.bandwidth = device.memory_bandwidth * self.memory_efficiency  # Note [one efficiency]
        fp8 = self.training.other_compute is not None  # Note [fp8 training] in sim.planning.counting.fp8
        self._dtype = self.training.other_compute or self.training.compute  # of every kernel not in fp8
        self._fwd = op_arrays([t.forward for t in profile.layers], fp8)
        self._bwd = op_arrays([t.backward for t in profile.layers], fp8)
        apart = [t.input_backward for t in profile.layers]
        self._bwd_in = None if any(t is None for t in apart) else op_arrays([t for t in apart if t is not None], fp8)
        self.rate, self._kind_rate, self._half_dim = self._rates(device)
        self._fp8_rate = self._linear_rate(device) if fp8 else 0.0
        self._half_dims = np.full(4, self._half_dim) if roofline is None else roofline.half_dims()
        self._backward_rate = self._backward_rates(device)
        self._kind_bandwidth = np.full(4, self.bandwidth)  # Note [vector math] in sim.planning.counting.operators
        uses_vector_math = VECTOR_MATH in set(np.concatenate([self._fwd.kinds, self._bwd.kinds]).tolist())
        if roofline is not None and uses_vector_math and memory_efficiency_given is None:
            self._kind_bandwidth[VECTOR_MATH] = device.memory_bandwidth * roofline.vector_math_fraction(device.name)
        params = np.array([layer.parameters for layer in profile.layers], dtype=np.float64)
        tensors = np.array([layer.parameter_tensors for layer in profile.layers], dtype=np.float64)
        self._param_prefix = np.concatenate([[0.0], np.cumsum(params)])
        self._tensor_prefix = np.concatenate([[0.0], np.cumsum(tensors)])
        self._tensors = tensors
        core = profile.attention_core
        self._core = None if core is None else op_arrays([core_table(t.forward, core) for t in profile.layers])
        self._core_cache: dict[tuple[int, str], np.ndarray] = {}
        self._fp8 = fp8
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._split_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._collective_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._context_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._exchange_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _rates(self, device: DeviceSpec) -> tuple[float, np.ndarray | None, float]:
        """The matrix-multiply rate, the rate per kind (roofline only) and the roofline's ``half_dim``."""
        dtype = self._dtype
        kinds = set(np.concatenate([self._fwd.kinds, self._bwd.kinds]).tolist()) & {MATMUL, CONVOLUTION}
        if device.roofline is None:
            return device.achievable_flops(dtype), None, 0.0  # raises KeyError for a missing dtype
        if kinds and dtype.lower() not in device.peak_flops:
            raise MissingDeviceParameterError(
                f"the model runs {' and '.join(KIND_NAMES[k] for k in sorted(kinds))} in {dtype}, but device "
                f"{device.name!r} has no peak_flops[{dtype!r}] (it has {', '.join(device.dtypes)}); add that peak, "
                f"or train in a dtype it has")
        peak = device.peak_flops.get(dtype.lower(), 0.0)
        per_kind = np.ones(4)
        for kind in (MATMUL, CONVOLUTION):
            if kind in kinds:
                per_kind[kind] = peak * device.roofline.fraction(kind, dtype, device.name)
        rate = per_kind[MATMUL] if MATMUL in kinds else peak * device.roofline.matmul.get(dtype.lower(), 1.0)
        return rate, per_kind, device.roofline.half_dim

    def _linear_rate(self, device: DeviceSpec) -> float:
        """The rate of the products FP8 training runs in ``compute`` (Note [fp8 training] in sim.planning.counting.fp8).

        Raises:
            KeyError: the device has no peak for ``compute`` (one line), or its roofline no fraction for it.
        """
        dtype = self.training.compute
        rate = device.achievable_flops(dtype)  # refuses a device without the dtype
        if device.roofline is None:
            return rate
        return device.peak_flops[dtype.lower()] * device.roofline.fraction(MATMUL, dtype, device.name)

    def _backward_rates(self, device: DeviceSpec) -> np.ndarray | None:
        """The rate per kind in the backward: its convolutions at their own fraction (Note [backward
        convolutions] in :mod:`sim.planning.hardware.roofline`); ``None`` without a roofline."""
        if self._kind_rate is None or device.roofline is None:
            return None
        per_kind = self._kind_rate.copy()
        if CONVOLUTION in set(self._bwd.kinds.tolist()):
            dtype = self._dtype
            per_kind[CONVOLUTION] = device.peak_flops[dtype.lower()] * device.roofline.fraction(
                CONVOLUTION, dtype, device.name, backward=True)
        return per_kind

    def _seconds(self, flat: OpArrays, batch: int, backward: bool = False, collectives: bool = False,
                 attention: bool = False) -> np.ndarray:
        """Seconds of each layer of ``flat`` at ``batch``; ``collectives``: of its tensor-parallel collectives only;
        ``attention``: of its attention kernels only."""
        ring = (flat.collective > 0) & (flat.collective != ALL_TO_ALL)  # the all-to-alls: exchange_seconds
        if collectives:
            per_op = np.zeros(len(flat.collective))
            if ring.any():
                assert self.tensor_link is not None  # the constructor refuses collectives without it
                nbytes = np.maximum(flat.bytes[:, 0] + flat.bytes[:, 1] * batch, 0.0)
                where = np.flatnonzero(ring)
                per_op[where] = [_RING[int(flat.collective[i])](nbytes[i], self.profile.tensor_parallel,
                                                                self.tensor_link) for i in where]
            return _per_layer(per_op, flat)
        flops = np.maximum(flat.flops[:, 0] + flat.flops[:, 1] * batch, 0.0)
        nbytes = np.maximum(flat.bytes[:, 0] + flat.bytes[:, 1] * batch, 0.0)
        if self._kind_rate is None:
            rate = np.where(flat.fp8, self._fp8_rate, self.rate)
            per_op = np.maximum(flops / rate, nbytes / self._kind_bandwidth[flat.kinds]) + self.kernel_seconds
        else:  # the roofline of each kernel's kind and GEMM shape (sim.planning.hardware.roofline)
            rates = self._backward_rate if backward and self._backward_rate is not None else self._kind_rate
            dims = flat.dims[:, :, 0] + flat.dims[:, :, 1] * batch
            per_op = roofline_seconds(flops, nbytes, np.where(flat.fp8, self._fp8_rate, rates[flat.kinds]), dims,
                                      self._half_dims[flat.kinds], self._kind_bandwidth[flat.kinds],
                                      self.kernel_seconds)
        per_op[flat.collective == ALL_TO_ALL] = 0.0
        if ring.any():  # Note [collectives in the stage]
            assert self.tensor_link is not None
            group, link = self.profile.tensor_parallel, self.tensor_link
            where = np.flatnonzero(ring)
            per_op[where] = [_RING[int(flat.collective[i])](nbytes[i], group, link) for i in where]
        if attention:
            per_op = np.where(flat.attention, per_op, 0.0)
        return _per_layer(per_op, flat)

    def collective_seconds(self, microbatch: int) -> tuple[np.ndarray, np.ndarray]:
        """Of :meth:`layer_seconds`, what each layer's tensor-parallel collectives take, forward and backward."""
        if microbatch not in self._collective_cache:
            self._collective_cache[microbatch] = (self._seconds(self._fwd, microbatch, collectives=True),
                                                  self._seconds(self._bwd, microbatch, True, collectives=True))
        return self._collective_cache[microbatch]

    def exchange_seconds(self, microbatch: int) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, its forward all-to-alls' seconds and the bytes they send: a stage's
        :attr:`~sim.core.cost.StageCost.communication`, not compute; the backward's move as many (Note
        [communication] in :mod:`sim.core.cost`; :meth:`~sim.planning.parallel.experts.ExpertParallel.exchanges`)."""
        if microbatch not in self._exchange_cache:
            flat, out = self._fwd, np.zeros((2, len(self._fwd.collective)))
            where = np.flatnonzero(flat.collective == ALL_TO_ALL)
            if len(where) and self.experts is not None:  # without: one rank, which sends nothing
                out[:, where] = self.experts.exchanges(flat.bytes[where, 0] + flat.bytes[where, 1] * microbatch,
                                                       np.searchsorted(flat.starts, where, "right"))
            self._exchange_cache[microbatch] = (_per_layer(out[0], flat), _per_layer(out[1], flat))
        return self._exchange_cache[microbatch]

    def context_seconds(self, microbatch: int) -> tuple[np.ndarray, np.ndarray]:
        """Of :meth:`layer_seconds`, what each layer's context-parallel key/value traffic adds, forward and backward
        (Note [context parallel traffic] in :mod:`sim.planning.parallel.context_parallel`); zeros without a context."""
        if microbatch not in self._context_cache:
            if self.context is None:
                none = np.zeros(len(self.profile))
                self._context_cache[microbatch] = (none, none)
            else:
                self._context_cache[microbatch] = self.context.seconds(
                    self._kv * microbatch, self._seconds(self._fwd, microbatch, attention=True),
                    self._seconds(self._bwd, microbatch, True, attention=True))
        return self._context_cache[microbatch]

    def layer_seconds(self, microbatch: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds of every layer for one micro-batch of ``microbatch`` samples."""
        if microbatch < 1:
            raise ValueError(f"a micro-batch needs at least one sample, got {microbatch}")
        if microbatch not in self._cache:
            fwd, bwd = self.context_seconds(microbatch)
            self._cache[microbatch] = (self._seconds(self._fwd, microbatch) + fwd,
                                       self._seconds(self._bwd, microbatch, backward=True) + bwd)
        return self._cache[microbatch]

    def core_seconds(self, microbatch: int, policy: str = "selective") -> np.ndarray:
        """Forward seconds of what ``policy`` recomputes inside every layer's backward for one micro-batch: the
        attention core (``selective``) or the marked modules (``modules:``; 0 for a layer without them).

        Raises:
            ValueError: ``selective`` for a profile without an
                :attr:`~sim.planning.counting.counts.ModelProfile.attention_core`.
        """
        if policy == "selective" and self._core is None:
            raise ValueError("selective recompute needs the model's attention core (a built-in gpt or llama with "
                             "the math attention)")
        if (microbatch, policy) not in self._core_cache:
            tables = self._core if self._core is not None and policy == "selective" else op_arrays(
                [inside_table(t.forward, policy, None) for t in self.profile.layers], self._fp8)
            self._core_cache[microbatch, policy] = self._seconds(tables, microbatch)
        return self._core_cache[microbatch, policy]

    def split_backward_seconds(self, microbatch: int) -> tuple[np.ndarray, np.ndarray]:
        """Input-gradient (``B``) and weight-gradient (``W``) seconds of every layer, for a split backward.

        ``B`` is the backward counted with the input's gradient alone, ``W`` the whole backward less ``B``
        (at least 0); see Note [split backward] in :mod:`sim.planning.counting.flops`. Each pays the device's host
        seconds per parameter tensor for the split where its roofline has them (Note [split overhead] in
        :mod:`sim.planning.hardware.roofline`).

        Raises:
            ValueError: the profile was not counted with the input gradient apart (built by hand without
                ``input_backward``): count it with :func:`~sim.planning.counting.flops.count_layers`.
        """
        if self._bwd_in is None:
            raise ValueError("this profile has no input-gradient counts (LayerProfile.input_backward) to split the "
                             "backward by; count the model with sim.planning.counting.flops.count_layers")
        if microbatch not in self._split_cache:
            whole = self.layer_seconds(microbatch)[1]
            inputs = self._seconds(self._bwd_in, microbatch, backward=True) + self.context_seconds(microbatch)[1]
            weights = np.maximum(whole - inputs, 0.0)
            roofline = self.device.roofline
            if roofline is not None:  # Note [split overhead]
                inputs = inputs + self._tensors * roofline.split_input_seconds
                weights = weights + self._tensors * roofline.split_weight_seconds
            self._split_cache[microbatch] = (inputs, weights)
        return self._split_cache[microbatch]

    def stage_parameters(self, balance: Sequence[int]) -> list[int]:
        """Parameters of each stage of ``balance``."""
        bounds = np.cumsum([0, *balance])
        return [int(self._param_prefix[b] - self._param_prefix[a]) for a, b in itertools.pairwise(bounds)]

    def update_seconds(self, balance: Sequence[int]) -> list[float]:
        """Seconds of each stage's optimizer step: one memory-bound kernel per parameter tensor."""
        bounds = np.cumsum([0, *balance])
        out = []
        for a, b in itertools.pairwise(bounds):
            params = self._param_prefix[b] - self._param_prefix[a]
            kernels = self._tensor_prefix[b] - self._tensor_prefix[a]
            out.append(float(params * self.training.update_bytes / self.bandwidth
                             + kernels * self.kernel_seconds))
        return out

    def stages(self, balance: Sequence[int], microbatch: int, split: bool = False,
               recompute: str = "never") -> tuple[StageCost, ...]:
        """One :class:`~sim.core.cost.StageCost` per stage of ``balance`` (layers per stage, in order).

        ``split``: for a schedule with ``W`` tasks, ``backward`` is the input gradient and ``weight`` the weight
        gradient (:meth:`split_backward_seconds`); otherwise ``backward`` is the whole backward.
        ``recompute``: a policy of :data:`sim.planning.parallel.recompute.CHECKPOINTS`; ``layers`` keeps each layer's
        input as ``checkpoint_bytes`` and one layer's saved bytes as ``saved_bytes``, ``selective`` takes the attention
        core's bytes out of ``saved_bytes`` and adds its forward to ``backward`` (Note [per-layer recompute] in
        :mod:`sim.planning.parallel.recompute`); the others change nothing here (the schedule recomputes).

        Raises:
            ValueError: the balance does not cover the model's layers exactly, or has an empty stage.
        """
        _check_balance(balance, len(self.profile))
        fwd, bwd = self.layer_seconds(microbatch)
        exchange, exchanged = self.exchange_seconds(microbatch)
        wgt = np.zeros_like(bwd)
        if split:
            bwd, wgt = self.split_backward_seconds(microbatch)
        layers, tr = self.profile.layers, self.training
        core = self.profile.attention_core
        if inside_backward(recompute):
            bwd = bwd + self.core_seconds(microbatch, recompute)
        if recompute == "selective":
            assert core is not None  # core_seconds raises first
            cores = np.array([core.saved_bytes * microbatch * bool(core_table(x.forward, core).kernels)
                              for x in layers])
        out = []
        start = 0
        for size in balance:
            stop = start + size
            first, last = layers[start], layers[stop - 1]
            saved = sum(q[0] + q[1] * microbatch  # Note [saved under a policy] in sim.planning.parallel.recompute
                        for q in (layer_saved(layers[i], recompute, self._fp8 and 0 < i < len(layers) - 1)
                                  for i in range(start, stop)))
            if start > 0:  # what the first layer saves of its input was counted at the previous layer
                saved += first.input_saved_bytes[0] + first.input_saved_bytes[1] * microbatch
            kept = _bytes(first.input_bytes, microbatch)
            if recompute == "selective":
                saved -= float(cores[start:stop].sum())
            elif recompute == "layers":  # Note [per-layer recompute]
                saved = max(x.saved_bytes[0] + x.saved_bytes[1] * microbatch - _bytes(x.input_bytes, microbatch)
                            for x in layers[start:stop])
                kept = sum(_bytes(x.input_bytes, microbatch) for x in layers[start:stop])
            params = int(self._param_prefix[stop] - self._param_prefix[start])
            out.append(StageCost(
                forward=float(fwd[start:stop].sum()),
                backward=float(bwd[start:stop].sum()),
                weight=float(wgt[start:stop].sum()),
                send_bytes=_bytes(last.output_bytes, microbatch),
                saved_bytes=int(round(max(saved, 0.0))),
                checkpoint_bytes=kept,
                parameter_bytes=params * tr.weight_bytes,
                gradient_bytes=params * tr.gradient_bytes,
                optimizer_bytes=params * tr.optimizer_bytes,
                communication=float(exchange[start:stop].sum()),
                communication_bytes=int(exchanged[start:stop].sum()),
            ))
            start = stop
        return tuple(out)

    def cost_model(self, balance: Sequence[int], microbatch: int,
                   microbatch_scale: Sequence[float] = (), runner: RunnerCosts = IDEAL_RUNNER,
                   split: bool = False, recompute: str = "never") -> CostModel:
        """A :class:`~sim.core.cost.CostModel` for ``balance`` at ``microbatch`` samples per micro-batch.

        Copies are priced by the link the simulator is given (``copy_seconds=None``); ``runner``: what the
        program that runs the pipeline adds (:class:`~sim.core.cost.RunnerCosts`; nothing by default);
        ``split``: price ``B`` and ``W`` apart, for a schedule with ``W`` tasks; ``recompute``: the planner's policy
        (:meth:`stages`).
        """
        return CostModel(self.stages(balance, microbatch, split, recompute), copy_seconds=None,
                         runner=runner, microbatch_scale=tuple(microbatch_scale))


def _per_layer(per_op: np.ndarray, flat: OpArrays) -> np.ndarray:
    per_op[-1] = 0.0  # the padding row
    per_layer = np.add.reduceat(per_op, flat.starts)
    per_layer[flat.empty] = 0.0
    return per_layer


def _bytes(q: tuple[float, float], batch: int) -> int:
    return max(int(round(q[0] + q[1] * batch)), 0)


def _check_balance(balance: Sequence[int], layers: int) -> None:
    if not balance or any(int(b) < 1 for b in balance):
        raise ValueError(f"every stage needs at least one layer, got balance {list(balance)}")
    if sum(balance) != layers:
        raise ValueError(f"balance {list(balance)} covers {sum(balance)} layers but the model has {layers}")
