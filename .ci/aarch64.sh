#!/usr/bin/env bash
# Every C file of csrc/ compiles for aarch64 with Debian's cross compiler, with setup.py's flags
# and -Werror (the x86 SIMD variants are compiled out there: core/simd.h), and the objects link
# into _C.so against the aarch64 OpenBLAS of scipy-openblas32, the library setup.py uses off
# x86-64; every symbol the extension needs is then found in that OpenBLAS, the C library, libm
# and libgomp, or is CPython's. cpu_blas_onednn.c is left out: oneDNN is the x86-64 library.
# Then the conversions and a GEMM of the aarch64 build run under qemu-aarch64 (qemu-user) and
# are compared with the installed x86-64 gputrain (.ci/aarch64_smoke.c, .ci/aarch64_check.py).
# Uses the Python of the caller (NumPy installed) for the Python and NumPy headers: x86-64 Linux
# and aarch64 Linux are both LP64, so the same pyconfig.h and numpyconfig.h hold.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cc=aarch64-linux-gnu-gcc
if ! command -v "$cc" >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null; }
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the wheel pip would pick on a current aarch64 Linux (glibc 2.28 or newer)
python -m pip download --quiet --no-deps --platform manylinux2014_aarch64 \
    --platform manylinux_2_28_aarch64 --only-binary=:all: --dest "$work" scipy-openblas32
python -m zipfile -e "$work"/scipy_openblas32-*.whl "$work/wheel"
openblas=$work/wheel/scipy_openblas32

# setup.py's C flags (read from its source, not run), plus -Werror and what setuptools adds
mapfile -t flags < <(python - <<'PY'
import ast
tree = ast.parse(open("setup.py").read())
for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "C_FLAGS":
        print(*ast.literal_eval(node.value), sep="\n")
PY
)
[ "${#flags[@]}" -gt 0 ] || { echo "C_FLAGS not found in setup.py"; exit 1; }
includes=$(python -c 'import numpy, sysconfig
print(sysconfig.get_paths()["include"], numpy.get_include())')

objects=() testing=()  # _C's objects; gputrain._C_testing's own (csrc/py_testing/)
for source in $(find csrc -name '*.c' ! -name cpu_blas_onednn.c | sort); do
    object=$work/obj/${source//\//_}.o
    mkdir -p "$work/obj"
    "$cc" "${flags[@]}" -Werror -fPIC -D_GNU_SOURCE '-DGT_VERSION="aarch64-check"' \
        -Icsrc -Icuda $(printf -- '-I%s ' $includes) "-I$openblas/include" -c "$source" -o "$object"
    case $source in
        csrc/py_testing/*) testing+=("$object") ;;
        *) objects+=("$object") ;;
    esac
done
"$cc" -shared -fopenmp -o "$work/_C.so" "${objects[@]}" "-L$openblas/lib" -lscipy_openblas -lm
# the test-only extension links as setup.py links it: its files and _C's objects but module.c's
mapfile -t core < <(printf '%s\n' "${objects[@]}" | grep -v '/csrc_py_module\.c\.o$')
"$cc" -shared -fopenmp -o "$work/_C_testing.so" "${testing[@]}" "${core[@]}" "-L$openblas/lib" -lscipy_openblas -lm

# the extension's undefined symbols, less those its libraries define, must all be CPython's
sysroot=/usr/aarch64-linux-gnu/lib
nm_=aarch64-linux-gnu-nm
"$nm_" -D --undefined-only "$work/_C.so" | awk '{print $2}' | sed 's/@.*//' |
    sort -u >"$work/needed"
for lib in "$openblas/lib/libscipy_openblas.so" "$sysroot/libc.so.6" "$sysroot/libm.so.6" \
    "$sysroot/libgomp.so.1"; do
    "$nm_" -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//'
done | sort -u >"$work/defined"
missing=$(comm -23 "$work/needed" "$work/defined" |
    grep -Ev '^_?Py|^__gmon_start__$|^_ITM_|^__cxa_finalize$' || true)
if [ -n "$missing" ]; then
    echo "aarch64: symbols no library provides:"
    echo "$missing"
    exit 1
fi
# run: conversions and a GEMM of the aarch64 build under qemu, compared with this x86-64 build
smoke=(csrc/core/cast.c csrc/core/cast_x86.c csrc/core/simd.c csrc/core/status.c csrc/core/tensor.c
       csrc/ops/cpu_gemm_split.c csrc/ops/cpu_blas_openblas.c .ci/aarch64_smoke.c)
"$cc" "${flags[@]}" -Werror -ffunction-sections -Wl,--gc-sections -D_GNU_SOURCE -Icsrc \
    "-I$openblas/include" "${smoke[@]}" "-L$openblas/lib" -lscipy_openblas \
    "-Wl,-rpath,$openblas/lib" -lm -o "$work/smoke"
# On qemu's default CPU ("max", with SME) OpenBLAS 0.3.34 picks its armv9sme kernel, whose sgemm
# came out wrong there (relative error 0.63; whether qemu's SME or the kernel is at fault is not
# known): the smoke runs on a Neoverse N1, the common aarch64 server core.
QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64 -cpu neoverse-n1 "$work/smoke" "$work/smoke.out"
(cd /tmp && python "$root/.ci/aarch64_check.py" "$work/smoke.out")

wheel=$(basename "$work"/scipy_openblas32-*.whl)
echo "aarch64: $(( ${#objects[@]} + ${#testing[@]} )) C files compiled with -Werror; _C.so and _C_testing.so link against $wheel"
