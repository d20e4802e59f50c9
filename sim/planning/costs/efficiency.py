"""What fraction of a device's peak one kernel reaches: a fixed cost per kernel on top of the roofline's rate, so
small kernels (small micro-batches) run below it (Note [small micro-batches]); :mod:`sim.planning.costs.from_flops`
prices every kernel so.
"""

from __future__ import annotations

from sim.planning.hardware.catalog import DeviceSpec

__all__ = ["KERNEL_SECONDS", "effective_efficiency"]

# Note [small micro-batches]: the fixed cost per kernel is what makes the efficiency fall for small micro-batches.
# For a compute-bound operator of ``f`` FLOPs the fraction of peak reached is ``efficiency(f) = efficiency * f /
# (f + f_half)``, ``f_half = kernel_seconds * peak * efficiency``: a saturating curve, half of the asymptote at
# ``f_half`` FLOPs, all of it for large kernels. ``f`` grows with the micro-batch, so a pipeline with many small
# micro-batches loses throughput, as on real GPUs. The rationale is the latency-bandwidth ("alpha-beta", Hockney
# 1994) model applied to kernels: a launch costs a few microseconds (NVIDIA's CUDA C++ Best Practices Guide puts
# kernel launch overhead in the microseconds), and a kernel too small to fill every SM still pays its ramp-up and
# tail. The default, 5 microseconds, is that order of magnitude, chosen a priori and not fitted.
#: Default fixed cost of one kernel, seconds (Note [small micro-batches]).
KERNEL_SECONDS = 5e-6


def effective_efficiency(device: DeviceSpec, flops: float, dtype: str = "fp32",
                         kernel_seconds: float = KERNEL_SECONDS) -> float:
    """The fraction of peak one compute-bound kernel of ``flops`` FLOPs reaches (Note [small micro-batches])."""
    rate = device.achievable_flops(dtype)
    return device.efficiency * flops / (flops + kernel_seconds * rate) if flops > 0 else 0.0
