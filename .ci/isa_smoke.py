"""Smoke set for CPUs gputrain's CI machine does not have, run under qemu-x86_64 by .ci/run.

For every SIMD level the (emulated) CPU offers gputrain: a few digits training steps with AdamW
in fp32, bf16 and fp16 (with a GradScaler), and a DataLoader epoch with worker threads. Each
level must train (finite, falling loss; every row once per epoch), and all levels must give
bit-identical weights, since only gputrain's elementwise kernels change with the level.

    python .ci/isa_smoke.py DIGITS.npz     (x: (n, 64) float32, y: (n,) int64)
"""

from __future__ import annotations

import sys

import numpy as np

import gputrain as gt
from gputrain import _C

LEVELS = ["scalar", "avx2", "avx512"]
STEPS = 12


def train(x: np.ndarray, y: np.ndarray, precision: str) -> tuple[list[float], bytes]:
    """STEPS AdamW steps of a small MLP; the losses and the final weights' bytes."""
    gt.random.manual_seed(0)
    model = gt.nn.Sequential(gt.nn.LayerNorm(64), gt.nn.Linear(64, 128), gt.nn.GELU(),
                             gt.nn.Dropout(0.1), gt.nn.Linear(128, 10))
    optimizer = gt.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scaler = gt.amp.GradScaler() if precision == "fp16" else None
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision,
                        scaler=scaler, max_grad_norm=1.0)
    losses = [float(step(x[i * 64:(i + 1) * 64], y[i * 64:(i + 1) * 64]).loss) for i in range(STEPS)]
    weights = b"".join(w.tobytes() for w in model.state_dict().values())
    return losses, weights


def loader_epoch(x: np.ndarray, y: np.ndarray) -> None:
    """One shuffled epoch with two worker threads delivers every row exactly once."""
    ids = np.arange(len(x), dtype=np.int64)
    loader = gt.DataLoader((x, ids), batch_size=100, shuffle=True, num_workers=2,
                           prefetch_factor=2, seed=0)
    seen = []
    for batch_x, batch_ids in loader:
        assert np.array_equal(batch_x, x[batch_ids]), "a batch's rows do not match its ids"
        seen.append(batch_ids)
    assert np.array_equal(np.sort(np.concatenate(seen)), ids), "the epoch lost or repeated rows"


def main() -> int:
    data = np.load(sys.argv[1])
    x, y = data["x"], data["y"]
    facts = gt.info()
    levels = LEVELS[:LEVELS.index(facts["simd_supported"]) + 1]
    print(f"CPU offers gputrain {levels}; GEMM kernels: {facts['blas']} {facts['blas_kernel']}")
    failures = []
    for precision in ("fp32", "bf16", "fp16"):
        weights_by_level = {}
        for level in levels:
            _C.set_simd_level(level)
            losses, weights_by_level[level] = train(x, y, precision)
            ok = all(np.isfinite(losses)) and losses[-1] < losses[0]
            print(f"{precision:4s} {level:6s} loss {losses[0]:.4f} -> {losses[-1]:.4f} "
                  f"{'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append(f"{precision} at {level} did not train")
        if len(set(weights_by_level.values())) != 1:
            failures.append(f"{precision}: the SIMD levels gave different weights")
    for level in levels:
        _C.set_simd_level(level)
        loader_epoch(x, y)
        print(f"loader epoch at {level} ok")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
