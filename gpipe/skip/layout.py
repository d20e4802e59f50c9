"""Where each skip is stashed and popped: checked before a pipeline runs, used to route the tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from gpipe.skip.skippable import SkipKey, Skippable

__all__ = ["SkipLayout", "verify_skippables"]


def _ordered_skippables(layers: Sequence[nn.Module]) -> list[tuple[int, Skippable]]:
    found = []
    for index, layer in enumerate(layers):
        for sub in layer.modules():
            if isinstance(sub, Skippable):
                found.append((index, sub))
    return found


def verify_skippables(module: nn.Sequential) -> None:
    """Check that every stash has exactly one pop after it and every pop has a stash before it.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        RuntimeError: listing every problem, each with its fix.
    """
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"verify_skippables takes an nn.Sequential, got {type(module).__name__}")
    SkipLayout.of(list(module), [len(module)])


@dataclass(frozen=True)
class SkipLayout:
    """``stashed_in[key]`` and ``popped_in[key]``: the partition (0-based) of each skip's stash and pop."""

    stashed_in: dict[SkipKey, int]
    popped_in: dict[SkipKey, int]

    @classmethod
    def of(cls, layers: Sequence[nn.Module], balance: Sequence[int]) -> SkipLayout:
        partition_of = [j for j, size in enumerate(balance) for _ in range(size)]
        stashed_in: dict[SkipKey, int] = {}
        popped_in: dict[SkipKey, int] = {}
        open_: dict[SkipKey, int] = {}
        problems: list[str] = []
        for index, layer in _ordered_skippables(layers):
            label = f"layer {index} ({type(layer).__name__})"
            for key in layer.poppable():
                if key not in open_:
                    what = "is popped twice" if key in popped_in else "has no stash before it"
                    problems.append(f"{label} pops {key[1]!r}, which {what}: stash it in an earlier layer "
                                    "(or isolate the two uses in different Namespaces)")
                    continue
                del open_[key]
                popped_in[key] = partition_of[index]
            for key in layer.stashable():
                if key in open_:
                    problems.append(f"{label} stashes {key[1]!r} again before it was popped: give one of them "
                                    "another name or isolate them in different Namespaces")
                    continue
                open_[key] = index
                stashed_in[key] = partition_of[index]
        for key, index in open_.items():
            problems.append(f"layer {index} stashes {key[1]!r} but no later layer pops it: add a layer with "
                            f"@skippable(pop=[{key[1]!r}]) after it, or stop stashing it")
        if problems:
            raise RuntimeError("invalid skip connections:\n  " + "\n  ".join(problems))
        return cls(stashed_in, popped_in)

    def crosses(self, key: SkipKey) -> bool:
        """True when the skip is stashed and popped in different partitions (it needs a portal)."""
        return self.stashed_in[key] != self.popped_in[key]
