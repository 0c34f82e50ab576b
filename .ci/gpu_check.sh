#!/usr/bin/env bash
# The first run on a real GPU, in phases that fit the device's budget (benchmarks/README.md,
# "First run on a GPU"). Run from the repository root on the device machine, .whl/ carried
# (.ci/gpu_carry.sh prepares it):
#
#     bash .ci/gpu_check.sh [--phase build|tests|recipes|bench|all] [--dry-run]
#
#   build    builds gputrain for the GPU found (its compute capability only, nvcc on all cores)
#            into a prefix beside the image's Python, so its torch stays importable; build.log
#   tests    the cuda-marked tests with a per-test timeout: tests.xml (JUnit), tests.txt
#   recipes  the guides' recipes on cuda:0 against the CPU: recipes.json
#   bench    GPT-2 124M and the SimpleCNN against transformers + torch: bench.json
#   all      the four in order (default); summary.md after each phase
#
# Results go to $OUT (default: a new temporary folder) as each phase finishes; the log of the
# recipes and bench phases is run.log. --dry-run runs every phase's code on a machine without a
# GPU: the installed gputrain instead of a build, the simulated device "sim" instead of cuda:0,
# tiny sizes, torch's side only if torch is importable (CI runs it: .ci/run).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE="$ROOT/.ci/gpu_check"
PHASE=all DRY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --phase) PHASE=${2:?--phase needs build, tests, recipes, bench or all}; shift 2 ;;
        --phase=*) PHASE=${1#--phase=}; shift ;;
        --dry-run) DRY=1; shift ;;
        *) echo "gpu_check: unknown argument $1 (use --phase build|tests|recipes|bench|all, --dry-run)" >&2; exit 2 ;;
    esac
