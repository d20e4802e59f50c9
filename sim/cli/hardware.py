"""``gpipe-sim hardware``: list the catalog of devices and links, as tables or as JSON."""

from __future__ import annotations

import argparse
from typing import Any

from sim.files import json_text
from sim.planning.hardware import DEVICES, LINKS

__all__ = ["add_parser", "run"]

_DTYPES = ("fp32", "tf32", "fp16", "bf16")


def add_parser(subparsers: Any) -> None:
    """Register ``hardware`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser("hardware", help="list the hardware catalog (devices and links)",
                              description="List the catalog of devices and links the simulator prices with; "
                                          "every figure's public source is beside it in sim/planning/hardware.py.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the catalog; return the exit status."""
    if args.json:
        print(json_text({"devices": [d.to_dict() for d in DEVICES.values()],
                          "links": [link.to_dict() for link in LINKS.values()]}))
        return 0
    print("devices (peak TFLOP/s, dense; memory; memory bandwidth; assumed efficiency)")
    print(f"{'name':<16}" + "".join(f"{d:>8}" for d in _DTYPES)
          + f"{'memory':>10}{'bandwidth':>12}{'eff.':>6}  description")
    for dev in DEVICES.values():
        peaks = "".join(f"{dev.peak_flops[d] / 1e12:>8.4g}" if d in dev.peak_flops else f"{'-':>8}" for d in _DTYPES)
        print(f"{dev.name:<16}{peaks}{dev.memory_bytes / 2**30:>6.4g} GiB{dev.memory_bandwidth / 1e9:>7.4g} GB/s"
              f"{dev.efficiency:>6.2f}  {dev.description}")
    print()
    print("links (per direction; a copy of n bytes takes latency + n / bandwidth)")
    print(f"{'name':<16}{'latency':>10}{'bandwidth':>14}  description")
    for link in LINKS.values():
        print(f"{link.name:<16}{link.latency * 1e6:>7.3g} us{link.bandwidth / 1e9:>9.4g} GB/s  {link.description}")
    return 0
