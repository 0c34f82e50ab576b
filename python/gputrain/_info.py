"""gputrain.info(): what was built, what this machine offers, and what cannot work here."""

from __future__ import annotations

import ctypes
import platform
import re

from gputrain import _C

# Shared libraries whose loaded copy info() reports (file name pattern -> key); NumPy's own
# OpenBLAS (libscipy_openblas64_-<hash>.so) is not gputrain's and does not match. A repaired wheel
# (auditwheel) carries its libgomp as gputrain.libs/libgomp-<hash>.so.1 (other packages' hashed
# copies are not gputrain's). Patterns are searched in the whole path.
_LIBRARIES = {r"/libdnnl\.so": "onednn", r"/libscipy_openblas\.so$": "openblas",
              r"/libgomp\.so|/gputrain\.libs/libgomp-[0-9a-f]+\.so": "openmp", r"/libcudart\.so": "cudart",
              r"/libcublasLt\.so": "cublasLt", r"/libcublas\.so": "cublas",
              r"/libcudnn\.so": "cudnn", r"/libnccl\.so": "nccl"}


def cpu_model() -> str:
    """The CPU's name as the kernel reports it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loaded_libraries() -> dict[str, str]:
    """Where each shared library gputrain uses was loaded from, in this process (the CUDA
    libraries appear once used: they are opened when first needed, the runtime is static)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return found
    for path in sorted(paths):
        for pattern, key in _LIBRARIES.items():
            if re.search(pattern, path) and key not in found:
                found[key] = path
    return found


def version_text(version: int) -> str:
    """A CUDA version number (12040) as text ("12.4"); "none" for 0."""
    return f"{version // 1000}.{version % 1000 // 10}" if version else "none"


def nvidia_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def warnings_for(facts: dict[str, object]) -> list[str]:
    """Plain statements of what cannot work, or works slowly, on this machine."""
    notes = []
    if facts["machine"] == "x86_64" and facts["simd_supported"] == "scalar":
        notes.append("this CPU has no AVX2/FMA/F16C: gputrain's elementwise kernels run portable "
                     "code (same results, slower)")
    if facts["num_threads"] > facts["cpu_count"]:
        notes.append(f"num_threads ({facts['num_threads']}) is above the {facts['cpu_count']} CPUs "
                     "this process may use: threads will wait for each other")
    if facts["cuda_compiled"] and not facts["cuda_available"] and facts["cuda_driver_version"]:
        notes.append(f"CUDA cannot be used: {facts['cuda_unavailable_reason']}")
    if not facts["cuda_compiled"] and nvidia_driver_present():
        notes.append("an NVIDIA driver is present but gputrain was built without CUDA: reinstall "
                     "with a CUDA toolkit on PATH, or with GPUTRAIN_CUDA=wheels to build from "
                     "NVIDIA's registry wheels")
    return notes


def precision_note(precision: str, native: tuple[str, ...]) -> str:
    """On the CPU: "" when `precision`'s GEMMs run natively here (``info()["cpu_native_gemm"]``),
    else that they are widened to f32 and which precision trains faster on this machine (measured:
    benchmarks/README.md, a widened half step is slower than fp32's)."""
    if precision == "fp32" or precision in native:
        return ""
    reason = "no AVX512_BF16 or AMX" if precision == "bf16" else "gputrain has no native f16 CPU GEMM"
    faster = "bf16 (native here)" if "bf16" in native else "fp32"
    return f"{precision} GEMMs are widened to f32 on this CPU ({reason}): {faster} trains faster here"


def info() -> dict[str, object]:
    """Version; CPU, SIMD level and GEMM library; CUDA compiled/available with the runtime and
    driver versions; the libraries loaded and where from; threads; compiler flags; warnings."""
    facts = dict(_C.build_info())
    facts["machine"] = platform.machine()
    facts["cpu_model"] = cpu_model()
    facts["cuda_available"] = facts["cuda_device_count"] > 0
    facts["cuda_runtime_version"] = _C.cuda_runtime_version()
    facts["cuda_driver_version"] = _C.cuda_driver_version()
    facts["cuda_unavailable_reason"] = _C.cuda_unavailable_reason()
    facts["libraries"] = loaded_libraries()
    from gputrain import backends

    facts["tf32"] = backends.tf32_status()
    facts["warnings"] = warnings_for(facts)
    return facts
