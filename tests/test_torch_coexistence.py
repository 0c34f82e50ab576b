"""gputrain and PyTorch in one process, imported in either order (issue 25: with PyPI's CUDA 13
torch and a gputrain built against a system toolkit, `import gputrain, torch` failed with
"libtorch_cuda.so: undefined symbol: ncclCommResume" because gputrain linked the toolkit's older
NCCL at import). No GPU is needed: the conflict is at import.

For a side environment with torch installed (its nvidia-* wheels come with it): skipped in CI
(CI=true) and wherever torch is not importable. Each case runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.skipif(os.environ.get("CI", "").lower() in ("1", "true"),
                       reason="needs PyTorch and its CUDA wheels: run in a side environment"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

# Prints what the process maps and what each library reports; `load` says when gputrain opens its
# CUDA libraries: never, before torch is imported, or after.
CHILD = """
import json
{imports}
import gputrain, torch
x = torch.ones(4, requires_grad=True)
(x * 2).sum().backward()  # torch works
libraries = gputrain.cuda._libraries() if gputrain.info()["cuda_compiled"] and {load_after} else {{}}
with open("/proc/self/maps") as f:
    mapped = sorted({{line.split()[-1] for line in f if "/libnccl.so" in line or "/libcublas" in line}})
try:
    torch_nccl = list(torch.cuda.nccl.version())
except Exception as e:  # a CPU-only torch
    torch_nccl = str(e)
print(json.dumps({{"grad": x.grad.tolist(), "mapped": mapped, "libraries": libraries,
                  "torch_nccl": torch_nccl, "torch": torch.__version__, "torch_cuda": torch.version.cuda}}))
"""

ORDERS = {
    "gputrain first": ("import gputrain\nimport torch", True),
    "torch first": ("import torch\nimport gputrain", True),
    "gputrain's libraries opened before torch": (
        "import gputrain\nif gputrain.info()['cuda_compiled']:\n    gputrain.cuda._libraries()\nimport torch", True),
    "gputrain first, libraries never opened": ("import gputrain\nimport torch", False),
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_gputrain_and_torch_import_in_any_order(order):
    imports, load_after = ORDERS[order]
    code = CHILD.format(imports=imports, load_after=load_after)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["grad"] == [2.0] * 4
    nccls = [p for p in out["mapped"] if "/libnccl.so" in p]
    assert len({os.path.realpath(p) for p in nccls}) <= 1, nccls  # one NCCL in the process
    if out["libraries"]:
        nccl = out["libraries"]["nccl"]
        assert os.path.realpath(nccl["path"]) in {os.path.realpath(p) for p in nccls}
        if isinstance(out["torch_nccl"], list):  # the NCCL torch uses is the one gputrain opened
            major, minor, patch = out["torch_nccl"]
            assert nccl["version"] == major * 10000 + minor * 100 + patch, (nccl, out["torch_nccl"])
    print(order, json.dumps(out, indent=1))
