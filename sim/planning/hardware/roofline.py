"""A roofline per counted kernel: what a device family reaches on matrix multiplies, convolutions and memory traffic.

One counted kernel (:mod:`sim.planning.counting.operators`) of ``flops`` FLOPs moving ``bytes`` bytes takes::

    seconds = max(flops / (peak[dtype] * fraction[kind][dtype] * shape(M, N, K)),
                  bytes / (memory_bandwidth * memory)) + kernel_seconds
    shape(M, N, K) = M / (M + half_dim) * N / (N + half_dim) * K / (K + half_dim)

``kind`` is a matrix multiply, a convolution (an implicit GEMM; Note [GEMM shape] in
:mod:`sim.planning.counting.operators`) or one of the backward's convolutions (input and filter gradients); a
memory-bound kernel has no FLOPs and only the second term (:func:`roofline_seconds`), at ``memory`` or, for one with
arithmetic per element (GELU, softmax, normalisations; Note [vector math] in :mod:`sim.planning.counting.operators`),
at ``vector_math``. A :class:`Roofline` holds a device family's few named parameters, each with the source or
measurement that set it (Note [GEMM shape factor]); :class:`~sim.planning.hardware.catalog.DeviceSpec` carries one, and
:class:`~sim.planning.costs.from_flops.FlopCosts` times every kernel by it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from sim.planning.counting.counts import CONVOLUTION, MATMUL

__all__ = ["BACKWARD_CONVOLUTION_NAME", "KIND_NAMES", "MissingDeviceParameterError", "Roofline", "roofline_seconds",
           "shape_factor"]

#: What each kind of compute-bound kernel is, for messages.
KIND_NAMES = {MATMUL: "matrix multiplies (aten::mm, addmm, bmm, ...)",
              CONVOLUTION: "convolutions (aten::convolution)"}
#: What the backward's convolution kernels are, for messages.
BACKWARD_CONVOLUTION_NAME = "the backward's convolutions (input and filter gradients of aten::convolution_backward)"


class MissingDeviceParameterError(KeyError):
    """A device lacks the parameter a counted operator needs; the message names the operator and what to add."""

    def __str__(self) -> str:  # KeyError quotes its argument; this one is a sentence
        return str(self.args[0])


def _fraction(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:  # NaN fails too
        raise ValueError(f"{what} is a fraction in (0, 1], got {short(value)}")
    return float(value)


def short(value: object) -> str:
    """``repr(value)`` cut to part of a line: a huge integer from a file prints as its length."""
    if isinstance(value, int) and abs(value) >= 10**40:
        return f"an integer of about {value.bit_length() * 3 // 10 + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_number(data: Mapping[str, Any], key: str, kind: type = float, default: float | None = None,
                what: str = "") -> Any:
    """``kind(data[key])`` (``default`` where absent, ``None`` kept), refused in one line naming ``what`` and ``key``
    where it is not a number of that kind: a string, a list, an integer too large for a float, an infinity for an
    integer."""
    value = data.get(key, default)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what}{key} must be a finite number, got {short(value)}") from None


# Note [roofline bounds]: a kernel's fixed cost and a split's host seconds are microseconds and a GEMM tile is tens to
# hundreds wide, so a roofline read from a file refuses more than a second per kernel or a half_dim above 2^20: the
# sums of a step's seconds stay finite and meaningful.
MAX_KERNEL_SECONDS = 1.0
MAX_HALF_DIM = 2.0**20


# Note [GEMM shape factor]: a GEMM runs in tiles (a GPU's thread blocks, a CPU's register blocks); a dimension
# much larger than a tile costs nothing extra, one near it leaves tiles and units part-empty. Each of M, N and K
# therefore scales the rate by d / (d + half_dim), saturating to 1 for large d, so a narrow 64-channel convolution
# or a small micro-batch reaches less of the peak than a wide one. One ``half_dim`` per device family (and one for
# its convolutions where their algorithms tile otherwise than its matrix multiplies), not per
# model; an unknown dimension (0) leaves the factor 1.
def shape_factor(dims: np.ndarray, half_dim: float | np.ndarray) -> np.ndarray:
    """Rate factor of GEMMs with ``dims`` of shape ``(ops, 3)`` (Note [GEMM shape factor]); ``half_dim`` one for
    all or one per GEMM."""
    d = np.maximum(dims, 0.0)
    h = np.asarray(half_dim, dtype=np.float64)[..., None]
    return np.prod(np.where(d > 0, d / np.maximum(d + h, 1e-300), 1.0), axis=-1)


def roofline_seconds(flops: np.ndarray, nbytes: np.ndarray, rates: np.ndarray, dims: np.ndarray,
                     half_dim: float | np.ndarray, bandwidth: float | np.ndarray, kernel_seconds: float) -> np.ndarray:
    """Seconds of each kernel (the module docstring's formula): ``rates`` is ``peak * fraction`` of each kernel's
    kind (any positive number where ``flops`` is 0), ``dims`` its ``(M, N, K)``, ``bandwidth`` the bytes/s it
    reaches and ``half_dim`` its shape's (each one for all, or one per kernel)."""
    compute = np.where(flops > 0, flops / (rates * shape_factor(dims, half_dim)), 0.0)
    return np.maximum(compute, nbytes / bandwidth) + kernel_seconds


# Note [split overhead]: a split backward (zero-bubble's B and W) runs the kernels of one whole backward, and the
# executor pays host work on top: B walks the stage's graph, W makes engine calls of its own and re-enters each
# layer's backward node for its weight half. That work grows with the layers that have parameters, not with FLOPs,
# so a device carries it per parameter tensor, for B and for W apart; it is measured on the executor's own split
# (sim.planning.costs.calibrate_split), and it is what makes a zero-bubble schedule slower than 1F1B on small layers.


# Note [backward convolutions]: a convolution's backward runs other kernels than its forward: the input gradient is
# a transposed convolution (for a strided one, mostly zeros to skip), the filter gradient a GEMM whose K runs over
# batch x pixels, and oneDNN and cuDNN pick different algorithms for each. On this machine's CPU they reach markedly
# less of the peak than the forward at the same channels, so a roofline carries their fraction apart. Devices whose
# fraction was solved from whole training steps (the catalog's GPUs) give both the same value.
@dataclass(frozen=True)
class Roofline:
    """A device family's achievable fractions, one set for every model.

    Attributes:
        matmul: fraction of ``peak_flops[dtype]`` a large matrix multiply reaches, per dtype path.
        convolution: the same for a convolution's implicit GEMM (cuDNN, oneDNN); a dtype absent here cannot
            time a convolution (:class:`MissingDeviceParameterError`).
        convolution_backward: the same for the backward's convolutions, whose implicit GEMMs have other shapes
            and other kernels than the forward's (Note [backward convolutions]); needed by a model whose backward
            runs convolutions.
        vector_math: fraction of the datasheet memory bandwidth that memory-bound kernels with arithmetic per
            element reach (Note [vector math] in :mod:`sim.planning.counting.operators`); ``None``: not known, and a
            model that runs such kernels cannot be timed (:class:`MissingDeviceParameterError`).
        convolution_half_dim: ``half_dim`` of convolutions, forward and backward; ``None``: ``half_dim``.
        memory: fraction of the datasheet memory bandwidth memory-bound kernels reach.
        kernel_seconds: fixed cost of one kernel (launch, ramp-up and tail), seconds.
        half_dim: the GEMM dimension at which that dimension alone halves the rate (Note [GEMM shape factor]).
        split_input_seconds: host seconds a split backward adds to its ``B`` per parameter tensor of the stage, and
        split_weight_seconds: to its ``W``, beyond the kernels one whole backward runs (Note [split overhead]);
            0: not measured, as on a GPU whose host runs ahead of its kernels.
        source: where each number comes from (a measurement, a datasheet, or the one published run that set it).
    """

    matmul: Mapping[str, float] = field(hash=False)
    convolution: Mapping[str, float] = field(hash=False)
    memory: float
    kernel_seconds: float
    half_dim: float
    source: str = ""
    convolution_backward: Mapping[str, float] = field(default_factory=dict, hash=False)
    vector_math: float | None = None
    convolution_half_dim: float | None = None
    split_input_seconds: float = 0.0
    split_weight_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name in ("matmul", "convolution", "convolution_backward"):
            table = {k.lower(): _fraction(f"roofline {name} fraction for {k}", v)
                     for k, v in getattr(self, name).items()}
            object.__setattr__(self, name, MappingProxyType(table))
        _fraction("roofline memory fraction", self.memory)
        if self.vector_math is not None:
            _fraction("roofline vector_math fraction", self.vector_math)
        for name, most in (("kernel_seconds", MAX_KERNEL_SECONDS), ("half_dim", MAX_HALF_DIM),
                           ("split_input_seconds", MAX_KERNEL_SECONDS), ("split_weight_seconds", MAX_KERNEL_SECONDS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise ValueError(f"roofline {name} must be a finite number >= 0, got {short(value)}")
            if value > most:
                raise ValueError(f"roofline {name} must be at most {most:g} (Note [roofline bounds]), got {value!r}")
        conv = self.convolution_half_dim
        if conv is not None and not (isinstance(conv, (int, float)) and 0 <= conv <= MAX_HALF_DIM):
            raise ValueError(f"roofline convolution_half_dim must be a finite number from 0 to {MAX_HALF_DIM:g} or "
                             f"None, got {short(conv)}")

    def fraction(self, kind: int, dtype: str, device: str = "this device", backward: bool = False) -> float:
        """The fraction of peak kernels of ``kind`` reach in ``dtype`` (``backward``: in the backward pass).

        Raises:
            MissingDeviceParameterError: the roofline has no fraction for that kind and dtype.
        """
        what = KIND_NAMES[kind]
        table, field_name = self.matmul, "matmul"
        if kind == CONVOLUTION and backward:
            table, field_name, what = self.convolution_backward, "convolution_backward", BACKWARD_CONVOLUTION_NAME
        elif kind == CONVOLUTION:
            table, field_name = self.convolution, "convolution"
        try:
            return table[dtype.lower()]
        except KeyError:
            raise MissingDeviceParameterError(
                f"the model runs {what} in {dtype}, but device {device!r} has no "
                f"Roofline.{field_name}[{dtype.lower()!r}] (it has {', '.join(table) or 'none'}); add that fraction "
                f"to the device's roofline (measure it: gpipe-sim hardware --calibrate-cpu does so for a CPU), "
                f"or count the model in a dtype it has") from None

    def half_dims(self) -> np.ndarray:
        """``half_dim`` per counted kind (:mod:`sim.planning.counting.counts`: memory-bound, matmul, convolution, vector
        math), for indexing by a kernel's kind."""
        conv = self.half_dim if self.convolution_half_dim is None else self.convolution_half_dim
        return np.array([self.half_dim, self.half_dim, conv, self.half_dim])

    def vector_math_fraction(self, device: str = "this device") -> float:
        """:attr:`vector_math`.

        Raises:
            MissingDeviceParameterError: the roofline has none.
        """
        if self.vector_math is None:
            raise MissingDeviceParameterError(
                f"the model runs memory-bound kernels with arithmetic per element (GELU, softmax, normalisations, "
                f"pooling, losses: sim.planning.counting.operators.VECTOR_MATH_OPERATORS), but device {device!r} "
                f"has no Roofline.vector_math; add the fraction of its memory bandwidth they reach (measure it: "
                f"gpipe-sim hardware --calibrate-cpu does so for a CPU; a GPU streams them like other kernels, its "
                f"memory fraction)")
        return self.vector_math

    def matmul_scaled(self, scale: float, paths: tuple[str, ...], source: str) -> Roofline:
        """This roofline with the matmul fractions of ``paths`` (dtypes) times ``scale``, ``source`` saying why."""
        matmul = {k: v * scale if k in paths else v for k, v in self.matmul.items()}
        return replace(self, matmul=matmul, source=f"{self.source}; matmul: {source}")

    def to_dict(self) -> dict[str, Any]:
        return {"matmul": dict(self.matmul), "convolution": dict(self.convolution),
                "convolution_backward": dict(self.convolution_backward), "memory": self.memory,
                "vector_math": self.vector_math, "convolution_half_dim": self.convolution_half_dim,
                "kernel_seconds": self.kernel_seconds, "half_dim": self.half_dim,
                "split_input_seconds": self.split_input_seconds, "split_weight_seconds": self.split_weight_seconds,
                "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Roofline:
        """The inverse of :meth:`to_dict`; a description saved without ``convolution_backward``, ``vector_math`` or
        the split's seconds has none.

        Raises:
            ValueError: a field is missing or out of range (the message names it).
        """
        missing = [k for k in ("matmul", "convolution", "memory", "kernel_seconds", "half_dim") if k not in data]
        if missing:
            raise ValueError(f"a roofline needs {', '.join(missing)}; see sim.planning.hardware.roofline.Roofline")
        def number(key: str, default: float | None = None) -> Any:
            return json_number(data, key, default=default, what="roofline ")

        return cls(dict(data["matmul"]), dict(data["convolution"]), number("memory"), number("kernel_seconds"),
                   number("half_dim"), str(data.get("source", "")), dict(data.get("convolution_backward", {})),
                   number("vector_math"), number("convolution_half_dim"), number("split_input_seconds", 0.0),
                   number("split_weight_seconds", 0.0))
