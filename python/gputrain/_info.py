"""gputrain.info(): what was built and what this machine offers."""

from __future__ import annotations

from gputrain import _C


def info() -> dict[str, object]:
    """Version, CUDA compiled/available, SIMD level, BLAS and thread counts, compiler flags."""
    facts = dict(_C.build_info())
    facts["cuda_available"] = facts["cuda_device_count"] > 0
    facts["cuda_runtime_version"] = _C.cuda_runtime_version()
    facts["cuda_unavailable_reason"] = _C.cuda_unavailable_reason()
    # fp16/bf16 GEMMs on the CPU: cmeel-openblas exports no half-precision GEMM, so half inputs
    # are widened to f32 (exactly) and multiplied by sgemm, then rounded once to the half format.
    facts["cpu_half_gemm"] = "f32 sgemm on widened f16/bf16 inputs, output rounded to the half format"
    from gputrain import backends

    facts["tf32"] = backends.tf32_status()
    return facts
