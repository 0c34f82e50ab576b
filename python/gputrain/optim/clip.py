"""Gradient clipping by global norm, with torch.nn.utils.clip_grad_norm_'s semantics.

The L2 norm is computed in float64 in a fixed order (gputrain._C.grad_sumsq), so it does not
depend on the number of threads or the SIMD level.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from gputrain import _C
from gputrain.nn.parameter import Parameter

__all__ = ["clip_coefficient", "clip_grad_norm_", "total_norm"]


def total_norm(grads: Iterable[np.ndarray], norm_type: float = 2.0) -> float:
    """The norm of all gradients together (each a float32 array): 2, inf, or any p > 0."""
    grads = list(grads)
    for g in grads:
        if not isinstance(g, np.ndarray):
            raise TypeError(f"grads must be NumPy arrays, got a {type(g).__name__}")
    p = float(norm_type)
    if p == 2.0:
        return math.sqrt(sum((_C.grad_sumsq(g) for g in grads), 0.0))
    if p == math.inf:
        return max((_C.grad_absmax(g) for g in grads), default=0.0, key=lambda v: (math.isnan(v), v))
    if not p > 0.0:
        raise ValueError(f"norm_type must be > 0 or inf, got {norm_type}")
    total = sum(float(np.sum(np.abs(g.astype(np.float64)) ** p)) for g in grads)
    try:
        return total ** (1.0 / p)
    except OverflowError:  # a tiny p: beyond the float range, as NumPy and PyTorch say
        return math.inf


def clip_coefficient(max_norm: float, norm: float) -> float:
    """min(1, max_norm / (norm + 1e-6)) rounded to float32, the factor the gradients get."""
    coef = float(max_norm) / (norm + 1e-6)
    return float(np.float32(coef)) if not coef >= 1.0 else 1.0


def clip_grad_norm_(parameters: Parameter | Iterable[Parameter], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scale the gradients in place so their total norm is at most max_norm; return the norm.

    As PyTorch's: the coefficient is max_norm / (norm + 1e-6) clamped to 1, and every gradient
    is multiplied by it. Parameters whose grad is None are ignored.
    """
    params = [parameters] if isinstance(parameters, Parameter) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = total_norm(grads, norm_type)
    if error_if_nonfinite and not math.isfinite(norm):
        raise RuntimeError(f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
                           "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
                           "by the non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = np.float32(clip_coefficient(max_norm, norm))
    for grad in grads:
        np.multiply(grad, coef, out=grad)
    return norm
