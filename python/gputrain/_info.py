"""gputrain.info(): what was built and what this machine offers."""

from __future__ import annotations

from gputrain import _C


def info() -> dict[str, object]:
    """Version, CUDA compiled/available, SIMD level, BLAS and thread counts, compiler flags."""
    facts = dict(_C.build_info())
    facts["cuda_available"] = facts["cuda_device_count"] > 0
    facts["cuda_runtime_version"] = _C.cuda_runtime_version()
    facts["cuda_unavailable_reason"] = _C.cuda_unavailable_reason()
    from gputrain import backends

    facts["tf32"] = backends.tf32_status()
    return facts
