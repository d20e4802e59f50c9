"""Batch normalisation whose running statistics advance once per mini-batch, not once per micro-batch.

In training, every micro-batch is normalised with its own statistics, exactly as ``nn.BatchNorm*`` would
normalise that micro-batch alone. The running mean and variance, however, are updated once, after the
last of the ``chunks`` micro-batches of a mini-batch, from the statistics of the *whole* mini-batch: the
result equals what ``nn.BatchNorm*`` would have stored had it seen the mini-batch in one piece (mean,
unbiased variance, momentum or cumulative average, ``num_batches_tracked``), up to float rounding.

Note [deferred statistics]: each micro-batch contributes its mean and its sum of squared deviations,
merged with Chan et al.'s pairwise update (numerically stable, unlike a running sum of squares)::

    n = n_a + n_b        delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    m2   = m2_a + m2_b + delta**2 * n_a * n_b / n

``n`` counts values per channel (samples x spatial positions), so an uneven last chunk (say 5 rows in
chunks of 2, 2, 1) weighs each micro-batch by its size, and the committed variance is ``m2 / (n - 1)``
over the whole mini-batch: the same unbiased correction ``nn.BatchNorm*`` applies. The per-micro-batch
mean and variance come out of the same ``F.batch_norm`` call that normalises it (``momentum=1.0`` into
scratch buffers), so tracking costs no extra pass over the input.

Note [recompute counts nothing]: a checkpointed micro-batch runs its forward twice: once under
``no_grad`` (counted) and once more right before its backward (:func:`gpipe.autograd.phase.is_recomputing`, not
counted). Each micro-batch is therefore counted exactly once, whatever the checkpoint mode.

Note [threads]: the pending statistics live on the layer and are not locked. That is safe because a
layer belongs to exactly one partition, and the executor runs all micro-batches of a partition on that
partition's single worker thread, in order, finishing one mini-batch's forwards before the next
mini-batch's. Calling one layer from several threads at once is not supported.

Note [fewer micro-batches than chunks]: ``torch.chunk`` may return fewer pieces than asked (5 rows in 4
chunks gives 2, 2, 1). The layer commits after ``chunks`` micro-batches; whoever splits the batch either
sets ``chunks`` to the real count or calls :meth:`DeferredBatchNorm.commit_all` after the forward.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from gpipe.autograd.phase import is_recomputing

__all__ = ["DeferredBatchNorm"]

M = TypeVar("M", bound=nn.Module)


class DeferredBatchNorm(_BatchNorm):
    """Batch normalisation for pipelines: running statistics updated once per mini-batch of ``chunks``.

    Works for inputs of shape ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)`` and ``(N, C, D, H, W)``.

    Args:
        num_features: channels ``C``.
        eps: added to the variance for numerical stability.
        momentum: weight of the new mini-batch in the running statistics; ``None`` for a cumulative
            average over all mini-batches so far.
        affine: learn a per-channel scale and shift.
        chunks: micro-batches per mini-batch; the running statistics are committed after this many.

    Raises:
        ValueError: ``chunks`` is not a positive integer.
    """

    _pending_mean: Tensor | None
    _pending_m2: Tensor | None

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, chunks: int = 1) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats=True)
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ValueError(f"chunks must be a positive integer, got {chunks!r}")
        self.chunks = chunks
        # Non-persistent: they follow .to() and .cuda() but stay out of the state dict, so a converted
        # model saves and loads exactly like the plain BatchNorm model.
        self.register_buffer("_pending_mean", None, persistent=False)
        self.register_buffer("_pending_m2", None, persistent=False)
        self._pending_count = 0  # values per channel merged so far in this mini-batch
        self._tracked = 0  # micro-batches merged so far in this mini-batch

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, chunks={self.chunks}"

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions (N, C, ...), got {input.dim()}D")

    @property
    def pending(self) -> int:
        """Micro-batches tracked since the last commit."""
        return self._tracked

    def forward(self, input: Tensor) -> Tensor:
        """Normalise ``input``: by its own statistics in training, by the running ones in eval."""
        self._check_input_dim(input)
        assert self.running_mean is not None and self.running_var is not None
        if not self.training:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        # Scratch buffers receive this micro-batch's mean and unbiased variance (momentum 1.0); the
        # recompute passes them too, so both passes run the very same kernel.
        mean = torch.zeros_like(self.running_mean)
        var = torch.ones_like(self.running_var)
        output = F.batch_norm(input, mean, var, self.weight, self.bias, True, 1.0, self.eps)
        if not is_recomputing():
            self._track(mean, var, input.numel() // input.size(1))
            if self._tracked >= self.chunks:
                self.commit()
        return output

    @torch.no_grad()
    def _track(self, mean: Tensor, var: Tensor, count: int) -> None:
        m2 = var * (count - 1)
        if self._tracked == 0 or self._pending_mean is None or self._pending_m2 is None:
            self._pending_mean, self._pending_m2, self._pending_count = mean, m2, count
        else:
            total = self._pending_count + count
            delta = mean - self._pending_mean
            self._pending_mean = self._pending_mean + delta * (count / total)
            self._pending_m2 = self._pending_m2 + m2 + delta.square() * (self._pending_count * count / total)
            self._pending_count = total
        self._tracked += 1

    @torch.no_grad()
    def commit(self) -> bool:
        """Fold the micro-batches tracked so far into the running statistics, as one mini-batch.

        Returns:
            ``True`` if anything was pending (and is now committed), ``False`` otherwise.
        """
        if self._tracked == 0 or self._pending_mean is None or self._pending_m2 is None:
            return False
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative moving average, as nn.BatchNorm
            factor = 1.0 / float(self.num_batches_tracked.item())
        else:
            factor = float(self.momentum)
        var = self._pending_m2 / max(self._pending_count - 1, 1)
        self.running_mean.mul_(1.0 - factor).add_(self._pending_mean, alpha=factor)
        self.running_var.mul_(1.0 - factor).add_(var, alpha=factor)
        self._pending_mean = self._pending_m2 = None
        self._pending_count = self._tracked = 0
        return True

    @classmethod
    def commit_all(cls, module: nn.Module) -> int:
        """Commit every :class:`DeferredBatchNorm` inside ``module`` that has pending micro-batches.

        Args:
            module: any module; it is searched recursively.

        Returns:
            How many layers committed.
        """
        return sum(1 for layer in module.modules() if isinstance(layer, cls) and layer.commit())

    @classmethod
    def convert_deferred_batch_norm(cls, module: M, chunks: int = 1) -> M:
        """Replace every batch-norm layer in ``module`` that tracks running statistics.

        The new layers share the old ones' parameters and buffers (the same tensor objects, so an
        optimizer built before the conversion keeps working) and their training flag. Containers are
        changed in place, like ``nn.SyncBatchNorm.convert_sync_batchnorm``; a batch-norm ``module``
        itself is returned converted.

        Args:
            module: the model, or a single batch-norm layer.
            chunks: micro-batches per mini-batch.

        Returns:
            ``module`` with its batch-norm layers replaced (or the replacement of ``module``).

        Raises:
            ValueError: ``chunks`` is not a positive integer.
        """
        converted: nn.Module = module
        if isinstance(module, _BatchNorm) and module.track_running_stats:
            if isinstance(module, cls) and module.chunks == chunks:
                return module
            converted = cls(module.num_features, module.eps, module.momentum, module.affine, chunks=chunks)
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_deferred_batch_norm(child, chunks))
        return converted  # type: ignore[return-value]
