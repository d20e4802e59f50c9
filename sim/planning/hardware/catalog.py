"""Hardware specs: devices and links, and a small catalog of real GPUs with public sources.

A :class:`DeviceSpec` says how fast a device computes (peak FLOP/s per dtype, times an ``efficiency``
factor: the fraction of peak a real workload reaches) and how much memory it has; a :class:`~sim.core.link.LinkSpec`
says how long a copy between two devices takes (``latency + bytes / bandwidth``). Cost models built
from FLOP counts (:mod:`sim.planning.counting.flops`) divide by a device; the simulator prices copies by a link.

Units: FLOP/s, bytes, bytes/s and seconds throughout. Bandwidths are decimal (1 GB/s = 1e9 bytes/s),
as datasheets state them; link bandwidths are *per direction*. A memory capacity is the total the board
reports (``nvidia-smi``, ``rocm-smi``), not the datasheet's "80 GB": an H100 SXM is 81,559 MiB, about
79.6 GiB (Note [memory as reported]). The catalog: :data:`DEVICES` and :data:`LINKS`, looked up by
:func:`get_device` and :func:`get_link` (its sources: Notes [dense peaks], [fp64], [memory as reported],
[latencies], [NVSwitch]).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from sim.core.link import LinkSpec
from sim.planning.hardware.roofline import Roofline, json_number, short

T = TypeVar("T")

__all__ = ["DEVICES", "LINKS", "DeviceSpec", "catalog_entry", "get_device", "get_link", "load_device"]

GiB = 2**30  # bytes
MiB = 2**20  # bytes (nvidia-smi's unit)
GB = 10**9  # bytes (bandwidths)
TFLOPS = 1e12  # FLOP/s


# Note [device bounds]: a device's figures are bounded far above any product's (GB200: 5e15 FLOP/s dense fp8,
# 8e12 bytes/s; MI325X: 2.6e11 bytes), so a description from a file with a typo or a huge literal is refused when
# it is read, and every sum of its seconds and bytes stays a finite float. A description is a few kilobytes of JSON.
MAX_FLOPS = 1e18  # FLOP/s: 200 times the fastest device's
MAX_BANDWIDTH = 1e18  # bytes/s: a toy device "too fast to be memory-bound" stays expressible
MAX_MEMORY = 2**50  # bytes, a pebibyte: a host with terabytes of memory still fits
MAX_FILE_BYTES = 2**20  # of a device description
MAX_PRICE = 1e9  # USD per hour


def _positive(what: str, value: float, maximum: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                            and not math.isfinite(value)):
        raise ValueError(f"{what} must be a finite number, got {short(value)}")
    if value <= 0:
        raise ValueError(f"{what} must be > 0, got {short(value)}")
    if value > maximum:  # an int too large for a float compares exactly
        raise ValueError(f"{what} must be at most {maximum:.3g} (Note [device bounds]), got {short(value)}")


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or host) as the cost model sees it.

    Attributes:
        name: catalog key, e.g. ``"a100-80gb"``.
        peak_flops: peak FLOP/s per dtype (``"fp32"``, ``"tf32"``, ``"fp16"``, ``"bf16"``, ...); a dtype
            the device has no fast path for is simply absent.
        memory_bandwidth: bytes/s between the device and its own memory.
        memory_bytes: memory capacity, bytes.
        efficiency: achievable fraction of peak (0 < efficiency <= 1), an assumption to calibrate.
        price_per_hour: optional price hint in USD per hour; ``None`` when unknown.
        description: the product, for display.
        roofline: the achievable fractions per kernel (:class:`~sim.planning.hardware.roofline.Roofline`); ``None``:
            every kernel at ``efficiency`` of the datasheet rates (the older, one-number model).
    """

    name: str
    peak_flops: Mapping[str, float] = field(hash=False)
    memory_bandwidth: float
    memory_bytes: int
    efficiency: float = 0.5
    price_per_hour: float | None = None
    description: str = ""
    roofline: Roofline | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a device needs a name")
        if not self.peak_flops:
            raise ValueError(f"device {self.name!r} needs a peak FLOP/s figure for at least one dtype")
        for dtype, flops in self.peak_flops.items():
            _positive(f"device {self.name!r} peak FLOP/s for {dtype}", flops, MAX_FLOPS)
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
        _positive(f"device {self.name!r} memory bandwidth (bytes/s)", self.memory_bandwidth, MAX_BANDWIDTH)
        _positive(f"device {self.name!r} memory capacity (bytes)", self.memory_bytes, MAX_MEMORY)
        _positive(f"device {self.name!r} efficiency", self.efficiency)
        if self.efficiency > 1:
            raise ValueError(f"device {self.name!r} efficiency is a fraction of peak, got {self.efficiency!r} > 1")
        if self.price_per_hour is not None:
            _positive(f"device {self.name!r} price per hour", self.price_per_hour, MAX_PRICE)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes with a peak figure."""
        return tuple(self.peak_flops)

    def achievable_flops(self, dtype: str = "fp32") -> float:
        """``peak_flops[dtype] * efficiency``, FLOP/s.

        Raises:
            KeyError: the device has no figure for ``dtype``; the message is one line naming the dtypes it has.
        """
        try:
            peak = self.peak_flops[dtype.lower()]
        except KeyError:
            raise KeyError(f"{self.name} has no {dtype.upper()} peak (it computes in {', '.join(self.dtypes)}): "
                           f"train in one of those, or on a device with {dtype.upper()}") from None
        return peak * self.efficiency

    def compute_seconds(self, flops: float, dtype: str = "fp32") -> float:
        """Seconds to execute ``flops`` floating-point operations at the achievable rate."""
        if flops < 0 or math.isnan(flops):
            raise ValueError(f"FLOP count must be >= 0, got {flops!r}")
        return flops / self.achievable_flops(dtype)

    def memory_seconds(self, nbytes: float) -> float:
        """Seconds to stream ``nbytes`` through device memory at the achievable rate."""
        if nbytes < 0 or math.isnan(nbytes):
            raise ValueError(f"byte count must be >= 0, got {nbytes!r}")
        return nbytes / (self.memory_bandwidth * self.efficiency)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "description": self.description, "peak_flops": dict(self.peak_flops),
            "memory_bandwidth": self.memory_bandwidth, "memory_bytes": self.memory_bytes,
            "efficiency": self.efficiency, "price_per_hour": self.price_per_hour,
            "roofline": None if self.roofline is None else self.roofline.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceSpec:
        """The inverse of :meth:`to_dict` (what ``gpipe-sim hardware --calibrate-cpu --out`` saves).

        Raises:
            ValueError: a field is missing or out of range (the message names it).
        """
        missing = [k for k in ("name", "peak_flops", "memory_bandwidth", "memory_bytes") if k not in data]
        if missing:
            raise ValueError(f"a device description needs {', '.join(missing)} (see DeviceSpec.to_dict)")
        roofline = data.get("roofline")
        return cls(str(data["name"]), dict(data["peak_flops"]), json_number(data, "memory_bandwidth"),
                   json_number(data, "memory_bytes", int), json_number(data, "efficiency", default=0.5),
                   data.get("price_per_hour"), str(data.get("description", "")),
                   None if roofline is None else Roofline.from_dict(roofline))



# -- the catalog -------------------------------------------------------------------------------------

# Note [dense peaks]: NVIDIA datasheets since Ampere quote tensor-core figures "with sparsity" (2:4
# structured sparsity), twice the dense rate. The catalog holds the *dense* figure (half the starred
# number); training runs dense. Where a datasheet prints the dense figure too (L40S; AMD's Instinct sheets),
# the catalog takes it as printed (the L40S's starred 733 is not quite twice its dense 362.05).
#
# Note [fp64]: ``fp64`` is the tensor-core (AMD: matrix-core) FP64 rate where the device has one (A100,
# H100, H200, B200, GB200, MI300X, MI325X), the plain FP64 rate otherwise, and absent where the datasheet
# gives none (L40S: its FP64 runs at 1/64 of FP32, no fast path).
#
# Note [memory as reported]: ``memory_bytes`` is the board's memory as its own tool reports it: the "Total" of
# ``nvidia-smi`` (the wide table of recent drivers counts the driver's reserve in it; the narrow one of older
# drivers left it out) or ``rocm-smi``'s "VRAM Total Memory", with ECC as the board runs in the reports (ECC costs
# HBM nothing; on GDDR boards it holds back 1/16). The datasheet's "80 GB" is neither GB nor GiB: an H100 SXM
# reports 81,559 MiB (79.6 GiB), an A100 80GB 81,920 MiB (80 GiB), a B200's "180 GB" 183,359 MiB. Every entry cites
# its report; where none was found, the datasheet figure is read as decimal bytes (a lower bound: every report found
# is above it). CUDA itself sees less again: ``torch.cuda.get_device_properties(0).total_memory`` leaves out the
# driver's reserve (H100 SXM 81,082-81,090 MiB, A100 SXM4 80GB 81,051-81,158 MiB, H200 143,156 MiB, B200
# 182,631-182,642 MiB, by driver version), and a process's CUDA context takes a few hundred MiB of that. Neither is
# in the catalog: a plan within about 1 GiB of the limit is optimistic by that much.
#
# Note [roofline sources]: each family's Roofline (sim.planning.hardware.roofline) says what set each number. Pascal's
# convolution and matrix fractions were solved ONCE, from torchgpipe's single-P40 ResNet-101 baseline (95.862
# samples/s, benchmarks/published.py), with its memory fraction, half_dim and kernel cost fixed before: they
# then serve every model. The tensor-core families are assumptions, not measurements (no GPU was available when
# they were set): large cuBLAS GEMMs near 70% of the dense tensor peak, convolutions 60%, HBM streams 90% of the
# datasheet bandwidth, 128-wide tensor-core tiles; calibrate them on the device (gpipe-sim hardware) before trusting
# an absolute number. _TENSOR_CORE serves every tensor-core family here, AMD's matrix cores (MI300X, MI325X) and
# Ada's L40S (its GDDR6 at HBM's 90%) included, with one correction where a family's matmul ceiling was measured
# (Note [measured matmul ceilings]); its other fractions are measured on none of them.
_PASCAL = Roofline({"fp32": 0.859}, {"fp32": 0.859}, memory=0.8, kernel_seconds=5e-6, half_dim=64,
                   convolution_backward={"fp32": 0.859}, vector_math=0.8,
                   source="matmul/convolution/convolution_backward: one fraction solved once from torchgpipe's "
                          "ResNet-101 P40 baseline (a whole training step, forward and backward together); memory "
                          "and vector_math 0.8: a priori (GDDR5 copy rate); half_dim 64: a priori (cuBLAS SGEMM "
                          "tiles 128x64); 5 us per kernel: a priori (Note [small micro-batches])")
_TENSOR_CORE = Roofline({"fp64": 0.85, "fp32": 0.85, "tf32": 0.7, "fp16": 0.7, "bf16": 0.7, "fp8": 0.6},
                        {"fp64": 0.75, "fp32": 0.75, "tf32": 0.6, "fp16": 0.6, "bf16": 0.6, "fp8": 0.5},
                        memory=0.9, kernel_seconds=5e-6, half_dim=128,
                        convolution_backward={"fp64": 0.75, "fp32": 0.75, "tf32": 0.6, "fp16": 0.6, "bf16": 0.6,
                                              "fp8": 0.5}, vector_math=0.9,
                        source="assumed, not measured (Note [roofline sources] in "
                               "sim/planning/hardware/catalog.py); the backward's convolutions assumed at the "
                               "forward's fraction, vector-math kernels at the memory fraction")
# Note [measured matmul ceilings]: the Maximum Achievable Matmul FLOPS (MAMF) of a device is the best BF16 matmul
# rate a brute-force search of shapes finds (Bekman, "Machine Learning Engineering", compute/accelerator, MAMF
# comparison table): A100 SXM 267.9 of 312 TFLOPS (85.9%, CUDA 12.1), H100 SXM 792.1 of 989 (80.1%, CUDA 12.1),
# MI300X 781.9 of 1,300 (60.1%, ROCm 6.2). A training step's GEMMs are not that best shape, so _TENSOR_CORE's a-priori
# 0.7 of the peak is read as a fixed share of the A100's ceiling (0.7 / 0.859 = 0.815), and a device whose ceiling
# was measured takes the same share of its own on its tensor-core paths (TF32, FP16, BF16, FP8; only BF16 was
# measured, the others are taken with it). Each family's measurement serves its whole family (Hopper: the H100 SXM's
# for the PCIe and NVL cards, H800 and H200, the same GH100 die; CDNA 3: MI300X's for MI325X); a family measured on
# none keeps 0.7 (V100, Blackwell, the L40S). One microbenchmark per family, set once for every model.
_A100_CEILING = 267.9 / 312


_TENSOR_PATHS = ("tf32", "fp16", "bf16", "fp8")
_HOPPER = _TENSOR_CORE.matmul_scaled(792.1 / 989 / _A100_CEILING, _TENSOR_PATHS, "the H100 SXM's measured ceiling, "
                                     "80.1% of the BF16 peak (Note [measured matmul ceilings] in hardware.py)")
_CDNA3 = _TENSOR_CORE.matmul_scaled(781.9 / 1300 / _A100_CEILING, _TENSOR_PATHS, "the MI300X's measured ceiling, "
                                    "60.1% of the BF16 peak (Note [measured matmul ceilings] in hardware.py)")

_DEVICE_LIST = (
    # NVIDIA Tesla P40 datasheet (2016): 12 TFLOPS single precision, 47 TOPS INT8, 24 GB GDDR5,
    # 346 GB/s. Pascal GP102 has no fast fp16 path; the datasheet lists none, so neither do we.
    # Memory: nvidia-smi 24,451 MiB with ECC off, as in every P40 report found but one (22,919 MiB with ECC on;
    # both from older drivers, which leave the driver's reserve out: Note [memory as reported]).
    DeviceSpec("tesla-p40", {"fp32": 12 * TFLOPS}, 346 * GB, 24451 * MiB,
               description="NVIDIA Tesla P40 (Pascal, PCIe)", roofline=_PASCAL),
    # NVIDIA Tesla V100 datasheet / Volta architecture whitepaper (2017), SXM2: 15.7 TFLOPS fp32,
    # 7.8 TFLOPS fp64, 125 TFLOPS tensor (fp16 in, fp32 accumulate); 16 or 32 GB HBM2 at 900 GB/s.
    # Memory: nvidia-smi 16,384 MiB (V100 16GB, PCIe and SXM2 report alike) and 32,768 MiB (V100-SXM2-32GB).
    DeviceSpec("v100-sxm2-16gb", {"fp64": 7.8 * TFLOPS, "fp32": 15.7 * TFLOPS, "fp16": 125 * TFLOPS},
               900 * GB, 16384 * MiB, description="NVIDIA Tesla V100 SXM2 16 GB (Volta)", roofline=_TENSOR_CORE),
    DeviceSpec("v100-sxm2-32gb", {"fp64": 7.8 * TFLOPS, "fp32": 15.7 * TFLOPS, "fp16": 125 * TFLOPS},
               900 * GB, 32768 * MiB, description="NVIDIA Tesla V100 SXM2 32 GB (Volta)", roofline=_TENSOR_CORE),
    # NVIDIA A100 Tensor Core GPU datasheet (2020/2021): fp64 9.7 (tensor 19.5), fp32 19.5, TF32 156,
    # BF16/FP16 312 TFLOPS dense (312/624 with sparsity); 40 GB HBM2 at 1,555 GB/s, 80 GB HBM2e (SXM)
    # at 2,039 GB/s. Memory: nvidia-smi 40,960 MiB and 81,920 MiB (modal-labs/modal-client PR 2797, 2025).
    DeviceSpec("a100-40gb", {"fp64": 19.5 * TFLOPS, "fp32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS,
                             "fp16": 312 * TFLOPS, "bf16": 312 * TFLOPS},
               1555 * GB, 40960 * MiB, description="NVIDIA A100 40 GB SXM (Ampere)", roofline=_TENSOR_CORE),
    DeviceSpec("a100-80gb", {"fp64": 19.5 * TFLOPS, "fp32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS,
                             "fp16": 312 * TFLOPS, "bf16": 312 * TFLOPS},
               2039 * GB, 81920 * MiB, description="NVIDIA A100 80 GB SXM (Ampere)", roofline=_TENSOR_CORE),
    # NVIDIA H100 Tensor Core GPU datasheet (2022/2023), SXM: fp64 34 (tensor 67), fp32 67, TF32 989,
    # BF16/FP16 1,979, FP8 3,958 TFLOPS *with sparsity* (dense: half, Note [dense peaks]);
    # 80 GB HBM3 at 3.35 TB/s. Memory: nvidia-smi 81,559 MiB (NVIDIA/nccl issue 1264, 2024; modal PR 2797).
    DeviceSpec("h100-sxm", {"fp64": 67 * TFLOPS, "fp32": 67 * TFLOPS, "tf32": 494.5 * TFLOPS,
                            "fp16": 989.5 * TFLOPS, "bf16": 989.5 * TFLOPS, "fp8": 1979 * TFLOPS},
               3350 * GB, 81559 * MiB, description="NVIDIA H100 SXM 80 GB (Hopper)", roofline=_HOPPER),
    # The same datasheet, PCIe: fp64 26 (tensor 51), fp32 51, TF32 756, BF16/FP16 1,513, FP8 3,026 TFLOPS with
    # sparsity; 80 GB HBM2e at 2 TB/s; NVLink bridge 600 GB/s. Memory: nvidia-smi 81,559 MiB (a public
    # TensorRT-LLM test report).
    DeviceSpec("h100-pcie", {"fp64": 51 * TFLOPS, "fp32": 51 * TFLOPS, "tf32": 378 * TFLOPS,
                             "fp16": 756.5 * TFLOPS, "bf16": 756.5 * TFLOPS, "fp8": 1513 * TFLOPS},
               2000 * GB, 81559 * MiB, description="NVIDIA H100 PCIe 80 GB (Hopper)", roofline=_HOPPER),
    # NVIDIA H100 product page (2024; per GPU, where the 2023 NVL datasheet gave a pair): fp64 30 (tensor 60),
    # fp32 60, TF32 835, BF16/FP16 1,671, FP8 3,341 TFLOPS with sparsity; 94 GB HBM3 at 3.9 TB/s; NVLink bridge
    # 600 GB/s. Memory: nvidia-smi 95,830 MiB (public nvidia-smi output, 2026).
    DeviceSpec("h100-nvl", {"fp64": 60 * TFLOPS, "fp32": 60 * TFLOPS, "tf32": 417.5 * TFLOPS,
                            "fp16": 835.5 * TFLOPS, "bf16": 835.5 * TFLOPS, "fp8": 1670.5 * TFLOPS},
               3900 * GB, 95830 * MiB, description="NVIDIA H100 NVL 94 GB (Hopper, PCIe with NVLink bridge)",
               roofline=_HOPPER),
    # NVIDIA H800 SXM5 80GB: the H100 SXM's GH100 with NVLink cut to 400 GB/s (both directions) for export to China
    # (NVIDIA DGX H800 and HGX H800 specifications, 2023: "8x NVIDIA H800 GPUs, 640 GB total GPU memory", "NVLink:
    # 400 GB/s"; the H800 SXM5 datasheet: FP64 34 (tensor 67), FP32 67, TF32 989, BF16/FP16 1,979, FP8 3,958 TFLOPS
    # with sparsity, 80 GB HBM3 at 3.35 TB/s, as the H100 SXM's). Memory: no nvidia-smi report found; taken as the
    # H100 SXM's 81,559 MiB, the same board and HBM3 stacks (Note [memory as reported]).
    DeviceSpec("h800", {"fp64": 67 * TFLOPS, "fp32": 67 * TFLOPS, "tf32": 494.5 * TFLOPS,
                        "fp16": 989.5 * TFLOPS, "bf16": 989.5 * TFLOPS, "fp8": 1979 * TFLOPS},
               3350 * GB, 81559 * MiB, description="NVIDIA H800 SXM 80 GB (Hopper, NVLink 400 GB/s)",
               roofline=_HOPPER),
    # NVIDIA H200 product page / datasheet (2023/2024), SXM: same compute as H100 SXM (fp32 67,
    # TF32 989, BF16/FP16 1,979, FP8 3,958 TFLOPS with sparsity); 141 GB HBM3e at 4.8 TB/s.
    # Memory: nvidia-smi 143,771 MiB (public nvidia-smi outputs, 2025-2026).
    DeviceSpec("h200", {"fp64": 67 * TFLOPS, "fp32": 67 * TFLOPS, "tf32": 494.5 * TFLOPS,
                        "fp16": 989.5 * TFLOPS, "bf16": 989.5 * TFLOPS, "fp8": 1979 * TFLOPS},
               4800 * GB, 143771 * MiB, description="NVIDIA H200 SXM 141 GB (Hopper)", roofline=_HOPPER),
    # NVIDIA HGX B200 specifications (NVIDIA's HGX B200 / GB200 NVL72 table, 2024-2025), per GPU: FP64/FP64
    # tensor 37, FP32 75 TFLOPS; TF32 2.2, FP16/BF16 4.5, FP8 9 PFLOPS with sparsity (the catalog's dense: half,
    # 1.1, 2.25 and 4.5 PFLOPS; Note [dense peaks]); 180 GB HBM3e at 7.7 TB/s; NVLink 5 1.8 TB/s.
    # Memory: nvidia-smi 183,359 MiB (public nvidia-smi outputs, 2025-2026).
    DeviceSpec("b200", {"fp64": 37 * TFLOPS, "fp32": 75 * TFLOPS, "tf32": 1100 * TFLOPS,
                        "fp16": 2250 * TFLOPS, "bf16": 2250 * TFLOPS, "fp8": 4500 * TFLOPS},
               7700 * GB, 183359 * MiB, description="NVIDIA B200 180 GB (Blackwell, HGX)", roofline=_TENSOR_CORE),
    # NVIDIA GB200 NVL72 specifications (same page, 2025), per Blackwell GPU of the superchip (two per Grace
    # CPU): FP64/FP64 tensor 40, FP32 80 TFLOPS; TF32 2.5, FP16/BF16 5, FP8 10 PFLOPS with sparsity (dense: half,
    # Note [dense peaks]); 186 GB HBM3e at 8 TB/s; NVLink 5 1.8 TB/s. Memory: nvidia-smi 189,471 MiB (public
    # nvidia-smi outputs, 2025-2026).
    DeviceSpec("gb200", {"fp64": 40 * TFLOPS, "fp32": 80 * TFLOPS, "tf32": 1250 * TFLOPS,
                         "fp16": 2500 * TFLOPS, "bf16": 2500 * TFLOPS, "fp8": 5000 * TFLOPS},
               8000 * GB, 189471 * MiB, description="NVIDIA GB200, one Blackwell GPU of the superchip (NVL72)",
               roofline=_TENSOR_CORE),
    # NVIDIA L40S datasheet (2023): FP32 91.6; TF32 183 (366*), BF16/FP16 362.05 (733*), FP8 733 (1,466*)
    # TFLOPS, * with sparsity; no FP64 figure; 48 GB GDDR6 with ECC at 864 GB/s; PCIe Gen4 x16, no NVLink.
    # Memory: nvidia-smi 46,068 MiB, ECC on (modal PR 2797; public nvidia-smi outputs).
    DeviceSpec("l40s", {"fp32": 91.6 * TFLOPS, "tf32": 183 * TFLOPS, "fp16": 362.05 * TFLOPS,
                        "bf16": 362.05 * TFLOPS, "fp8": 733 * TFLOPS},
               864 * GB, 46068 * MiB, description="NVIDIA L40S 48 GB (Ada Lovelace, PCIe)", roofline=_TENSOR_CORE),
    # AMD Instinct MI300X datasheet (2023), dense: FP64 matrix 163.4 (vector 81.7), FP32 163.4, TF32 653.7,
    # FP16/BF16 1,307.4, FP8 2,614.9 TFLOPS; 192 GB HBM3 at 5.3 TB/s. Memory: rocm-smi 206,141,652,992 bytes
    # (196,592 MiB; ROCm issue 4750, 2025), torch.cuda's total_memory the same (ROCm issue 4203).
    DeviceSpec("mi300x", {"fp64": 163.4 * TFLOPS, "fp32": 163.4 * TFLOPS, "tf32": 653.7 * TFLOPS,
                          "fp16": 1307.4 * TFLOPS, "bf16": 1307.4 * TFLOPS, "fp8": 2614.9 * TFLOPS},
               5300 * GB, 196592 * MiB, description="AMD Instinct MI300X 192 GB (CDNA 3)", roofline=_CDNA3),
    # AMD Instinct MI325X datasheet (2024): the MI300X's compute (FP64 matrix 163.4, FP32 163.4, TF32 653.7,
    # FP16/BF16 1,307.4, FP8 2,614.9 TFLOPS dense); 256 GB HBM3E at 6 TB/s. Memory: no rocm-smi report found,
    # so 256 GB read as decimal bytes (Note [memory as reported]); by the MI300X's, it likely reports ~7% more.
    DeviceSpec("mi325x", {"fp64": 163.4 * TFLOPS, "fp32": 163.4 * TFLOPS, "tf32": 653.7 * TFLOPS,
                          "fp16": 1307.4 * TFLOPS, "bf16": 1307.4 * TFLOPS, "fp8": 2614.9 * TFLOPS},
               6000 * GB, 256 * GB, description="AMD Instinct MI325X 256 GB (CDNA 3)", roofline=_CDNA3),
    # A placeholder for a small x86 host, not a product: ~100 GFLOP/s fp32 (a few cores with AVX2 FMA:
    # 32 FLOP/cycle/core at ~3 GHz), one DDR4-3200 channel (JEDEC: 3200 MT/s x 8 bytes = 25.6 GB/s),
    # 16 GiB. Calibrate before trusting it.
    DeviceSpec("cpu", {"fp64": 50e9, "fp32": 100e9}, 25.6 * GB, 16 * GiB,
               description="generic CPU host (placeholder figures)"),
)

# Note [latencies]: datasheets give bandwidths, not copy latencies. The latencies below are order-of-
# magnitude assumptions for one small copy as software sees it (launch and synchronisation included),
# to be replaced by calibration; they matter only for small activations.
#
# Note [NVSwitch]: in an HGX/DGX board and an NVL72 rack every GPU's NVLinks go to NVSwitch chips, which
# switch all-to-all without blocking: any two GPUs of the NVLink domain copy at the GPU's full NVLink rate,
# so one link per NVLink generation serves every pair (nvlink2 to nvlink5). Without a switch a pair has only
# its own links: a bridged pair of PCIe cards (nvlink4-bridge), AMD's Infinity Fabric mesh (xgmi-mi300: one
# link per pair), DGX-1's cube mesh. A GPU copying to several peers at once shares its rate among them. On a full
# mesh a collective of the whole board runs one ring per link of a GPU at once (8 GPUs: 7 rings, each pair's link
# in each direction used by one ring), so it reaches the sum of the GPU's links (xgmi-mi300-board); a copy between
# two GPUs still has one link.
_LINK_LIST = (
    # PCI Express Base Specification (PCI-SIG): 3.0 runs 8 GT/s per lane with 128b/130b encoding,
    # 16 lanes -> 8e9 * 16 * 128/130 / 8 = 15.75 GB/s per direction; 4.0 doubles it (16 GT/s,
    # 31.5 GB/s), 5.0 doubles again (32 GT/s, 63 GB/s). Achieved copies reach ~80% of these.
    LinkSpec("pcie3-x16", 10e-6, 15.75 * GB, "PCIe 3.0 x16 (8 GT/s per lane)"),
    LinkSpec("pcie4-x16", 10e-6, 31.5 * GB, "PCIe 4.0 x16 (16 GT/s per lane)"),
    LinkSpec("pcie5-x16", 10e-6, 63.0 * GB, "PCIe 5.0 x16 (32 GT/s per lane)"),
    # Volta whitepaper: V100 has 6 NVLink 2.0 links of 25 GB/s per direction, 300 GB/s total (both
    # directions); per direction 150 GB/s when all links reach the peer (NVSwitch, DGX-2). In a DGX-1
    # hybrid cube-mesh a GPU pair shares only 1 or 2 links (25-50 GB/s): make a LinkSpec for that.
    LinkSpec("nvlink2", 5e-6, 150 * GB, "NVLink 2.0, V100 (6 links x 25 GB/s per direction)"),
    # A100 datasheet: NVLink 600 GB/s total (12 third-generation links) -> 300 GB/s per direction.
    LinkSpec("nvlink3", 5e-6, 300 * GB, "NVLink 3.0, A100 (12 links, 600 GB/s both directions)"),
    # H100 datasheet: NVLink 900 GB/s total (18 fourth-generation links) -> 450 GB/s per direction.
    LinkSpec("nvlink4", 5e-6, 450 * GB, "NVLink 4.0, H100/H200 (18 links, 900 GB/s both directions)"),
    # H800 (DGX/HGX H800 specifications, 2023): NVLink 400 GB/s total per GPU through NVSwitch (8 of the H100's 18
    # fourth-generation links) -> 200 GB/s per direction.
    LinkSpec("nvlink4-h800", 5e-6, 200 * GB, "NVLink 4.0, H800 (8 links, 400 GB/s both directions)"),
    # H100 datasheet (PCIe) and product page (NVL): an NVLink bridge joins two cards at 600 GB/s total
    # -> 300 GB/s per direction, between that pair only (Note [NVSwitch]).
    LinkSpec("nvlink4-bridge", 5e-6, 300 * GB,
             "NVLink 4.0 bridge, a pair of H100 PCIe/NVL (600 GB/s both directions)"),
    # HGX B200 / GB200 NVL72 specifications (2025): fifth-generation NVLink 1.8 TB/s total per GPU
    # (18 links x 100 GB/s) -> 900 GB/s per direction.
    LinkSpec("nvlink5", 5e-6, 900 * GB, "NVLink 5, B200/GB200 (18 links, 1.8 TB/s both directions)"),
    # AMD Instinct MI300X / MI325X datasheets (2023/2024): 7 Infinity Fabric links of 128 GB/s peak each (both
    # directions), one to each other GPU of an 8-GPU board (a mesh, no switch): a pair gets one link, 64 GB/s
    # per direction (896 GB/s is the sum over all 7 peers).
    LinkSpec("xgmi-mi300", 5e-6, 64 * GB,
             "AMD Infinity Fabric (xGMI), MI300X/MI325X: one link per GPU pair, 128 GB/s both directions"),
    # The same datasheets' 896 GB/s: all 7 links of a GPU on an 8-GPU board, 448 GB/s per direction, what a collective
    # of the whole board reaches (Note [NVSwitch]: 7 rings at once, each on its own links).
    LinkSpec("xgmi-mi300-board", 5e-6, 448 * GB,
             "AMD Infinity Fabric (xGMI), MI300X/MI325X 8-GPU board: collectives on all 7 links (896 GB/s both "
             "directions)"),
    # InfiniBand HDR (IBTA; NVIDIA ConnectX-6 product brief): 200 Gb/s per port = 25 GB/s.
    LinkSpec("infiniband-hdr", 5e-6, 200e9 / 8, "InfiniBand HDR, 200 Gb/s per port"),
    # InfiniBand NDR (IBTA; NVIDIA ConnectX-7 product brief, 2022): 400 Gb/s per port = 50 GB/s.
    LinkSpec("infiniband-ndr", 5e-6, 400e9 / 8, "InfiniBand NDR, 400 Gb/s per port"),
    # InfiniBand XDR (NVIDIA ConnectX-8 SuperNIC and Quantum-X800 announcements, 2024): 800 Gb/s per port
    # = 100 GB/s.
    LinkSpec("infiniband-xdr", 5e-6, 800e9 / 8, "InfiniBand XDR, 800 Gb/s per port"),
    # IEEE 802.3bs-2017 400 Gigabit Ethernet with RoCE v2 (RDMA; e.g. ConnectX-7, BlueField-3): 400 Gb/s
    # = 50 GB/s. Latency assumed as InfiniBand's (RDMA, no TCP stack; Note [latencies]).
    LinkSpec("roce-400g", 5e-6, 400e9 / 8, "400 Gigabit Ethernet, RoCE v2 (RDMA)"),
    # IEEE 802.3df-2024 800 Gigabit Ethernet with RoCE v2 (e.g. NVIDIA ConnectX-8 SuperNIC, Spectrum-X800; AMD
    # Pollara 400 is half): 800 Gb/s = 100 GB/s per port; latency as roce-400g's.
    LinkSpec("roce-800g", 5e-6, 800e9 / 8, "800 Gigabit Ethernet, RoCE v2 (RDMA)"),
    # IEEE 802.3 100 Gigabit Ethernet: 100 Gb/s = 12.5 GB/s; TCP adds tens of microseconds.
    LinkSpec("ethernet-100g", 30e-6, 100e9 / 8, "100 Gigabit Ethernet (TCP)"),
    # A copy inside one host's memory (CPU "devices"): a single-threaded memcpy reaches roughly
    # 10 GB/s on a DDR4 desktop (an assumption: read + write share the 25.6 GB/s of one channel).
    LinkSpec("cpu-memcpy", 1e-6, 10 * GB, "in-host memory copy (CPU devices)"),
)

#: Devices by name (read-only).
DEVICES: Mapping[str, DeviceSpec] = MappingProxyType({d.name: d for d in _DEVICE_LIST})
#: Links by name (read-only).
LINKS: Mapping[str, LinkSpec] = MappingProxyType({link.name: link for link in _LINK_LIST})


def load_device(path: str | Path) -> DeviceSpec:
    """A device saved as JSON (:meth:`DeviceSpec.to_dict`; ``gpipe-sim hardware --calibrate-cpu --out``).

    Raises:
        ValueError: the file is not a device description: not JSON, nested too deep, larger than a description
            (:data:`MAX_FILE_BYTES`), a field missing or out of range (Note [device bounds]); or it cannot be read.
            The message is one line naming the file.
        FileNotFoundError: there is no such file.
    """
    import json

    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)  # a FIFO or a device file ends here too
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: not a device description: larger than {MAX_FILE_BYTES:,} bytes (one is a few "
                         "kilobytes of JSON)")
    try:
        return DeviceSpec.from_dict(json.loads(raw))
    except RecursionError:
        raise ValueError(f"{path}: not a device description: JSON nested too deep") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        raise ValueError(f"{path}: not a device description: {lines[0]}") from None


def get_device(name: str) -> DeviceSpec:
    """The catalog device called ``name`` (case-insensitive), or a device saved in the JSON file ``name``.

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    if name.strip().endswith(".json"):
        return load_device(name.strip())
    return catalog_entry(DEVICES, name, "device")


def get_link(name: str) -> LinkSpec:
    """The catalog link called ``name`` (case-insensitive).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    return catalog_entry(LINKS, name, "link")


def catalog_entry(table: Mapping[str, T], name: str, what: str) -> T:
    """The entry of ``table`` called ``name`` (case-insensitive), a ``what`` of the catalog.

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    try:
        return table[name.strip().lower()]
    except KeyError:
        raise KeyError(f"unknown {what} {name!r}; known {what}s: {', '.join(table)}") from None
