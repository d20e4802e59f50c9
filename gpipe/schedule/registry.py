"""One registry of schedule generators, read by the executor, the simulator's planner and every ``--schedule``.

A generator is a pure function of the shape, ``(m, n, checkpoint=DEFAULT, placement=None) -> Schedule``
(``placement`` may be left out), written once and registered once under its name, with one line that says
what it does and one that says what it needs::

    from gpipe.schedule import Schedule, register

    @register("my-schedule", "what it does, in one line", constraints="what it needs, in one line")
    def my_schedule(m: int, n: int, checkpoint: Checkpoint = "never", placement=None) -> Schedule:
        ...
        return Schedule(m, n, checkpoint, placement, tasks, name="my-schedule")

Then ``GPipe(..., schedule="my-schedule")``, ``sim.planning.plan.plan(..., schedules=["my-schedule"])`` and
``gpipe-sim simulate --schedule my-schedule`` run it. :func:`unregister` takes a name back out (a test
registers a schedule for its own run only).

A schedule built to run several stages per device (interleaved 1F1B, V-shapes) registers its *layout* too:
where ``n`` stages go on ``p`` devices (e.g. :func:`looped`, stage ``s`` on device ``s mod p``), so
``GPipe(devices=[...p...])`` and ``--devices P`` place the stages as it wants them (:meth:`ScheduleKind.layout`).
One without a layout runs one stage per device unless given a placement.

Note [one registry]: a schedule arrives as a name (``GPipe``'s argument, a command-line flag, a row of a
plan), so the names live in one mapping, :data:`SCHEDULES`, that every reader looks up; nothing else keeps a
list of schedules. It is module state on purpose, changed only by :func:`register` and :func:`unregister`;
the built-in generators register when :mod:`gpipe.schedule` imports their modules, in that order.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar, cast

from gpipe.schedule.schedule import Schedule
from gpipe.schedule.task import CHECKPOINT_MODES, Checkpoint

__all__ = ["SCHEDULES", "Layout", "ScheduleKind", "looped", "register", "schedule_kind", "unregister"]

G = TypeVar("G", bound=Callable[..., Schedule])
Layout = Callable[[int, int], Sequence[int]]
"""Where ``n`` stages go on ``p`` devices: ``layout(n, p)[s]`` is stage ``s``'s device; raises ``ValueError``
(naming the fix) for a ``p`` the schedule cannot use."""


def looped(n: int, p: int) -> tuple[int, ...]:
    """Stage ``s`` on device ``s mod p`` (Megatron's interleaved placement; the identity when ``p == n``).

    Raises:
        ValueError: ``p`` is not between 1 and ``n``.
    """
    if not 1 <= p <= n:
        raise ValueError(f"{n} stages go on 1 to {n} devices, got {p}")
    return tuple(s % p for s in range(n))


_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")  # a word a command line takes, in a comma-separated list too
_registry: dict[str, ScheduleKind] = {}

SCHEDULES: Mapping[str, ScheduleKind] = MappingProxyType(_registry)
"""Every registered schedule by name, in registration order (a read-only view of the registry)."""


@dataclass(frozen=True)
class ScheduleKind:
    """A registered generator: its name, what it does and what it needs (one line each), its default policy.

    Attributes:
        name: the name ``GPipe(schedule=...)`` and ``--schedule`` take.
        generator: the function ``(m, n, checkpoint=..., placement=None) -> Schedule``.
        description: what the schedule does, in one line.
        constraints: what it needs or allows (shapes, placement, how the executor runs it), in one line.
        default_checkpoint: the generator's own default ``checkpoint``.
        place: where ``n`` stages go on ``p`` devices (:data:`Layout`); ``None``: one stage per device.
    """

    name: str
    generator: Callable[..., Schedule]
    description: str
    constraints: str
    default_checkpoint: Checkpoint
    place: Layout | None = None

    def layout(self, n: int, p: int) -> tuple[int, ...]:
        """The placement of ``n`` stages on ``p`` devices this schedule uses (each device gets a stage).

        Raises:
            ValueError: the schedule cannot place ``n`` stages on ``p`` devices (the message names the fix).
        """
        for what, value in (("stages", n), ("devices", p)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"need at least one of the {what}, got {value!r}")
        if self.place is None:
            if p != n:
                several = ", ".join(k for k, v in _registry.items() if v.place) or "none registered"
                raise ValueError(f"schedule {self.name!r} runs one stage per device: give as many devices as stages "
                                 f"({n}, not {p}), a placement, or a schedule that places several stages per "
                                 f"device ({several})")
            return tuple(range(n))
        placement = tuple(int(d) for d in self.place(n, p))
        if len(placement) != n or sorted(set(placement)) != list(range(p)):
            raise ValueError(f"schedule {self.name!r}: its layout put {n} stages on devices {placement}, "
                             f"not on each of {p} devices")
        return placement

    def __call__(self, m: int, n: int, checkpoint: Checkpoint | None = None,
                 placement: Sequence[int] | None = None, devices: int | None = None) -> Schedule:
        """The schedule of ``m`` micro-batches over ``n`` stages; ``checkpoint=None``: the generator's default.

        ``placement`` (stage to device) or ``devices`` (a count, placed by :meth:`layout`); neither: the
        generator's own placement. Giving both is a ``ValueError``.
        """
        if placement is not None and devices is not None:
            raise ValueError("give a placement or a number of devices, not both")
        if devices is not None:
            placement = self.layout(n, devices)
        args: dict[str, object] = {"checkpoint": self.default_checkpoint if checkpoint is None else checkpoint}
        if placement is not None:
            args["placement"] = placement
        return self.generator(m, n, **args)


def register(name: str, description: str, constraints: str = "any m >= 1 and n >= 1, any placement",
             layout: Layout | None = None) -> Callable[[G], G]:
    """Register the decorated generator under ``name``; the function itself is returned unchanged.

    ``layout`` says where ``n`` stages go on ``p`` devices, for a schedule built to run several stages per
    device (e.g. :func:`looped`); ``None``: one stage per device unless a placement is given.

    Raises:
        ValueError: ``name`` is taken or not a lower-case word (letters, digits, ``-``, ``_``, ``.``); a
            description or constraint that is not one line; a generator without parameters ``m``, ``n`` and
            ``checkpoint`` (with a default policy).
    """
    if not _NAME.match(name):
        raise ValueError(f"a schedule's name is a lower-case word (letters, digits, '-', '_', '.'), got {name!r}")
    if name in _registry:
        raise ValueError(f"a schedule named {name!r} is already registered ({_registry[name].generator.__qualname__})")
    for what, line in (("description", description), ("constraints", constraints)):
        if not line.strip() or "\n" in line:
            raise ValueError(f"the {what} of schedule {name!r} is one line, got {line!r}")

    def add(generator: G) -> G:
        _registry[name] = ScheduleKind(name, generator, description, constraints,
                                       _default_checkpoint(name, generator), layout)
        return generator

    return add


def unregister(name: str) -> ScheduleKind:
    """Take ``name`` out of the registry and return what it held.

    Raises:
        ValueError: no schedule of that name is registered (the message lists those that are).
    """
    kind = schedule_kind(name)
    del _registry[name]
    return kind


def schedule_kind(name: str) -> ScheduleKind:
    """The registered schedule called ``name``.

    Raises:
        ValueError: no schedule of that name is registered (the message lists those that are).
    """
    try:
        return _registry[name]
    except (KeyError, TypeError):
        known = ", ".join(_registry) or "none"
        raise ValueError(f"unknown schedule {name!r}; registered: {known}") from None


def _default_checkpoint(name: str, generator: Callable[..., Schedule]) -> Checkpoint:
    """The default of ``generator``'s ``checkpoint`` parameter, after checking it takes ``m``, ``n`` and that."""
    params = inspect.signature(generator).parameters
    missing = [p for p in ("m", "n", "checkpoint") if p not in params]
    default = params["checkpoint"].default if "checkpoint" in params else None
    if missing or default not in CHECKPOINT_MODES:
        problem = f"lacks {', '.join(missing)}" if missing else "has no default checkpoint" \
            if default is inspect.Parameter.empty else f"defaults checkpoint to {default!r}"
        raise ValueError(f"schedule {name!r}: a generator takes (m, n, checkpoint=POLICY, placement=None) with "
                         f"a default POLICY in {', '.join(CHECKPOINT_MODES)}; {generator.__qualname__} {problem}")
    return cast(Checkpoint, default)
