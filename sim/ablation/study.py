"""The torchgpipe paper's U-Net ablation (Kim et al., 2020) in simulation: the steps, the costs, the run.

torchgpipe trains U-Net (5, 64) on 4 Tesla P40s (balance [34, 76, 70, 61], chunks 8, mini-batch 128;
``benchmarks/unet-timeline``) and adds its design components one at a time; the published throughput and
GPU utilisation are::

    step            what is added                                 samples/s   utilisation
    baseline        neither fork/join nor copy streams              30.662        44%
    + dependency    fork/join: backward order enforced              41.306        59%
    + streams       copies on copy streams                          55.191        71%
    + portals       skip tensors sent straight to their consumer    58.477        75%

Each step is one :class:`sim.core.config.SimConfig` and one cost model, a :class:`UNetSetup`: explicit per-stage
seconds and bytes, which :func:`sim.ablation.counted.counted_unet` fills from the counted model. Without
portals a skip tensor rides in the activation tuple across every boundary between the stage that stashes it and
the one that pops it, so its bytes join every copy it crosses. With portals it is one copy of its own, on the
copy streams between its two devices (Note [portal copies]): a skip to the next stage joins that boundary's
copy, a longer one is left out and :func:`portal_slack` checks that the timeline leaves room for it.
:func:`run` simulates every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpipe.schedule import Checkpoint, Op, gpipe
from gpipe.schedule.timeline import COMPUTE, Timeline
from sim.core.cost import CostModel, StageCost
from sim.core.link import LinkSpec
from sim.planning.hardware.catalog import get_link

__all__ = ["PUBLISHED", "STEPS", "AblationRow", "AblationStep", "Skip", "UNetSetup", "portal_slack", "run",
           "simulate_step"]

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

#: Published figures (torchgpipe ``benchmarks/unet-timeline/README.md``; Kim et al., 2020): step -> (samples/s,
#: GPU utilisation as ``nvidia-smi`` sampled it, averaged over the four GPUs).
PUBLISHED: dict[str, tuple[float, float]] = {
    "baseline": (30.662, 0.44),
    "+ dependency": (41.306, 0.59),
    "+ streams": (55.191, 0.71),
    "+ portals": (58.477, 0.75),
}


@dataclass(frozen=True)
class Skip:
    """A skip tensor of one micro-batch: stashed on stage ``source``, popped on stage ``destination``."""

    source: int
    destination: int
    bytes: int

    def __post_init__(self) -> None:
        if not 0 <= self.source < self.destination:
            raise ValueError(f"a skip that crosses stages goes from a stage to a later one, got {self.source} -> "
                             f"{self.destination}; a skip within one stage never leaves its device: leave it out")
        if self.bytes < 0:
            raise ValueError(f"a skip's bytes must be >= 0, got {self.bytes}")


@dataclass(frozen=True)
class UNetSetup:
    """The costs of a pipeline with skip connections, per micro-batch, as explicit numbers.

    :func:`sim.ablation.counted.counted_unet` fills one from the counted U-Net; change a field with
    ``dataclasses.replace`` to ask what that assumption is worth.

    Attributes:
        chunks: micro-batches per mini-batch.
        batch: samples per mini-batch (throughput is ``batch / step seconds``).
        forward: seconds of each stage's forward of one micro-batch (the recompute takes as long).
        backward: seconds of each stage's backward of one micro-batch.
        activation_bytes: bytes of the activation stage ``j`` sends to stage ``j + 1``, skips not included
            (one entry per boundary).
        skips: the skip tensors that cross a boundary (:class:`Skip`).
        update_seconds: seconds of each stage's optimizer step, after the pipeline (Note [step seconds]).
        saved_bytes: bytes each stage keeps per micro-batch for backward without checkpointing.
        checkpoint_bytes: bytes each stage keeps per checkpointed micro-batch (its input, skips included).
        checkpoint: the checkpoint policy (torchgpipe's default).
        link: the link between any two devices.
    """

    chunks: int
    batch: int
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    activation_bytes: tuple[int, ...]
    skips: tuple[Skip, ...] = ()
    update_seconds: tuple[float, ...] | None = None
    saved_bytes: tuple[int, ...] | None = None
    checkpoint_bytes: tuple[int, ...] | None = None
    checkpoint: Checkpoint = "except_last"
    link: LinkSpec = field(default_factory=lambda: get_link("pcie3-x16"))

    def __post_init__(self) -> None:
        n = len(self.forward)
        for name in ("backward", "update_seconds", "saved_bytes", "checkpoint_bytes"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} needs one entry per stage ({n}, as forward), got {value}")
        if len(self.activation_bytes) != n - 1:
            raise ValueError(f"activation_bytes needs one entry per boundary ({n - 1}), got {self.activation_bytes}")
        for s in self.skips:
            if s.destination >= n:
                raise ValueError(f"skip {s} ends on stage {s.destination}, but there are {n} stages (0 to {n - 1})")
        if self.chunks < 1 or self.batch < self.chunks:
            raise ValueError(f"need 1 <= chunks <= batch, got chunks={self.chunks}, batch={self.batch}")

    @property
    def devices(self) -> int:
        """Stages, one per device."""
        return len(self.forward)

    @property
    def next_stage_skip_bytes(self) -> tuple[int, ...]:
        """Bytes of the skips that go from stage ``j`` to stage ``j + 1`` exactly: with portals they travel on
        the activation's copy streams, as one more copy (Note [portal copies])."""
        return tuple(sum(s.bytes for s in self.skips if s.source == j and s.destination == j + 1)
                     for j in range(self.devices - 1))

    @property
    def skip_bytes(self) -> tuple[int, ...]:
        """Bytes of the skips that cross each boundary ``j`` (between stage ``j`` and ``j + 1``) without portals."""
        return tuple(sum(s.bytes for s in self.skips if s.source <= j < s.destination)
                     for j in range(self.devices - 1))

    def cost(self, portals: bool) -> CostModel:
        """The cost model: without ``portals`` every boundary carries the skips that cross it; with portals only
        the skips that end on the next stage (Note [portal copies]). Copies are priced by :attr:`link`."""
        n, skip = self.devices, self.next_stage_skip_bytes if portals else self.skip_bytes
        stages = []
        for j in range(n):
            send = 0 if j == n - 1 else self.activation_bytes[j] + skip[j]
            stages.append(StageCost(
                forward=self.forward[j], backward=self.backward[j], send_bytes=send,
                saved_bytes=0 if self.saved_bytes is None else self.saved_bytes[j],
                checkpoint_bytes=0 if self.checkpoint_bytes is None else self.checkpoint_bytes[j],
            ))
        return CostModel(tuple(stages), copy_seconds=None)

    def scaled_compute(self, factor: float) -> UNetSetup:
        """Every compute second (forward, backward, optimizer step) times ``factor``; bytes unchanged."""
        if not factor > 0:
            raise ValueError(f"the factor must be > 0, got {factor!r}")
        return replace(self, forward=tuple(t * factor for t in self.forward),
                       backward=tuple(t * factor for t in self.backward),
                       update_seconds=None if self.update_seconds is None
                       else tuple(t * factor for t in self.update_seconds))

    def describe(self) -> str:
        """The setup as a markdown table, for the docs."""
        rows = ["| stage | forward | backward | activation sent | skips sent (no portals) | optimizer step |",
                "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        update = self.update_seconds or (0.0,) * self.devices
        for j in range(self.devices):
            a = self.activation_bytes[j] if j < self.devices - 1 else 0
            s = self.skip_bytes[j] if j < self.devices - 1 else 0
            rows.append(f"| {j} | {self.forward[j] * 1e3:.1f} ms | {self.backward[j] * 1e3:.1f} ms | "
                        f"{a / MiB:.1f} MiB | {s / MiB:.1f} MiB | {update[j] * 1e3:.2f} ms |")
        rows.append("")
        rows.append(f"Per micro-batch; {self.chunks} micro-batches of {self.batch // self.chunks} samples "
                    f"(mini-batch {self.batch}), checkpoint `{self.checkpoint}`, link `{self.link.name}` "
                    f"({self.link.description}: {self.link.latency * 1e6:.0f} µs + bytes / "
                    f"{self.link.bandwidth / 1e9:.2f} GB/s).")
        return "\n".join(rows)


@dataclass(frozen=True)
class AblationRow:
    """One simulated configuration beside the paper's figures.

    Attributes:
        step: the :class:`AblationStep` name.
        makespan: simulated seconds of one mini-batch's pipeline.
        step_seconds: ``makespan`` plus the slowest stage's optimizer step (Note [step seconds]).
        throughput: simulated samples per second (``batch / step_seconds``).
        utilisation: simulated mean over devices of the busy fraction of the step (compute and optimizer step).
        published_throughput: samples/s in the paper.
        published_utilisation: GPU utilisation in the paper (a fraction).
    """

    step: str
    makespan: float
    step_seconds: float
    throughput: float
    utilisation: float
    published_throughput: float
    published_utilisation: float

    @property
    def throughput_error(self) -> float:
        """``simulated / published - 1``."""
        return self.throughput / self.published_throughput - 1

    @property
    def utilisation_error(self) -> float:
        """``simulated / published - 1``."""
        return self.utilisation / self.published_utilisation - 1


def simulate_step(step: AblationStep, setup: UNetSetup) -> Timeline:
    """Simulate one configuration of the ablation and return its timeline."""
    from sim.core.config import SimConfig
    from sim.core.engine import simulate

    config = SimConfig(link=setup.link, copy_streams=step.copy_streams,
                       enforce_backward_order=step.enforce_backward_order)
    return simulate(gpipe(setup.chunks, setup.devices, setup.checkpoint), setup.cost(step.portals), config=config)


# Note [step seconds]: torchgpipe's benchmark times whole training steps, so a step is the pipeline and then the
# optimizer step, which every device runs on its own parameters at once: the slowest stage's update is added to
# the makespan (as benchmarks/published.py does). Its kernels count as busy time in the utilisation, as they do
# for nvidia-smi; the loss and the host's gaps between steps are not modelled.
def run(setup: UNetSetup, steps: tuple[AblationStep, ...] = STEPS) -> list[AblationRow]:
    """Simulate every step and set each beside the published figures.

    Returns:
        One :class:`AblationRow` per step, in order.
    """
    update = setup.update_seconds or (0.0,) * setup.devices
    rows = []
    for step in steps:
        tl = simulate_step(step, setup)
        seconds = tl.makespan + max(update)
        busy = sum(tl.busy(d) + update[d] for d in range(setup.devices)) / setup.devices
        pub = PUBLISHED.get(step.name, (float("nan"), float("nan")))
        rows.append(AblationRow(step.name, tl.makespan, seconds, setup.batch / seconds, busy / seconds,
                                pub[0], pub[1]))
    return rows


# Note [portal copies]: with portals torchgpipe copies each skip tensor once, from the stashing device's copy
# stream to the popping device's, after the stashing forward; the popping stage's forward waits for that copy
# stream before it starts, and the gradient comes straight back the same way. A skip to the next stage thus
# rides the activation's copy streams, one copy more on the same link: the cost model adds its bytes to that
# boundary. A longer skip is a copy of its own, which the simulator has not; each ordered pair of devices has a
# link of its own there, so leaving it out is exact when every such copy, FIFO on its pair's link, ends before
# the task that waits for it starts: what :func:`portal_slack` measures. A negative slack: the step is optimistic.
def portal_slack(timeline: Timeline, setup: UNetSetup) -> float:
    """The least time, over every micro-batch and every skip longer than one stage, between its portal copy's
    end and the task that waits for it (Note [portal copies]); ``inf`` without such skips.

    Raises:
        ValueError: the timeline does not hold a forward and a backward of every stage the skips join.
    """
    spans = {(s.task.op, s.task.microbatch, s.task.stage): s for s in timeline.spans if s.stream == COMPUTE}
    pairs: dict[tuple[int, int], int] = {}
    for s in setup.skips:
        if s.destination == s.source + 1:
            continue  # in the cost model already
        pairs[s.source, s.destination] = pairs.get((s.source, s.destination), 0) + s.bytes
    slack = float("inf")
    for (a, b), nbytes in sorted(pairs.items()):
        seconds = setup.link.transfer_seconds(nbytes)
        for op, src, dst in ((Op.F, a, b), (Op.B, b, a)):
            try:
                copies = sorted((spans[op, i, src].end, spans[op, i, dst].start) for i in range(setup.chunks))
            except KeyError:
                raise ValueError(f"the timeline lacks a {op.value} task of stage {src} or {dst}: simulate the "
                                 f"setup with simulate_step first") from None
            free = 0.0  # the pair's link, FIFO in the order the copies are issued
            for ready, needed in copies:
                free = max(free, ready) + seconds
                slack = min(slack, needed - free)
    return slack
