"""Skip connections across partitions: ``skippable``, ``stash``, ``pop``, ``Namespace``, ``verify_skippables``.

A layer declares what it stashes and pops; its ``forward`` is a generator that yields ``stash(name, t)``
to hand a tensor to a later layer and ``yield pop(name)`` to receive one::

    from gpipe.skip import pop, skippable, stash

    @skippable(stash=["identity"])
    class Keep(nn.Module):
        def forward(self, x):
            yield stash("identity", x)
            return x

    @skippable(pop=["identity"])
    class Add(nn.Module):
        def forward(self, x):
            identity = yield pop("identity")
            return x + identity

Outside a pipeline the layers work in any ``nn.Sequential`` (a per-thread table carries the tensors).
Inside :class:`gpipe.GPipe`, a tensor stashed in partition ``a`` and popped in partition ``b > a`` travels
straight from ``a`` to ``b``, and its gradient straight back from ``b`` to ``a``, without passing through
the partitions in between: the *portals* of Kim et al. (2020), section 3.3. A stash and its pop in the
same partition never leave it.

Names are scoped by :class:`Namespace`: ``layer.isolate(ns)`` puts a layer's names into ``ns``, so two
copies of a block can reuse one name without clashing.
"""

from gpipe.skip.layout import SkipLayout, verify_skippables
from gpipe.skip.skippable import Namespace, pop, skippable, stash

__all__ = ["Namespace", "SkipLayout", "pop", "skippable", "stash", "verify_skippables"]
