"""``gpipe-sim hardware``: list the catalog of devices, links and systems, as tables or as JSON; or measure this CPU's
roofline (``--calibrate-cpu``) and save it for the planner (``--out cpu.json``, then ``--hardware cpu.json``)."""

from __future__ import annotations

import argparse
from typing import Any

from sim.cli import CommandError
from sim.files import OutputFile, json_text
from sim.planning.hardware.catalog import DEVICES, LINKS
from sim.planning.hardware.systems import SYSTEMS

__all__ = ["add_parser", "run"]

_DTYPES = ("fp32", "tf32", "fp16", "bf16")


def add_parser(subparsers: Any) -> None:
    """Register ``hardware`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser("hardware", help="list the hardware catalog (devices, links, systems)",
                              description="List the catalog of devices, links and systems the simulator prices with; "
                                          "every figure's public source is beside it in "
                                          "sim/planning/hardware/catalog.py and sim/planning/hardware/systems.py.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    p.add_argument("--calibrate-cpu", action="store_true",
                   help="time GEMMs, convolutions and memory-bound kernels on this CPU (one thread, as each executor "
                        "worker runs) and fit its roofline")
    p.add_argument("--threads", type=int, default=1, help="threads for --calibrate-cpu (default 1)")
    p.add_argument("--out", metavar="PATH", help="with --calibrate-cpu: save the device as JSON, for "
                                                 "gpipe-sim plan --hardware PATH; checked before calibrating, and an "
                                                 "existing file is refused unless --force")
    p.add_argument("--force", action="store_true", help="with --out: replace an existing file")
    p.set_defaults(func=run)


def _calibrate(args: argparse.Namespace) -> int:
    from sim.planning.costs.calibrate_device import calibrate_cpu, check_threads

    check_threads(args.threads, "--threads")  # before the file is checked and anything is timed
    out = OutputFile(args.out, force=args.force, example="cpu.json") if args.out is not None else None  # before
    result = calibrate_cpu(threads=args.threads)
    dev = result.device
    if args.json:
        print(json_text(dev.to_dict()))
    else:
        roof = dev.roofline
        assert roof is not None
        print(f"{dev.name}: matmul peak {dev.peak_flops['fp32'] / 1e9:.1f} GFLOP/s, half_dim {roof.half_dim:g}, "
              f"convolution fraction {roof.convolution['fp32']:.2f} (backward "
              f"{roof.convolution_backward['fp32']:.2f}, half_dim {roof.half_dims()[2]:g}), memory-bound kernels "
              f"{dev.memory_bandwidth * roof.memory / 1e9:.1f} GB/s (a large copy {dev.memory_bandwidth / 1e9:.1f}), "
              f"{roof.kernel_seconds * 1e6:.2f} us per kernel; a split backward adds "
              f"{roof.split_input_seconds * 1e6:.2f} us to B and {roof.split_weight_seconds * 1e6:.2f} us to W per "
              f"parameter tensor")
        print(f"{'kernel':<20} {'shape':<22} {'measured':>10} {'roofline':>10} {'error':>7}")
        for m in result.measurements:
            print(f"{m.kind:<20} {str(m.shape):<22} {m.seconds * 1e3:>7.3f} ms {m.predicted * 1e3:>7.3f} ms "
                  f"{100 * (m.predicted / m.seconds - 1):>+6.1f}%")
    if out is not None:
        out.write_text(json_text(dev.to_dict()))
        if not args.json:
            print(f"wrote {args.out} (use it as gpipe-sim plan --hardware {args.out})")
    return 0


def run(args: argparse.Namespace) -> int:
    """Print the catalog, or calibrate this CPU; return the exit status."""
    if args.calibrate_cpu:
        return _calibrate(args)
    if args.out is not None or args.force:
        raise CommandError("--out saves a calibration; add --calibrate-cpu")
    if args.json:
        print(json_text({"devices": [d.to_dict() for d in DEVICES.values()],
                          "links": [link.to_dict() for link in LINKS.values()],
                          "systems": [system.to_dict() for system in SYSTEMS.values()]}))
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
    print()
    print("systems (gpipe-sim plan --system NAME: a node is one NVLink domain, its ports the network between them)")
    print(f"{'name':<16}{'device':<11}{'GPUs':>5}  {'link':<18}{'network':<16}{'ports':>5}  source")
    for sy in SYSTEMS.values():
        print(f"{sy.name:<16}{sy.device:<11}{sy.gpus_per_node:>5}  {sy.link:<18}{sy.network:<16}{sy.network_ports:>5}  "
              f"{sy.source}")
    return 0
