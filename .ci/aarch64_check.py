"""Compares what .ci/aarch64_smoke.c computed on aarch64 (argv[1]) with this x86-64 gputrain:
conversions bit for bit, the GEMM against a float64 reference."""

import sys

import numpy as np

import gputrain as gt

N, M, NC, K = 1 << 16, 67, 130, 99


def lcg_words(count: int) -> np.ndarray:
    """The 32-bit words of aarch64_smoke.c's LCG."""
    words, state = np.empty(count, np.uint32), 12345
    for i in range(count):
        state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
        words[i] = state
    return words


def main(path: str) -> None:
    raw = np.fromfile(path, dtype=np.uint8)
    words = lcg_words(N)
    f32, halves = words.view(np.float32), (words >> 7).astype(np.uint16)
    sizes = [(np.uint16, N), (np.uint16, N), (np.uint32, N), (np.uint32, N), (np.float32, M * NC)]
    assert raw.size == sum(np.dtype(t).itemsize * n for t, n in sizes), f"{path}: {raw.size} bytes"
    parts, offset = [], 0
    for dtype, count in sizes:
        parts.append(raw[offset:offset + np.dtype(dtype).itemsize * count].view(dtype))
        offset += np.dtype(dtype).itemsize * count
    expected = [gt.cast(f32, "bf16").view(np.uint16), gt.cast(f32, "f16").view(np.uint16),
                gt.cast(halves, "f32", src_dtype="bf16").view(np.uint32),
                gt.cast(halves, "f32", src_dtype="f16").view(np.uint32)]
    for name, arm, host in zip(["f32->bf16", "f32->f16", "bf16->f32", "f16->f32"], parts, expected):
        assert np.array_equal(arm, host), f"{name}: {np.count_nonzero(arm != host)} values differ"
    a = ((np.arange(M * K) * 37) % 101 / 50.0 - 1.0).astype(np.float32).reshape(M, K)
    b = ((np.arange(NC * K) * 53) % 97 / 48.0 - 1.0).astype(np.float32).reshape(NC, K)
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    error = np.max(np.abs(parts[4].reshape(M, NC) - exact) / (np.abs(a) @ np.abs(b).T))
    assert error < 1e-5, f"GEMM: relative error {error:.1e}"
    print(f"aarch64 (qemu): conversions bit-identical to x86-64 ({N} values each), "
          f"GEMM error {error:.1e}")


if __name__ == "__main__":
    main(sys.argv[1])
