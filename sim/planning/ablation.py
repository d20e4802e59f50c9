"""The torchgpipe paper's U-Net ablation (Kim et al., 2020), reproduced in simulation.

The paper trains a U-Net on 4 GPUs with chunks 8 and adds its design components one at a time; the
published throughput and GPU utilisation are::

    step            what is added                                 samples/s   utilisation
    baseline        neither fork/join nor copy streams              30.7          44%
    + dependency    fork/join: backward order enforced              41.3          59%
    + streams       copies on copy streams                          55.2          71%
    + portals       skip tensors sent straight to their consumer    58.5          75%

Here each step is one :class:`sim.core.engine.SimConfig` and one cost model of a U-Net-like pipeline
(:data:`UNET`). Without portals a skip tensor is threaded through every partition between the one that
stashes it and the one that pops it, so it is modelled as what it costs on the wire: its bytes added to
the activation sent across every boundary it crosses. With portals it is one copy on a copy stream,
straight from source to destination, concurrent with compute; the simulator has no separate skip copy,
so that copy is left out (as if fully hidden behind compute), a slight overestimate of the last step.
The costs are assumptions, not the paper's measurements (Note [what is assumed]); :func:`run` runs every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpipe.schedule import Checkpoint, gpipe
from gpipe.timeline import Timeline
from sim.core.cost import CostModel, StageCost
from sim.core.link import LinkSpec
from sim.planning.hardware import get_link

__all__ = ["PUBLISHED", "STEPS", "UNET", "AblationRow", "AblationStep", "UNetSetup", "run", "simulate_step"]

MiB = 2**20


@dataclass(frozen=True)
class AblationStep:
    """One row of the ablation: which mechanisms are on."""

    name: str
    enforce_backward_order: bool  # fork/join
    copy_streams: bool
    portals: bool


#: The paper's four configurations, in order; each adds one mechanism to the one before.
STEPS: tuple[AblationStep, ...] = (
    AblationStep("baseline", enforce_backward_order=False, copy_streams=False, portals=False),
    AblationStep("+ dependency", enforce_backward_order=True, copy_streams=False, portals=False),
    AblationStep("+ streams", enforce_backward_order=True, copy_streams=True, portals=False),
    AblationStep("+ portals", enforce_backward_order=True, copy_streams=True, portals=True),
)

#: Published U-Net figures (Kim et al., 2020, 4 GPUs, chunks 8): step -> (samples/s, GPU utilisation).
PUBLISHED: dict[str, tuple[float, float]] = {
    "baseline": (30.7, 0.44),
    "+ dependency": (41.3, 0.59),
    "+ streams": (55.2, 0.71),
    "+ portals": (58.5, 0.75),
}


@dataclass(frozen=True)
class UNetSetup:
    """A U-Net-like pipeline on ``devices`` devices (see Note [what is assumed]).

    Attributes:
        devices: stages, one per device.
        chunks: micro-batches per mini-batch.
        batch: samples per mini-batch (throughput is ``batch / makespan``).
        forward: seconds of each stage's forward of one micro-batch.
        backward: seconds of each stage's backward of one micro-batch.
        activation_bytes: bytes of the activation stage ``j`` sends to stage ``j + 1`` (one per boundary).
        skip_bytes: bytes of the skip tensors that cross boundary ``j`` (between stage ``j`` and ``j + 1``)
            on their way from the stage that stashes them to the stage that pops them.
        saved_bytes: bytes each stage keeps per micro-batch for backward without checkpointing.
        checkpoint: the checkpoint policy (torchgpipe's default).
        link: the link between neighbouring devices.
    """

    devices: int = 4
    chunks: int = 8
    batch: int = 40
    forward: tuple[float, ...] = (16e-3, 17e-3, 17e-3, 16e-3)
    backward: tuple[float, ...] = (32e-3, 34e-3, 34e-3, 32e-3)
    activation_bytes: tuple[int, ...] = (32 * MiB, 4 * MiB, 32 * MiB)
    skip_bytes: tuple[int, ...] = (96 * MiB, 124 * MiB, 96 * MiB)
    saved_bytes: tuple[int, ...] = (512 * MiB, 256 * MiB, 256 * MiB, 512 * MiB)
    checkpoint: Checkpoint = "except_last"
    link: LinkSpec = field(default_factory=lambda: get_link("pcie3-x16"))

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "saved_bytes"):
            if len(getattr(self, name)) != self.devices:
                raise ValueError(f"{name} needs one entry per stage ({self.devices}), got {getattr(self, name)}")
        for name in ("activation_bytes", "skip_bytes"):
            if len(getattr(self, name)) != self.devices - 1:
                raise ValueError(f"{name} needs one entry per boundary ({self.devices - 1}), got {getattr(self, name)}")

    def cost(self, portals: bool) -> CostModel:
        """The cost model: with ``portals`` the boundaries carry the activations only; without, the skip
        tensors too. Copies are priced by :attr:`link` (``latency + bytes / bandwidth``)."""
        stages = []
        for j in range(self.devices):
            send = 0
            if j < self.devices - 1:
                send = self.activation_bytes[j] + (0 if portals else self.skip_bytes[j])
            stages.append(StageCost(
                forward=self.forward[j], backward=self.backward[j], send_bytes=send,
                saved_bytes=self.saved_bytes[j], checkpoint_bytes=self.activation_bytes[max(j - 1, 0)],
            ))
        return CostModel(tuple(stages), copy_seconds=None)

    def rechunked(self, chunks: int) -> UNetSetup:
        """The same mini-batch cut into ``chunks`` micro-batches: per-micro-batch times and bytes scale by
        ``self.chunks / chunks`` (an idealisation: real kernels get less efficient as micro-batches shrink)."""
        if chunks < 1:
            raise ValueError(f"need at least one chunk, got {chunks}")
        f = self.chunks / chunks
        return replace(
            self, chunks=chunks,
            forward=tuple(t * f for t in self.forward), backward=tuple(t * f for t in self.backward),
            activation_bytes=tuple(round(b * f) for b in self.activation_bytes),
            skip_bytes=tuple(round(b * f) for b in self.skip_bytes),
            saved_bytes=tuple(round(b * f) for b in self.saved_bytes),
        )

    def describe(self) -> str:
        """The setup as a markdown table, for the docs."""
        rows = ["| stage | forward | backward | sends (portals) | sends (no portals) |",
                "| ---: | ---: | ---: | ---: | ---: |"]
        for j in range(self.devices):
            a = self.activation_bytes[j] if j < self.devices - 1 else 0
            s = self.skip_bytes[j] if j < self.devices - 1 else 0
            rows.append(f"| {j} | {self.forward[j] * 1e3:.0f} ms | {self.backward[j] * 1e3:.0f} ms | "
                        f"{a / MiB:.0f} MiB | {(a + s) / MiB:.0f} MiB |")
        rows.append("")
        rows.append(f"Per micro-batch; {self.chunks} micro-batches of {self.batch // self.chunks} samples "
                    f"(mini-batch {self.batch}), checkpoint `{self.checkpoint}`, link `{self.link.name}` "
                    f"({self.link.description}: {self.link.latency * 1e6:.0f} µs + bytes / "
                    f"{self.link.bandwidth / 1e9:.2f} GB/s).")
        return "\n".join(rows)


# Note [what is assumed]: the stage times and tensor sizes of :data:`UNET` are assumptions shaped like a
# U-Net cut into four balanced partitions (large high-resolution skips from the first stages to the last,
# small activations at the bottleneck), set once and not tuned; then the mini-batch size alone (which turns
# step time into samples per second) was chosen so that the full configuration's throughput is the
# paper's. They are not measurements of the paper's model. What the ablation shows is how
# much each mechanism is worth *given* those costs; compare the ordering and the relative steps with the
# paper, not the digits.
#: The setup the docs, the tutorial and the tests use.
UNET = UNetSetup()


@dataclass(frozen=True)
class AblationRow:
    """One simulated configuration beside the paper's figures.

    Attributes:
        step: the :class:`AblationStep` name.
        makespan: simulated seconds per mini-batch.
        throughput: simulated samples per second (``batch / makespan``).
        utilisation: simulated mean over devices of the compute stream's busy fraction.
        published_throughput: samples/s in the paper.
        published_utilisation: GPU utilisation in the paper (a fraction).
    """

    step: str
    makespan: float
    throughput: float
    utilisation: float
    published_throughput: float
    published_utilisation: float


def simulate_step(step: AblationStep, setup: UNetSetup = UNET) -> Timeline:
    """Simulate one configuration of the ablation and return its timeline."""
    from sim.core.config import SimConfig
    from sim.core.engine import simulate

    config = SimConfig(link=setup.link, copy_streams=step.copy_streams,
                       enforce_backward_order=step.enforce_backward_order)
    return simulate(gpipe(setup.chunks, setup.devices, setup.checkpoint), setup.cost(step.portals), config=config)


def run(setup: UNetSetup = UNET, steps: tuple[AblationStep, ...] = STEPS) -> list[AblationRow]:
    """Simulate every step and set each beside the published figures.

    Returns:
        One :class:`AblationRow` per step, in order.
    """
    rows = []
    for step in steps:
        tl = simulate_step(step, setup)
        pub = PUBLISHED.get(step.name, (float("nan"), float("nan")))
        rows.append(AblationRow(step.name, tl.makespan, setup.batch / tl.makespan, 1.0 - tl.bubble_fraction(),
                                pub[0], pub[1]))
    return rows
