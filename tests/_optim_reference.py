"""NumPy references of PyTorch's CPU AdamW and SGD (foreach=False), operation by operation in
float32, with a correctly rounded float32 FMA emulated in float64 (round-to-odd), so the
fused C optimizers can be compared bit for bit."""

from __future__ import annotations

import numpy as np


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """round_f32(a*b + c) with one rounding: the float64 product is exact, the float64 sum is
    made round-to-odd (exact error by TwoSum), so the final rounding to float32 is correct."""
    a, b, c = (np.asarray(x, dtype=np.float32).astype(np.float64) for x in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    even = (s.view(np.int64) & 1) == 0
    fix = (err != 0) & even & np.isfinite(s)
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    with np.errstate(over="ignore", invalid="ignore"):
        return s.astype(np.float32)


def f32(x: float) -> np.float32:
    return np.float32(x)


def lerp(start: np.ndarray, end: np.ndarray, weight: float) -> np.ndarray:
    """torch.lerp as the vectorised CPU kernel computes it (one FMA)."""
    w = f32(weight)
    diff = end - start
    if abs(w) < 0.5:
        return fma32(w, diff, start)
    return fma32(w - f32(1.0), diff, end)


class AdamWReference:
    """torch.optim.AdamW(foreach=False) on float32 NumPy arrays, one state per parameter."""

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, maximize=False):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.amsgrad, self.maximize = amsgrad, maximize
        self.state: dict[int, dict] = {}

    def update(self, key: int, p: np.ndarray, g: np.ndarray, grad_coef: float = 1.0) -> None:
        st = self.state.setdefault(key, {"step": 0, "m": np.zeros_like(p), "v": np.zeros_like(p),
                                         "vmax": np.zeros_like(p)})
        beta1, beta2 = self.betas
        g = g * f32(grad_coef)
        if self.maximize:
            g = -g
        st["step"] += 1
        t = float(st["step"])
        p *= f32(1 - self.lr * self.wd)
        st["m"] = lerp(st["m"], g, 1 - beta1)
        st["v"] = fma32(f32(1 - beta2) * g, g, st["v"] * f32(beta2))
        bc1 = 1 - beta1**t
        bc2 = 1 - beta2**t
        step_size = self.lr / bc1
        bc2_sqrt = bc2**0.5
        v = st["v"]
        if self.amsgrad:
            st["vmax"] = np.maximum(st["vmax"], st["v"])
            v = st["vmax"]
        denom = np.sqrt(v) / f32(bc2_sqrt) + f32(self.eps)
        p += (f32(-step_size) * st["m"]) / denom


class SGDReference:
    """torch.optim.SGD(foreach=False) on float32 NumPy arrays (torch's CPU add(alpha) is an FMA)."""

    def __init__(self, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False):
        self.lr, self.momentum, self.dampening, self.wd = lr, momentum, dampening, weight_decay
        self.nesterov, self.maximize = nesterov, maximize
        self.buffers: dict[int, np.ndarray] = {}

    def update(self, key: int, p: np.ndarray, g: np.ndarray, grad_coef: float = 1.0) -> None:
        g = g * f32(grad_coef)
        if self.maximize:
            g = -g
        if self.wd != 0:
            g = fma32(p, f32(self.wd), g)
        if self.momentum != 0:
            if key not in self.buffers:
                self.buffers[key] = g.copy()
            else:
                self.buffers[key] = fma32(g, f32(1 - self.dampening), self.buffers[key] * f32(self.momentum))
            buf = self.buffers[key]
            g = fma32(buf, f32(self.momentum), g) if self.nesterov else buf
        p[...] = fma32(g, f32(-self.lr), p)


def ulp_diff(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in units in the last place between two float32 arrays."""
    ia = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, np.int64(-(2**31)) - ia, ia)
    ib = np.where(ib < 0, np.int64(-(2**31)) - ib, ib)
    return int(np.max(np.abs(ia - ib))) if ia.size else 0
