"""A link between two devices, as the simulator prices a copy: ``latency + bytes / bandwidth`` seconds.

Units are bytes, bytes/s (per direction: links are full duplex) and seconds. The catalog of real links
with their sources is planning's (:mod:`sim.planning.hardware.catalog`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["LinkSpec"]


@dataclass(frozen=True)
class LinkSpec:
    """A connection between two devices: a copy of ``n`` bytes takes ``latency + n / bandwidth`` seconds.

    Attributes:
        name: catalog key, e.g. ``"pcie4-x16"``.
        latency: seconds before the first byte arrives (see Note [latencies]).
        bandwidth: bytes/s, per direction.
        description: what it is, for display.
    """

    name: str
    latency: float
    bandwidth: float
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a link needs a name")
        lat = self.latency
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or math.isnan(lat) or math.isinf(lat) or lat < 0:
            raise ValueError(f"link {self.name!r} latency must be a finite number of seconds >= 0, got {lat!r}")
        bw = self.bandwidth
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or math.isnan(bw) or math.isinf(bw) or bw <= 0:
            raise ValueError(f"link {self.name!r} bandwidth (bytes/s) must be a finite number > 0, got {bw!r}")

    def transfer_seconds(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` over this link: ``latency + nbytes / bandwidth``.

        Raises:
            ValueError: ``nbytes`` is negative or not a number.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or math.isnan(nbytes) or nbytes < 0:
            raise ValueError(f"copy size must be a number of bytes >= 0, got {nbytes!r}")
        return self.latency + nbytes / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "latency": self.latency,
                "bandwidth": self.bandwidth}
