"""No CUDA library is loaded until it is needed (issue 25: a process with PyTorch must be able to
import gputrain first). The CUDA runtime is linked statically; cuBLAS(Lt), cuDNN and NCCL are opened
with dlopen on first use (cuda/cuda_libs.cu), found by cuda.pathfinder (gputrain/_cuda_libs.py).
Each check runs in a fresh interpreter, whose /proc/self/maps says what was loaded."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import gputrain

CUDA_LIBRARY = re.compile(r"/lib(cudart|cublas|cublasLt|cudnn[a-z_]*|nccl)\.so[.0-9]*$")
CUDA_COMPILED = bool(gputrain.info()["cuda_compiled"])
needs_cuda_build = pytest.mark.skipif(not CUDA_COMPILED, reason="gputrain was built without CUDA")

# Prepended to each child's code: mapped_cuda() lists the CUDA libraries the process maps.
PRELUDE = textwrap.dedent("""
    import json, re
    def mapped_cuda():
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
        return sorted(p for p in paths if re.search(%r, p))
    """ % CUDA_LIBRARY.pattern)


def run_child(code: str, env: dict[str, str] | None = None) -> dict:
    """Runs PRELUDE + `code` in a new interpreter; returns the JSON its last line prints."""
    result = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=120, env=env, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_and_cpu_training_load_no_cuda_library():
    out = run_child("""
        import numpy as np
        import gputrain as gt
        after_import = mapped_cuda()
        rng = np.random.default_rng(0)
        mlp = gt.nn.Sequential(gt.nn.Linear(8, 16), gt.nn.ReLU(), gt.nn.Linear(16, 3))
        step = gt.TrainStep(mlp, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(mlp.parameters(), lr=1e-2))
        x, y = rng.standard_normal((32, 8), dtype=np.float32), np.arange(32) % 3
        losses = [float(step(x, y).loss) for _ in range(20)]
        cnn = gt.nn.Sequential(gt.nn.Conv2d(1, 4, 3, padding=1), gt.nn.ReLU(), gt.nn.Flatten(),
                               gt.nn.Linear(4 * 6 * 6, 3))
        conv_step = gt.TrainStep(cnn, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(cnn.parameters()))
        conv_loss = float(conv_step(rng.standard_normal((8, 1, 6, 6), dtype=np.float32), np.arange(8) % 3).loss)
        print(json.dumps({"after_import": after_import, "after_training": mapped_cuda(),
                          "losses": [losses[0], losses[-1]], "conv_loss": conv_loss}))
        """)
    assert out["after_import"] == []
    assert out["after_training"] == []
    assert out["losses"][1] < out["losses"][0]  # it trained
    assert out["conv_loss"] == out["conv_loss"]  # a number, not NaN


def test_info_reports_cuda_without_loading_the_libraries():
    out = run_child("""
        import contextlib, io, runpy
        import gputrain as gt
        facts = gt.info()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            runpy.run_module("gputrain", run_name="__main__")
        print(json.dumps({"compiled": facts["cuda_compiled"], "available": facts["cuda_available"],
                          "reason": facts["cuda_unavailable_reason"], "tf32": facts["tf32"],
                          "libraries": facts["libraries"], "printed": printed.getvalue(),
                          "mapped": mapped_cuda()}))
        """)
    assert out["compiled"] == CUDA_COMPILED
    assert re.search(rf"cuda_compiled: {CUDA_COMPILED}\b", out["printed"])
    if CUDA_COMPILED and not out["available"]:
        assert out["reason"] and f"cuda_unavailable_reason: {out['reason']}" in out["printed"]
        # the CUDA backend reports why it cannot run without opening cuBLAS, cuDNN or NCCL
        assert out["mapped"] == [], out["mapped"]
        assert not {"cudart", "cublas", "cublasLt", "cudnn", "nccl"} & set(out["libraries"])


@needs_cuda_build
def test_libraries_are_found_loaded_and_version_checked_without_a_gpu():
    out = run_child("""
        import gputrain as gt
        before = gt.cuda._libraries(load=False)
        mapped_before = mapped_cuda()
        libraries = gt.cuda._libraries()
        print(json.dumps({"before": before, "mapped_before": mapped_before, "libraries": libraries,
                          "again": gt.cuda._libraries(), "mapped": mapped_cuda(),
                          "cudnn": gt.backends.cudnn.version(), "info": gt.info()["libraries"]}))
        """)
    assert set(out["libraries"]) == {"cublasLt", "cublas", "cudnn", "nccl"}
    assert not any(lib["loaded"] for lib in out["before"].values()) and out["mapped_before"] == []
    mapped = {os.path.realpath(p) for p in out["mapped"]}
    for name, lib in out["libraries"].items():
        assert lib["loaded"], name
        assert os.path.realpath(lib["path"]) in mapped, (name, lib["path"], mapped)
        assert lib["min_version"] <= lib["version"] < (lib["min_version"] // 10000 + 1) * 10000, (name, lib)
        assert lib["built_with"] // 10000 == lib["version"] // 10000, (name, lib)  # same major
    assert out["again"] == out["libraries"]  # loaded once
    assert out["cudnn"] == out["libraries"]["cudnn"]["version"]
    assert {"cublas", "cublasLt", "cudnn", "nccl"} <= set(out["info"])
    assert not any(re.search(r"/libcudart\.so", p) for p in out["mapped"])  # the runtime is static


@needs_cuda_build
def test_a_cuda_build_requires_cuda_pathfinder():
    try:
        requirements = importlib.metadata.requires("gputrain") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gputrain is imported from a build tree, not installed")
    assert any(re.match(r"cuda-pathfinder\b", r) for r in requirements), requirements


def test_the_extension_links_no_cuda_library():
    ldd = shutil.which("ldd")
    if ldd is None:
        pytest.skip("no ldd")
    linked = subprocess.run([ldd, gputrain._C.__file__], capture_output=True, text=True, check=True).stdout
    assert not [line for line in linked.splitlines() if CUDA_LIBRARY.search(line.split(" (")[0].split()[-1])], linked


# A stand-in for libnccl.so.2 (its soname) that exports every function the backend reads; its
# ncclGetVersion says VERSION. Loaded into the process first, it must be the copy chosen.
FAKE_NCCL = """
int ncclGetVersion(int *v) { *v = VERSION; return 0; }
const char *ncclGetErrorString(int r) { return "fake"; }
%s
"""
NCCL_FUNCTIONS = ["ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclCommAbort",
                  "ncclCommGetAsyncError", "ncclGroupStart", "ncclGroupEnd", "ncclSend", "ncclRecv",
                  "ncclBroadcast"]


def fake_nccl(tmp_path, version: int, leave_out: str = "") -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in library")
    body = "\n".join(f"int {name}(void) {{ return 1; }}" for name in NCCL_FUNCTIONS if name != leave_out)
    source = tmp_path / "fake_nccl.c"
    source.write_text(FAKE_NCCL % body)
    library = tmp_path / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", f"-DVERSION={version}", "-Wl,-soname,libnccl.so.2",
                    str(source), "-o", str(library)], check=True)
    return str(library)


def load_nccl_with(library: str) -> dict:
    return run_child(f"""
        import ctypes
        ctypes.CDLL({library!r})  # already in the process: preferred to any other copy
        import gputrain as gt
        try:
            gt.cuda._libraries()
            error = None
        except gt.CudaError as e:
            error = str(e)
        print(json.dumps({{"error": error, "nccl": gt.cuda._libraries(load=False)["nccl"]}}))
        """)


@needs_cuda_build
def test_a_copy_already_loaded_is_used(tmp_path):
    out = load_nccl_with(fake_nccl(tmp_path, 23001))
    assert out["error"] is None
    assert out["nccl"]["loaded"] and out["nccl"]["version"] == 23001
    assert os.path.realpath(out["nccl"]["path"]) == os.path.realpath(tmp_path / "libnccl.so.2")


@needs_cuda_build
def test_a_copy_of_the_wrong_version_is_refused_by_name(tmp_path):
    out = load_nccl_with(fake_nccl(tmp_path, 21805))
    assert not out["nccl"]["loaded"]
    assert re.search(r"NCCL 2\.18\.5 at .*libnccl\.so\.2 cannot be used: gputrain needs NCCL >= 2\.27\.0 "
                     r"and < 3 \(built with 2\.\d+\.\d+\)", out["error"]), out["error"]


@needs_cuda_build
def test_a_copy_without_a_needed_function_is_refused_by_name(tmp_path):
    out = load_nccl_with(fake_nccl(tmp_path, 23001, leave_out="ncclCommAbort"))
    assert not out["nccl"]["loaded"]
    assert "has no function ncclCommAbort" in out["error"], out["error"]


def test_libraries_argument_is_checked():
    with pytest.raises(TypeError, match="load must be a bool"):
        gputrain.cuda._libraries(load=1)
