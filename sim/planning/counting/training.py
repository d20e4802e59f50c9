"""Training policies: the compute dtype and the bytes of model state per parameter that precision and optimizer
imply (``fp32-adam``, ``bf16-adam``, Megatron-LM's ``bf16-adam-fp32grad``, TransformerEngine's ``fp8-adam``, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TRAINING", "Training", "training_policy"]


@dataclass(frozen=True)
class Training:
    """How training stores and updates numbers: the compute dtype and bytes of model state per parameter.

    Attributes:
        name: for display (``"mixed-adam"``).
        compute: the key of ``DeviceSpec.peak_flops`` the matrix products run at.
        torch_dtype: the dtype to count the model in (activations take its size).
        weight_bytes: bytes per parameter of weights (16-bit copy plus 32-bit master in mixed precision).
        gradient_bytes: bytes per parameter of gradients.
        optimizer_bytes: bytes per parameter of optimizer state (Adam: two moments).
        update_bytes: bytes per parameter the optimizer step reads and writes.
        other_compute: the key of ``DeviceSpec.peak_flops`` every other product runs at, where ``compute`` covers
            only the linear products (FP8 training: Note [fp8 training] in :mod:`sim.planning.counting.fp8`); ``None``:
            every product runs at ``compute``.
        fp8_weight_bytes: of ``weight_bytes``, the FP8 copies the products read (the weight and its transpose),
            which no ZeRO stage shards; 0 without FP8.
    """

    name: str
    compute: str
    torch_dtype: torch.dtype
    weight_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    update_bytes: int
    other_compute: str | None = None
    fp8_weight_bytes: int = 0

    @property
    def model_state_bytes_per_parameter(self) -> int:
        return self.weight_bytes + self.gradient_bytes + self.optimizer_bytes


# fp32 tensors per parameter: Adam's two moments, SGD's momentum buffer, RMSprop's running mean of squared
# gradients (torch.optim.RMSprop without momentum and not centred; each of those adds one more)
_OPTIMIZER_STATE = {"adam": 2, "momentum": 1, "rmsprop": 1, "sgd": 0}

#: The named policies: ``{fp32, tf32, fp16, bf16}-{adam, momentum, rmsprop, sgd}``, ``{fp16, bf16}-adam-fp32grad``
#: and ``fp8-adam``, ``fp8-adam-fp32grad``.
TRAINING: dict[str, Training] = {}
for _dtype, _torch_dtype in (("fp32", torch.float32), ("tf32", torch.float32),
                             ("fp16", torch.float16), ("bf16", torch.bfloat16)):
    for _opt, _states in _OPTIMIZER_STATE.items():
        _mixed = _dtype in ("fp16", "bf16")
        _w = 2 + 4 if _mixed else 4  # mixed: a 16-bit copy for compute plus the 32-bit master
        _g = 2 if _mixed else 4
        # the step reads master weights, gradients and state, and writes weights, state (and the copy)
        _update = 4 + _g + 8 * _states + 4 + (2 if _mixed else 0)
        TRAINING[f"{_dtype}-{_opt}"] = Training(f"{_dtype}-{_opt}", _dtype, _torch_dtype, _w, _g, 4 * _states,
                                                 _update)
# Megatron-LM's mixed precision: 16-bit weights for compute, gradients accumulated and reduced in 32 bits (its "main
# grads"), 32-bit master weights and Adam's moments: 2 + 4 + 4 + 4 + 4 = 18 bytes per parameter (Narayanan et al.,
# 2021; Korthikanti et al., 2022).
for _dtype, _torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    _name = f"{_dtype}-adam-fp32grad"
    TRAINING[_name] = Training(_name, _dtype, _torch_dtype, 2 + 4, 4, 8, 4 + 4 + 8 + 4 + 8 + 2)
# TransformerEngine's FP8 training as Megatron-LM runs it (Note [fp8 training] in sim.planning.counting.fp8): the linear
# products in FP8 (``compute``), everything else in BF16, the model counted in BF16. Model state is bf16-adam's or
# bf16-adam-fp32grad's plus the FP8 weight and its transpose, 1 byte each: 18 and 20 bytes per parameter. The step
# also casts each weight once (TE caches it over the step's micro-batches): reads 2 bytes, writes 1 + 1.
for _name, _g in (("fp8-adam", 2), ("fp8-adam-fp32grad", 4)):
    TRAINING[_name] = Training(_name, "fp8", torch.bfloat16, 2 + 4 + 2, _g, 8, 4 + _g + 8 + 4 + 8 + 2 + (2 + 2),
                               other_compute="bf16", fp8_weight_bytes=2)


def training_policy(name: str) -> Training:
    """The named :class:`Training` policy (``"bf16-adam"``, ``"fp32-sgd"``, ...).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    key = name.strip().lower()
    if key not in TRAINING:
        raise KeyError(f"unknown training policy {name!r}; known: {', '.join(TRAINING)}")
    return TRAINING[key]
