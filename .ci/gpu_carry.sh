#!/usr/bin/env bash
# Prepares .whl/ for the first GPU run (.ci/gpu_check.sh, benchmarks/README.md "First run on a GPU"):
# the wheels gputrain's build needs that the device image lacks, for CPython 3.12 on manylinux
# x86-64: oneDNN (the CPU GEMM library, a build requirement on x86-64) and setuptools (pyproject's
# PEP 639 license needs >= 77; the image's may be older). .whl/ is ignored through git's
# info/exclude (not .gitignore), so it travels only as a carried path. Prints what travels: the
# working tree plus .whl/, against the device's 64 MiB limit.
#
#     bash .ci/gpu_carry.sh        # then run(..., carry=[".whl"])
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0 setuptools==80.9.0)
LIMIT_MIB=64

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"

rm -rf .whl && mkdir .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
git check-ignore -q .whl || { echo "gpu_carry: .whl is not ignored by git ($exclude)" >&2; exit 1; }

# What travels: tracked files plus untracked files git does not ignore, and the carried .whl/.
tree_bytes=$( { git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null || true; } \
    | awk '{s += $1} END {print s + 0}')
whl_bytes=$(find .whl -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
ls -l .whl
awk -v t="$tree_bytes" -v w="$whl_bytes" -v limit="$LIMIT_MIB" 'BEGIN {
    m = 1048576; total = (t + w) / m
    printf "working tree %.1f MiB + .whl %.1f MiB = %.1f MiB of the %d MiB a run carries\n", t / m, w / m, total, limit
    exit (total > limit) }' || { echo "gpu_carry: over the limit" >&2; exit 1; }
