"""The ``@skippable`` decorator, the ``stash``/``pop`` commands and the trackers that carry skip tensors."""

from __future__ import annotations

import inspect
import threading
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from torch import Tensor, nn

__all__ = ["Namespace", "SkipKey", "Tracker", "current_tracker", "pop", "skippable", "stash", "use_tracker"]


class Namespace:
    """A scope for skip names: the same name in two namespaces is two different skips."""

    __slots__ = ("_id",)

    def __init__(self) -> None:
        self._id = uuid.uuid4().hex[:8]

    def __repr__(self) -> str:
        return f"<Namespace {self._id}>"


DEFAULT_NAMESPACE = Namespace()

SkipKey = tuple[Namespace, str]


class stash:  # noqa: N801 - a command, spelled like a function at the yield site
    """``yield stash(name, tensor)``: hand ``tensor`` to the layer that pops ``name``."""

    __slots__ = ("name", "tensor")

    def __init__(self, name: str, tensor: Tensor) -> None:
        self.name = name
        self.tensor = tensor


class pop:  # noqa: N801
    """``tensor = yield pop(name)``: receive the tensor an earlier layer stashed as ``name``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Tracker(Protocol):
    def save(self, key: SkipKey, tensor: Tensor) -> None: ...

    def load(self, key: SkipKey) -> Tensor: ...


class _DictTracker:
    """The tracker outside a pipeline: one table per thread; a pop takes the tensor out."""

    def __init__(self) -> None:
        self.table: dict[SkipKey, Tensor] = {}

    def save(self, key: SkipKey, tensor: Tensor) -> None:
        self.table[key] = tensor

    def load(self, key: SkipKey) -> Tensor:
        try:
            return self.table.pop(key)
        except KeyError:
            raise RuntimeError(f"pop({key[1]!r}) before any stash({key[1]!r}) in {key[0]}: the layer that "
                               "stashes it must run first (check the order of your nn.Sequential)") from None


_local = threading.local()


def current_tracker() -> Tracker:
    """The tracker of this thread: the pipeline's while a worker runs a task, else a per-thread table."""
    tracker = getattr(_local, "tracker", None)
    if tracker is None:
        tracker = getattr(_local, "default", None)
        if tracker is None:
            tracker = _local.default = _DictTracker()
    return tracker


@contextmanager
def use_tracker(tracker: Tracker) -> Iterator[None]:
    """Route every stash and pop of this thread to ``tracker`` for the duration."""
    previous = getattr(_local, "tracker", None)
    _local.tracker = tracker
    try:
        yield
    finally:
        _local.tracker = previous


class Skippable(nn.Module):
    """Marker base of the classes ``@skippable`` makes; see :func:`skippable`."""

    stashable_names: frozenset[str] = frozenset()
    poppable_names: frozenset[str] = frozenset()
    _namespaces: dict[str, Namespace]

    def isolate(self, ns: Namespace, *, only: Iterable[str] | None = None) -> Skippable:
        """Put this layer's skip names (or only those in ``only``) into namespace ``ns``; returns ``self``."""
        names = self.stashable_names | self.poppable_names
        chosen = set(names if only is None else only)
        unknown = chosen - names
        if unknown:
            raise ValueError(f"{type(self).__name__} declares no skip named {sorted(unknown)}; "
                             f"it declares {sorted(names)}")
        table = dict(getattr(self, "_namespaces", {}))
        for name in chosen:
            table[name] = ns
        object.__setattr__(self, "_namespaces", table)
        return self

    def namespaced(self, name: str) -> SkipKey:
        return getattr(self, "_namespaces", {}).get(name, DEFAULT_NAMESPACE), name

    def stashable(self) -> list[SkipKey]:
        return [self.namespaced(name) for name in sorted(self.stashable_names)]

    def poppable(self) -> list[SkipKey]:
        return [self.namespaced(name) for name in sorted(self.poppable_names)]


M = TypeVar("M", bound=type[nn.Module])


def skippable(stash: Iterable[str] = (), pop: Iterable[str] = ()) -> Callable[[M], M]:
    """Class decorator: declare the skip names a layer stashes and pops.

    The decorated class is a subclass of the original (same name, same ``state_dict`` keys) whose
    ``forward`` drives the original generator ``forward``: every ``yield stash(...)`` and ``yield pop(...)``
    goes to the current tracker. A layer must stash and pop exactly the names it declares, on every call.
    """
    stash_names, pop_names = frozenset(stash), frozenset(pop)
    for name in stash_names | pop_names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"skip names must be non-empty strings, got {name!r}")

    def decorate(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@skippable decorates an nn.Module class, got {cls!r}")
        original = cls.forward

        def forward(self: Skippable, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if not inspect.isgenerator(result):
                if stash_names or pop_names:
                    raise TypeError(f"{cls.__name__}.forward must be a generator (use 'yield stash(...)' / "
                                    "'yield pop(...)') since the class is @skippable with skip names")
                return result
            return _drive(self, result)

        namespace = {"forward": forward, "stashable_names": stash_names, "poppable_names": pop_names,
                     "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
        return type(cls.__name__, (cls, Skippable), namespace)  # type: ignore[return-value]

    return decorate


def _drive(layer: Skippable, gen: Generator[Any, Any, Any]) -> Any:
    tracker = current_tracker()
    stashed: set[str] = set()
    popped: set[str] = set()
    name = type(layer).__name__
    value: Any = None
    try:
        while True:
            command = gen.send(value)
            value = None
            if isinstance(command, stash):
                if command.name not in layer.stashable_names:
                    raise RuntimeError(f"{name} stashes {command.name!r} but declares stash="
                                       f"{sorted(layer.stashable_names)}: add it to @skippable(stash=[...])")
                if not isinstance(command.tensor, Tensor):
                    raise TypeError(f"{name}: stash({command.name!r}, ...) takes a tensor, got "
                                    f"{type(command.tensor).__name__}")
                tracker.save(layer.namespaced(command.name), command.tensor)
                stashed.add(command.name)
            elif isinstance(command, pop):
                if command.name not in layer.poppable_names:
                    raise RuntimeError(f"{name} pops {command.name!r} but declares pop="
                                       f"{sorted(layer.poppable_names)}: add it to @skippable(pop=[...])")
                value = tracker.load(layer.namespaced(command.name))
                popped.add(command.name)
            else:
                raise TypeError(f"{name}.forward yielded {command!r}; only 'stash(name, tensor)' and "
                                "'pop(name)' may be yielded")
    except StopIteration as stop:
        output = stop.value
    missing = sorted((layer.stashable_names - stashed) | (layer.poppable_names - popped))
    if missing:
        raise RuntimeError(f"{name} declared but did not stash/pop {missing} in this call: a skippable "
                           "layer must stash and pop every name it declares, every time")
    return output
