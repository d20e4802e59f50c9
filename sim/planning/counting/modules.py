"""The modules selective recompute may recompute, marked where a built-in model runs them, and what the counter
records of each: which forward operators are the module's, and which saved tensors it produced.

Note [recompute modules]: Megatron-Core's ``--recompute-granularity selective --recompute-modules LIST`` recomputes
named parts of each block inside its backward and keeps none of what they produced: ``core_attn`` (the attention
core), ``layernorm`` (the normalisations), ``mla_up_proj`` (MLA's up-projections and the RoPE after them),
``moe_act`` (the experts' activation), besides ``mlp``, ``moe`` and ``shared_experts``. DeepSeek-V3 ran the set
``layernorm, mla_up_proj`` and recomputed its MoE's SwiGLU output too (arXiv 2412.19437, section 3.2.3
"Recomputation of RMSNorm and MLA Up-Projection" and section 3.3.3 "Low-Precision Activation"). A built-in model
runs each such part under :func:`recompute_module`; while the counter counts a layer's forward
(:func:`recording`), every operator run inside is the module's (it runs again before the backward) and every
tensor it returns is the module's (not kept: the recompute makes it again). ``core_attn`` is the planner's
``selective`` policy, found by its shapes (:class:`~sim.planning.counting.counts.AttentionCore`), so it is not one
of these. Outside :func:`recording` a mark costs nothing: a model runs as it would.

Reference: NVIDIA Megatron-Core ``TransformerConfig.recompute_modules``; NeMo Megatron Bridge, "Activation
Recomputation" (selective granularity, ``recompute_modules``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["MODULES", "Marks", "module_mask", "produced", "recompute_module", "recording"]

#: The modules a built-in model marks, in bit order of :attr:`~sim.planning.counting.counts.OpTable.modules`.
MODULES = ("layernorm", "mla_up_proj", "moe_act")


def module_mask(names: tuple[str, ...] | list[str]) -> int:
    """The bits of ``names`` (each one of :data:`MODULES`).

    Raises:
        ValueError: a name that is not one of :data:`MODULES`.
    """
    mask = 0
    for name in names:
        if name not in MODULES:
            raise ValueError(f"unknown recompute module {name!r}; use {', '.join(MODULES)}")
        mask |= 1 << MODULES.index(name)
    return mask


@dataclass
class Marks:
    """What one layer's forward ran inside marked modules: the module bits of each recorded operator (parallel to the
    counter's list of operators) and of each storage an operator produced (by storage key)."""

    ops: Sized
    op_bits: list[int] = field(default_factory=list)
    produced: dict[int, int] = field(default_factory=dict)
    active: int = 0
    alive: list[torch.Tensor] = field(default_factory=list)

    def catch_up(self) -> None:
        """Give every operator recorded since the last call the module bits active now."""
        self.op_bits.extend([self.active] * (len(self.ops) - len(self.op_bits)))


_current: list[Marks] = []


@contextmanager
def recording(ops: Sized) -> Iterator[Marks]:
    """Record the marks of a forward whose operators the counter appends to ``ops``."""
    marks = Marks(ops)
    _current.append(marks)
    try:
        yield marks
    finally:
        _current.pop()
        marks.catch_up()


@contextmanager
def recompute_module(name: str) -> Iterator[None]:
    """Run the enclosed code as module ``name`` of :data:`MODULES` (Note [recompute modules])."""
    if not _current:
        yield
        return
    marks, bit = _current[-1], module_mask((name,))
    marks.catch_up()
    before = marks.active
    marks.active |= bit
    try:
        yield
    finally:
        marks.catch_up()
        marks.active = before


def produced(outputs: Callable[[], list[torch.Tensor]]) -> None:
    """Note that the storages of the tensors ``outputs()`` gives were produced by an operator just run (by the
    counter): inside a marked module, they are its. They are kept alive while the layer is counted, so that no
    later storage takes a key a module's storage had."""
    if _current and _current[-1].active:
        marks = _current[-1]
        for t in outputs():
            key = int(t.untyped_storage()._cdata)
            marks.produced[key] = marks.produced.get(key, 0) | marks.active
            marks.alive.append(t)
