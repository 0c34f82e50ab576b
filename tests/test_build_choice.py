"""The build's choice of CUDA source, targets and library names (_build/gputrain_cuda.py) and
info()'s warnings."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

from gputrain import _info

BUILD_DIR = pathlib.Path(__file__).resolve().parents[1] / "_build"


def load_choice_module():
    spec = importlib.util.spec_from_file_location("gputrain_cuda", BUILD_DIR / "gputrain_cuda.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("value, archs", [
    ("", ["80", "86", "89", "90"]), ("90", ["90"]), ("86,90", ["86", "90"]), (" 80 ; 90a,80", ["80", "90a"]),
    ("100", ["100"]),
])
def test_cuda_archs_from_the_environment(monkeypatch, value, archs):
    monkeypatch.setenv("GPUTRAIN_CUDA_ARCHS", value)
    assert load_choice_module().cuda_archs() == archs


@pytest.mark.parametrize("value", ["9.0", "sm_90", ",", "9", "compute_90"])
def test_cuda_archs_that_are_not_compute_capabilities_are_refused(monkeypatch, value):
    monkeypatch.setenv("GPUTRAIN_CUDA_ARCHS", value)
    with pytest.raises(RuntimeError, match="GPUTRAIN_CUDA_ARCHS=.*e.g. 90 or 86,90"):
        load_choice_module().cuda_archs()


def test_a_library_with_only_its_versioned_file_links_by_that_name(tmp_path):
    toolkit, wheel = tmp_path / "toolkit", tmp_path / "wheel"
    toolkit.mkdir(), wheel.mkdir()
    (wheel / "libcudnn.so.9").touch()
    module = load_choice_module()
    assert module.link_name([str(toolkit), str(wheel)], "cudnn", "libcudnn.so.9") == ":libcudnn.so.9"
    (toolkit / "libcudnn.so").touch()
    assert module.link_name([str(toolkit), str(wheel)], "cudnn", "libcudnn.so.9") == "cudnn"
    assert module.link_name([str(tmp_path / "none")], "nccl", "libnccl.so.2") == "nccl"  # the linker says what is missing


@pytest.mark.parametrize("switch, toolkit, driver, kind", [
    ("0", "/cuda", 13000, "none"),
    ("wheels", "/cuda", 0, "wheels"),
    ("", "/cuda", 0, "toolkit"),
    ("1", "/cuda", 0, "toolkit"),
    ("1", None, 0, "wheels"),
    ("", None, 13000, "wheels"),
    ("", None, 12040, "none"),
    ("", None, 0, "none"),
])
def test_cuda_source_choice(monkeypatch, switch, toolkit, driver, kind):
    module = load_choice_module()
    monkeypatch.setenv("GPUTRAIN_CUDA", switch)
    monkeypatch.setattr(module, "toolkit_home", lambda: toolkit)
    monkeypatch.setattr(module, "driver_cuda_version", lambda: driver)
    source = module.choose()
    assert source.kind == kind
    if driver == 12040 and kind == "none":
        assert "12.4" in source.why and "update the driver" in source.why


def test_wheel_builds_require_the_wheels_at_run_time():
    module = load_choice_module()
    names = {r.split(">")[0] for r in module.WHEELS_AT_RUN_TIME}
    assert names == {dist for dist, _ in module.WHEEL_LIBRARIES}


def base_facts(**changes):
    facts = {"machine": "x86_64", "simd_supported": "avx2", "num_threads": 2, "cpu_count": 2,
             "cuda_compiled": True, "cuda_available": True, "cuda_driver_version": 13000,
             "cuda_unavailable_reason": ""}
    facts.update(changes)
    return facts


def test_no_warnings_on_a_capable_machine(monkeypatch):
    monkeypatch.setattr(_info, "nvidia_driver_present", lambda: True)
    assert _info.warnings_for(base_facts()) == []


@pytest.mark.parametrize("changes, driver, words", [
    ({"simd_supported": "scalar"}, False, "no AVX2"),
    ({"num_threads": 8}, False, "above the 2 CPUs"),
    ({"cuda_available": False, "cuda_unavailable_reason": "the NVIDIA driver supports CUDA 12.4"},
     True, "CUDA cannot be used: the NVIDIA driver supports CUDA 12.4"),
    ({"cuda_compiled": False, "cuda_available": False}, True, "built without CUDA"),
])
def test_warnings_say_what_cannot_work(monkeypatch, changes, driver, words):
    monkeypatch.setattr(_info, "nvidia_driver_present", lambda: driver)
    notes = _info.warnings_for(base_facts(**changes))
    assert len(notes) == 1 and words in notes[0]


def test_info_names_the_cpu_and_the_loaded_libraries():
    facts = _info.info()
    assert facts["cpu_model"] and facts["machine"]
    assert facts["libraries"]["openmp"].startswith("/")
    blas_key = "onednn" if facts["blas"] == "onednn" else "openblas"
    assert os.path.exists(facts["libraries"][blas_key])
    assert isinstance(facts["warnings"], list)
