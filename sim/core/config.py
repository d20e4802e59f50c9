"""The simulator's switches: which executor behaviours a simulation models (:class:`SimConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.link import LinkSpec

__all__ = ["DEFAULT_CONFIG", "SimConfig"]


@dataclass(frozen=True)
class SimConfig:
    """Switches of the simulation (the defaults model torchgpipe on GPUs with copy streams).

    The docs page *The simulator's model of a device* describes each.

    Attributes:
        link: prices copies when the cost model has no fixed ``copy_seconds``; ``None``: copies free.
        copy_streams: copies overlap compute (torchgpipe's copy streams); ``False``: they borrow the
            compute streams of both devices.
        enforce_backward_order: fork/join dependencies hold; ``False``: each gradient copy waits for the
            device's next backward (the worst case of the missing dependency).
        lockstep_forward: the host waits for each forward clock cycle (torchgpipe's host loop).
        backward_after_forward: the backward phase starts after every forward (GPipe's ``forward()``
            then ``loss.backward()``).
        asynchronous: the devices whose worker queues work on a stream and runs ahead of it (CUDA
            devices): their host and their stream keep two clocks.
        shared_streams: one id per device, the compute stream it issues to: devices with the same id
            (partitions on one GPU) run their tasks one at a time; ``None``: a stream each.
        stage_links: the link after each stage, which its activations cross to the next stage and the next stage's
            gradients cross back (a pipeline that spans nodes: the network between them); ``None``: ``link`` for
            every copy.
        overlap_pairs: a schedule's overlapped pairs (DualPipeV's forward beside a backward) run together,
            sharing their device (:mod:`sim.core.overlap`); ``False``: each pair's two tasks run in turn, in
            list order, as this executor's workers run them (Note [a pair in turn] in :mod:`gpipe.interpreter.worker`).
    """

    link: LinkSpec | None = None
    copy_streams: bool = True
    enforce_backward_order: bool = True
    lockstep_forward: bool = False
    backward_after_forward: bool = False
    asynchronous: frozenset[int] = frozenset()
    shared_streams: tuple[int, ...] | None = None
    overlap_pairs: bool = True
    stage_links: tuple[LinkSpec, ...] | None = None

    def __post_init__(self) -> None:
        if self.link is not None and not isinstance(self.link, LinkSpec):
            raise TypeError(f"SimConfig.link must be a LinkSpec or None, got {type(self.link).__name__}")
        if self.stage_links is not None:
            object.__setattr__(self, "stage_links", tuple(self.stage_links))
            if any(not isinstance(x, LinkSpec) for x in self.stage_links):
                raise TypeError("SimConfig.stage_links must hold a LinkSpec per stage")
        object.__setattr__(self, "asynchronous", frozenset(self.asynchronous))
        if any(not isinstance(d, int) or d < 0 for d in self.asynchronous):
            raise ValueError(f"SimConfig.asynchronous holds device indices, got {sorted(self.asynchronous)}")


DEFAULT_CONFIG = SimConfig()
