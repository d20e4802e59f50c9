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
One without a layout runs one stage per device unless given a placement. A schedule whose ``n`` stages are several
copies of the model's (DualPipe's two directions, Note [stage slots] in :mod:`gpipe.schedule.schedule`) registers
its ``copies`` too, so ``GPipe`` makes ``copies x len(balance)`` slots of a balance of the model's stages.

A schedule with a knob declares it as an option (Note [schedule options]): ``register(..., options={"round":
"round_size"})``, and the name ``"interleaved-1f1b:round=4"`` runs the generator with ``round_size=4``.

Note [one registry]: a schedule arrives as a name (``GPipe``'s argument, a command-line flag, a row of a
plan), so the names live in one mapping, :data:`SCHEDULES`, that every reader looks up; nothing else keeps a
list of schedules. It is module state on purpose, changed only by :func:`register` and :func:`unregister`;
the built-in generators register when :mod:`gpipe.schedule` imports their modules, in that order.

Note [schedule options]: a schedule's knob travels in its name, ``NAME:key=value[,key=value]`` with positive
integer values, because every reader (``GPipe``, ``--schedule``, a plan's rows) already takes a name and looks it
up here: :func:`schedule_kind` returns the registered kind with the generator's keywords bound
(``functools.partial``) and the name spelt canonically. Options are declared at registration, each key mapped to
a keyword parameter with a default, not read from the signature: a new keyword of a generator exposes nothing by
accident, and a short key may set a descriptive parameter. :data:`SCHEDULES` keeps the bare names, so whoever
enumerates the schedules (the planner, the explorer) runs each once, at its defaults.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
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
_OPTION_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")
_OPTION_VALUE = re.compile(r"^[0-9]+$")  # Note [schedule options]: digits, then checked >= 1
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
        options: the options the name may carry, ``(key, parameter)`` pairs (Note [schedule options]).
        values: the options this kind's name gave, ``(key, value)`` pairs, bound in ``generator``; ``()`` for a
            registered (bare) name.
        copies: the copies of the model's stages its ``n`` stages hold (Note [stage slots] in
            :mod:`gpipe.schedule.schedule`): ``n = copies x`` the model's stages; 1 for most.
    """

    name: str
    generator: Callable[..., Schedule]
    description: str
    constraints: str
    default_checkpoint: Checkpoint
    place: Layout | None = None
    options: tuple[tuple[str, str], ...] = ()
    values: tuple[tuple[str, int], ...] = ()
    copies: int = 1

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
        schedule = self.generator(m, n, **args)
        # a name with options names its schedules too (the generator knows only its bare name)
        return replace(schedule, name=self.name) if self.values and schedule.name != self.name else schedule

    def with_options(self, text: str) -> ScheduleKind:
        """This registered kind with the options ``text`` (``"key=value[,key=value]"``) bound (Note [schedule
        options]): its generator a ``functools.partial`` of the registered one, its name ``NAME:key=value,...``.

        Raises:
            ValueError: the kind takes no options, or ``text`` gives a key it does not take, a key twice, or a
                value that is not a positive integer (the message names the options it takes); or this kind
                has options bound already.
        """
        bare = self.name
        if self.values:
            raise ValueError(f"schedule {self.name!r} has its options already; give them all in one name")
        declared = dict(self.options)
        if not declared:
            raise ValueError(f"schedule {bare!r} takes no options; use its name alone, {bare!r}")
        given: dict[str, int] = {}
        for item in text.split(","):
            key, equals, value = (part.strip() for part in item.partition("="))
            if not equals:
                problem = f"{item.strip()!r} is not key=value"
            elif key not in declared:
                problem = f"unknown option {key!r}"
            elif key in given:
                problem = f"option {key!r} given twice"
            elif not _OPTION_VALUE.match(value) or int(value) < 1:
                problem = f"{key}={value} is not a positive integer"
            else:
                given[key] = int(value)
                continue
            takes = ", ".join(f"{k}=N" for k in declared)
            raise ValueError(f"schedule {bare!r} takes the option{'s' if len(declared) > 1 else ''} {takes} "
                             f"(N a positive integer; e.g. {bare}:{','.join(f'{k}=4' for k in declared)}): "
                             f"{problem} in {bare}:{text}")
        values = tuple((key, given[key]) for key in declared if key in given)
        name = f"{bare}:{','.join(f'{key}={value}' for key, value in values)}"
        bound = functools.partial(self.generator, **{declared[key]: value for key, value in values})
        return replace(self, name=name, generator=bound, values=values)


def register(name: str, description: str, constraints: str = "any m >= 1 and n >= 1, any placement",
             layout: Layout | None = None, options: Mapping[str, str] | None = None,
             copies: int = 1) -> Callable[[G], G]:
    """Register the decorated generator under ``name``; the function itself is returned unchanged.

    ``layout`` says where ``n`` stages go on ``p`` devices, for a schedule built to run several stages per
    device (e.g. :func:`looped`); ``None``: one stage per device unless a placement is given. ``options`` maps
    each option the name may carry to the generator's keyword parameter it sets (Note [schedule options]), e.g.
    ``{"round": "round_size"}`` for ``NAME:round=4``. ``copies``: the copies of the model's stages its
    schedules' stages hold (:attr:`ScheduleKind.copies`).

    Raises:
        ValueError: ``name`` is taken or not a lower-case word (letters, digits, ``-``, ``_``, ``.``); a
            description or constraint that is not one line; a generator without parameters ``m``, ``n`` and
            ``checkpoint`` (with a default policy); an option key that is not a lower-case word, or whose
            parameter the generator lacks or has without a default.
    """
    if not _NAME.match(name):
        raise ValueError(f"a schedule's name is a lower-case word (letters, digits, '-', '_', '.'), got {name!r}")
    if name in _registry:
        raise ValueError(f"a schedule named {name!r} is already registered ({_registry[name].generator.__qualname__})")
    for what, line in (("description", description), ("constraints", constraints)):
        if not line.strip() or "\n" in line:
            raise ValueError(f"the {what} of schedule {name!r} is one line, got {line!r}")

    declared = tuple((options or {}).items())
    for key, _ in declared:
        if not _OPTION_KEY.match(key):
            raise ValueError(f"schedule {name!r}: an option's key is a lower-case word (letters, digits, '-', '_'), "
                             f"got {key!r}")

    def add(generator: G) -> G:
        checkpoint = _default_checkpoint(name, generator)
        params = inspect.signature(generator).parameters
        for key, param in declared:
            keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            if param not in params or params[param].kind not in keyword or \
                    params[param].default is inspect.Parameter.empty:
                raise ValueError(f"schedule {name!r}: option {key!r} sets the parameter {param!r}, which "
                                 f"{generator.__qualname__} lacks or has without a default; give it a keyword "
                                 "parameter with a default")
        _registry[name] = ScheduleKind(name, generator, description, constraints, checkpoint, layout, declared,
                                       copies=copies)
        return generator

    return add


def unregister(name: str) -> ScheduleKind:
    """Take ``name`` out of the registry and return what it held.

    Raises:
        ValueError: no schedule of that name is registered (the message lists those that are).
    """
    kind = schedule_kind(name)
    if kind.values:
        raise ValueError(f"unregister takes a registered name, without options: {name.partition(':')[0]!r}")
    del _registry[name]
    return kind


def schedule_kind(name: str) -> ScheduleKind:
    """The registered schedule called ``name``, with the options the name carries bound: ``"zb-h1"``,
    ``"interleaved-1f1b:round=4"`` (Note [schedule options]).

    Raises:
        ValueError: no schedule of that name is registered (the message lists those that are), or options it
            does not take (the message names those it does).
    """
    try:
        return _registry[name]
    except (KeyError, TypeError):
        pass
    bare, colon, options = name.partition(":") if isinstance(name, str) else (name, "", "")
    if colon and bare in _registry:
        return _registry[bare].with_options(options)
    known = ", ".join(_registry) or "none"
    raise ValueError(f"unknown schedule {bare!r}; registered: {known}")


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
