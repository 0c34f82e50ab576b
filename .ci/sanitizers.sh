#!/usr/bin/env bash
# Sanitizer runs, called by .ci/run (issue 10, item 14). Two CPU-only builds of this tree, each
# in a temporary build directory (the tree and the installed gputrain are left alone):
#   1. ASan + UBSan (GPUTRAIN_SANITIZE=1; setup.py adds -fno-sanitize-recover=all, so a UBSan
#      finding aborts): the whole test suite, with a shorter fuzz run (each case is slower).
#   2. ThreadSanitizer (GPUTRAIN_SANITIZE=thread): the loader, offload and thread tests.
# Any sanitizer report fails the script: the runtimes abort (halt_on_error) and write their
# reports to files that are checked after each run, so a report in a subprocess of a test (the fuzz
# workers, the shutdown scenarios) counts even if that test only looked at its exit status.
#
# Uses the virtual environment .ci/run made (.venv-ci; GPUTRAIN_CI_VENV names another), which has
# the test requirements; the build requirements are installed into it when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stage() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

venv=${GPUTRAIN_CI_VENV:-$root/.venv-ci}
py=$venv/bin/python
[ -x "$py" ] || { echo "no virtual environment at $venv: run .ci/run (or set GPUTRAIN_CI_VENV)"; exit 1; }
build_requirements=("setuptools>=77" wheel "numpy>=2.0" "onednn-cpu-gomp~=2023.2.0" "onednn-devel-cpu-gomp~=2023.2.0")
if ! "$py" - "${build_requirements[@]}" 2>/dev/null <<'PY'
import importlib.metadata, re, sys
for requirement in sys.argv[1:]:
    importlib.metadata.distribution(re.split("[<>=~]", requirement)[0])
PY
then
    "$py" -m pip install --quiet "${build_requirements[@]}"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
reports=$work/reports
mkdir -p "$reports"

build() {  # build GPUTRAIN_SANITIZE-value directory: an importable gputrain in directory/lib
    stage "build with GPUTRAIN_SANITIZE=$1"
    if ! GPUTRAIN_CUDA=0 GPUTRAIN_SANITIZE=$1 "$py" setup.py build --build-base "$2/base" \
            --build-lib "$2/lib" --build-temp "$2/tmp" -j 2 >"$2.log" 2>&1; then
        tail -40 "$2.log"
        exit 1
    fi
}

check_build() {  # check_build directory flag env...: the tests will import that build
    local dir=$1 flag=$2
    shift 2
    (cd /tmp && env "$@" "$py" -c "
import gputrain
assert gputrain.__file__.startswith('$dir/lib/'), gputrain.__file__
assert '$flag' in gputrain._C.build_info()['compile_flags'], gputrain._C.build_info()['compile_flags']")
}

bounded() {  # bounded seconds command...: a hang fails the stage, with every thread's stack
    # (SIGABRT: pytest's faulthandler prints the Python stacks), instead of using up CI's time
    local rc=0
    timeout --signal=ABRT --kill-after=60 "$@" || rc=$?
    [ "$rc" -ne 124 ] || echo "timed out after $1 s: $*"
    return "$rc"
}

fail_on_reports() {  # fail_on_reports name pattern: a report file with an error fails the script
    # (ASan also logs a warning for each allocation it refuses under allocator_may_return_null:
    # not an error, the tests of out-of-memory paths ask for those)
    local found
    found=$(grep -l -E "$2" "$reports"/* 2>/dev/null || true)
    if [ -n "$found" ]; then
        echo "$1 reported:"
        # shellcheck disable=SC2086
        head -c 20000 $found
        exit 1
    fi
}

# 1. ASan + UBSan. Python is not instrumented: libasan is preloaded, PYTHONMALLOC=malloc lets ASan
# see Python's allocations, leaks are not checked (the interpreter keeps memory at exit), and
# tests that ask for more memory than exists get NULL (allocator_may_return_null) as without ASan.
build 1 "$work/asan"
asan_env=(PYTHONPATH="$work/asan/lib" LD_PRELOAD="$(gcc -print-file-name=libasan.so)" PYTHONMALLOC=malloc
          ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=8192:log_path=$reports/asan"
          UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan")
check_build "$work/asan" "-fsanitize=address,undefined" "${asan_env[@]}"
stage "the test suite under ASan + UBSan"
# Left out: the native_only stress loops (timing-bound: run once, natively, by .ci/run), and
# the one test that starts Python with an emptied environment (no LD_PRELOAD, so the
# instrumented extension cannot load); it checks the import, not memory.
# (A sanitizer that halts pytest itself leaves its report in a file: the reports are shown before
# the run's exit status fails the script.)
status=0
bounded 2400 env "${asan_env[@]}" GPUTRAIN_FUZZ_CASES="${GPUTRAIN_SANITIZE_FUZZ_CASES:-2000}" \
    "$py" -m pytest -q -ra -p no:cacheprovider -m "not slow and not native_only" --durations=15 tests \
    --deselect tests/test_runtime.py::test_import_needs_no_environment_variables || status=$?
fail_on_reports "ASan/UBSan" "ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: (Address|UndefinedBehavior)Sanitizer"
[ "$status" -eq 0 ] || exit "$status"

# 2. ThreadSanitizer on the code that runs threads: the loader's C workers, the offload and
# copy-stream threads, the simulated device's stream workers, and the thread-safety tests.
# OMP_NUM_THREADS=1: libgomp is not built with TSan, so its barriers are invisible to it and every
# OpenMP parallel loop would be reported as a race between the team's threads (false positives);
# with one thread an OpenMP region runs on the thread that enters it, and the pthread concurrency
# under test is unchanged.
build thread "$work/tsan"
tsan_env=(PYTHONPATH="$work/tsan/lib" LD_PRELOAD="$(gcc -print-file-name=libtsan.so)" OMP_NUM_THREADS=1
          TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 log_path=$reports/tsan")
check_build "$work/tsan" "-fsanitize=thread" "${tsan_env[@]}"
stage "loader, offload and thread tests under ThreadSanitizer"
shopt -s nullglob
tsan_tests=(tests/test_loader*.py tests/test_offload.py tests/test_checkpoint_offload.py tests/test_adamw8bit_offload.py tests/test_*thread*.py tests/test_sim_*.py tests/test_recipe_sim.py tests/test_optim_device.py)
bounded 1200 env "${tsan_env[@]}" "$py" -m pytest -q -ra -p no:cacheprovider -m "not slow and not native_only" \
    "${tsan_tests[@]}" || status=$?
fail_on_reports "ThreadSanitizer" "ThreadSanitizer"
[ "$status" -eq 0 ] || exit "$status"
echo "sanitizers: no reports"