done
case "$PHASE" in build|tests|recipes|bench|all) ;; *) echo "gpu_check: unknown phase $PHASE" >&2; exit 2 ;; esac
OUT=${OUT:-$(mktemp -d -t gpu-check.XXXXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
PREFIX=${GPU_CHECK_PREFIX:-$ROOT/build/gpu-check-prefix}  # build/ is git-ignored: kept on a warm machine
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-30}      # seconds a cuda test may take
TEST_WORKERS=${GPU_CHECK_TEST_WORKERS:-4}       # pytest-xdist processes sharing the GPU
# Each phase's limit in seconds (the build has none): with the build's 1-2 minutes, all four fit
# in 5 minutes, so a second run fits the device's budget (benchmarks/README.md).
TESTS_SECONDS=${GPU_CHECK_TESTS_SECONDS:-90}
RECIPES_SECONDS=${GPU_CHECK_RECIPES_SECONDS:-75}
BENCH_SECONDS=${GPU_CHECK_BENCH_SECONDS:-90}
if [ "$DRY" = 1 ]; then DEVICE=sim SIZE=tiny; else DEVICE=cuda:0 SIZE=full; fi
status=0

note() { printf '\n== gpu_check %s (%s)\n' "$1" "$(date +%T)"; }

site_packages() {  # where pip --prefix puts gputrain for this Python
    "$PY" -c "import sys, sysconfig; print(sysconfig.get_path('platlib', 'posix_prefix', {'base': sys.argv[1], 'platbase': sys.argv[1]}))" "$PREFIX"
}

compute_capability() {  # "90" for an H100: GPU_CHECK_ARCHS, else nvidia-smi, else torch, else nothing
    local cc=${GPU_CHECK_ARCHS:-}
    [ -n "$cc" ] && { echo "$cc"; return; }
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    [ -n "$cc" ] || cc=$("$PY" -c "import torch; print('%d%d' % torch.cuda.get_device_capability(0))" 2>/dev/null)
    echo "$cc"
}

phase_build() {
    if [ "$DRY" = 1 ]; then  # no build: the installed gputrain, as the device's would report itself
        echo "dry run: no build; the installed gputrain (GPUTRAIN_CUDA_ARCHS would be ${CC:-none: no GPU here};" \
            "the build would go to $(site_packages))"
        (cd /tmp && "$PY" -m gputrain) && return
        return 1
    fi
    [ -n "$CC" ] || { echo "no GPU found (nvidia-smi, torch): nothing to build for"; return 1; }
    ls "$ROOT"/.whl/*.whl >/dev/null 2>&1 || { echo "no .whl/ carried (bash .ci/gpu_carry.sh, carry=['.whl'])"; return 1; }
    # --ignore-installed: into the prefix only, never uninstalling the image's own copies
    "$PY" -m pip install --quiet --no-index --no-deps --ignore-installed --prefix "$PREFIX" "$ROOT"/.whl/*.whl || return 1
    echo "building for sm_$CC with $(nproc) cores: $(find "$ROOT/cuda" -name '*.cu' | wc -l) .cu files"
    local start=$SECONDS
    (cd "$ROOT" && GPUTRAIN_CUDA=1 GPUTRAIN_CUDA_ARCHS="$CC" "$PY" -m pip install -v --no-index --no-deps --ignore-installed \
        --no-build-isolation --prefix "$PREFIX" .) || return 1
    echo "build: $((SECONDS - start)) s"
    (cd /tmp && "$PY" -m gputrain) || return 1
    (cd /tmp && "$PY" -c "import torch; print('torch', torch.__version__, 'importable beside it')") \
        || echo "torch is NOT importable beside this build"
}

has_module() { "$PY" -c "import $1" 2>/dev/null; }

phase_tests() {
    # the files with cuda-marked tests (collecting the whole suite takes a minute on 2 cores)
    local files extra=()
    mapfile -t files < <(grep -l "pytest.mark.cuda" "$ROOT"/tests/test_*.py)
    if [ "$DRY" = 1 ]; then  # the same command on two files: every cuda test skips here
        files=("$ROOT/tests/test_cuda_runtime.py" "$ROOT/tests/test_cuda_step.py")
    elif has_module xdist; then  # tests spread one by one over the workers; 4 CUDA contexts fit any GPU
        extra+=(-n "$TEST_WORKERS" --dist load)
    fi
    if has_module pytest_timeout; then
        extra+=(--timeout "$TEST_TIMEOUT")
    else
        echo "pytest-timeout is not installed: no per-test timeout (only the phase's)"
    fi
    # SIGINT at the phase's limit: pytest stops as on Ctrl-C and still writes the JUnit XML
    (cd /tmp && timeout --signal=INT --kill-after=20 "$TESTS_SECONDS" "$PY" -m pytest -m cuda -q -ra \
        -p no:cacheprovider -c "$ROOT/pyproject.toml" --rootdir "$ROOT" "${extra[@]}" \
        --junitxml "$OUT/tests.xml" "${files[@]}") > "$OUT/tests.log" 2>&1
    local rc=$?
    tail -n 30 "$OUT/tests.log"
    "$PY" "$HERE/tests_summary.py" "$OUT/tests.xml" "$OUT/tests.log" "$rc" > "$OUT/tests.txt"
    rm -f "$OUT/tests.log"
    cat "$OUT/tests.txt"
    [ "$rc" = 0 ]  # every test passed or skipped (without a GPU all skip, saying why)
}

phase_recipes() {  # recipes.json is rewritten after each recipe, bench.json after each case
    (cd /tmp && timeout --kill-after=10 "$RECIPES_SECONDS" "$PY" "$HERE/recipes.py" --device "$DEVICE" --size "$SIZE" \
        --out "$OUT/recipes.json")
}

phase_bench() {
    (cd /tmp && timeout --kill-after=10 "$BENCH_SECONDS" "$PY" "$HERE/bench.py" --device "$DEVICE" --size "$SIZE" \
        --out "$OUT/bench.json")
}

run_phase() {
    local name=$1 rc
    note "$name"
    case "$name" in
        build) phase_build > >(tee "$OUT/build.log") 2>&1 ;;
        tests) phase_tests ;;
        *) "phase_$name" > >(tee -a "$OUT/run.log") 2>&1 ;;
    esac
    rc=$?
    wait  # the tee
    echo "== gpu_check $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
    echo "$name $rc $SECONDS" >> "$PHASES"
    [ "$rc" = 0 ] || status=1
    "$PY" "$HERE/summary.py" "$OUT" "$PHASES" "$DRY" > "$OUT/summary.md" || status=1
}

if [ "$DRY" = 0 ]; then
    site=$(site_packages)
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$DRY" = 1 ]; then CC=${GPU_CHECK_ARCHS:-}; else CC=$(compute_capability); fi
echo "gpu_check: phase $PHASE, device $DEVICE, sizes $SIZE, results in $OUT"
PHASES=$(mktemp)  # "phase exit-status seconds" lines for summary.md (outside $OUT: at most 8 files come back)
if [ "$PHASE" = all ]; then
    for name in build tests recipes bench; do run_phase "$name"; done
else
    run_phase "$PHASE"
fi
rm -f "$PHASES"
cat "$OUT/summary.md"
echo "gpu_check: $([ "$status" = 0 ] && echo "every phase ok" || echo "a phase FAILED"); results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$status"
