"""`import gputrain` stays light (docs/building.md, "Where it runs"): the optional packages and the heavy parts
of the standard library are imported where they are used, not at import. Checked by the modules
a fresh interpreter holds, not by a timing (this machine's timings are noise)."""

from __future__ import annotations

import json
import subprocess
import sys

# Each of these costs from milliseconds (socket, multiprocessing) to half a second (ml_dtypes).
NOT_AT_IMPORT = [
    "ml_dtypes", "safetensors", "pyarrow", "tqdm", "pynvml", "mpi4py", "torch", "sklearn", "PIL",
    "importlib.metadata", "multiprocessing", "socket", "subprocess", "shutil", "tempfile",
    "tokenizers", "sentencepiece", "google.protobuf",
]

CHILD = """
import json, sys
import numpy as np
import gputrain as gt
after_import = sorted(name for name in {names} if name in sys.modules)
# Using the common pieces (arrays through a loader, a training step, float16 casts) needs none of them.
x = np.ones((8, 4), np.float32)
model = gt.nn.Sequential(gt.nn.Linear(4, 3))
step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters()))
for xb, yb in gt.DataLoader((x, np.arange(8) % 3), batch_size=4):
    step(xb, yb)
gt.cast(x, "f16")
after_use = sorted(name for name in {names} if name in sys.modules)
print(json.dumps([after_import, after_use]))
"""


def test_import_and_common_use_do_not_import_heavy_modules(tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD.format(names=NOT_AT_IMPORT)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    after_import, after_use = json.loads(done.stdout.splitlines()[-1])
    assert after_import == [], f"`import gputrain` imported {after_import}"
    assert after_use == [], f"a loader, a step and a float16 cast imported {after_use}"


def test_bfloat16_still_comes_from_ml_dtypes_when_asked_for(tmp_path):
    code = ("import sys, numpy as np, gputrain as gt\n"
            "assert 'ml_dtypes' not in sys.modules\n"
            "y = gt.cast(np.ones(2, np.float32), 'bf16')\n"
            "print(y.dtype.name, 'ml_dtypes' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        assert done.stdout.split() == ["uint16", "False"]
    else:
        assert done.stdout.split() == ["bfloat16", "True"]


def test_a_failed_extension_import_preloads_the_libraries_and_retries(tmp_path):
    # The first import of gputrain._C fails as it would where the rpath finds no library; then
    # gputrain/__init__.py loads them by their wheels' file lists (_libs.preload) and tries again.
    code = """
import importlib.abc, sys, types
class FailOnce(importlib.abc.MetaPathFinder):
    failed = False
    def find_spec(self, name, path, target=None):
        if name == "gputrain._C" and not FailOnce.failed:
            FailOnce.failed = True
            raise ImportError("libdnnl.so.3: cannot open shared object file (simulated)")
        return None
sys.meta_path.insert(0, FailOnce())
calls = []
fake = types.ModuleType("gputrain._libs")
fake.preload = lambda: calls.append("preload") or []
sys.modules["gputrain._libs"] = fake
import gputrain
print(FailOnce.failed, calls, gputrain._C.__name__)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "['preload']", "gputrain._C"]
