"""fp16 elementwise kernels convert in GT_STAGE blocks through gt_cast; a block below gt_cast's
parallel threshold must not enter an OpenMP construct (an `if (0)` region still builds a team,
nested inside the op's parallel loop). Before, a tiny fp16 GPT step entered ~15x the OpenMP
regions of the same bf16 step (9,567 against 650), which on sim, where ops run on stream
threads of a loaded machine, made fp16 steps many times slower than bf16. Counted with a
GOMP_parallel shim preloaded into a child (no timing: counts do not flake)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
unsigned long gt_test_regions;
void GOMP_parallel(void (*fn)(void *), void *data, unsigned n, unsigned flags) {
    static void (*real)(void (*)(void *), void *, unsigned, unsigned);
    if (!real) {  /* libgomp came with gputrain's module, loaded RTLD_LOCAL: not in RTLD_NEXT's scope */
        void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
        real = (void (*)(void (*)(void *), void *, unsigned, unsigned))dlsym(gomp ? gomp : RTLD_NEXT,
                                                                             "GOMP_parallel");
    }
    __atomic_add_fetch(&gt_test_regions, 1, __ATOMIC_RELAXED);
    real(fn, data, n, flags);
}
"""

CHILD = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    import gputrain as gt
    shim = ctypes.CDLL(sys.argv[1])
    counter = ctypes.c_ulong.in_dll(shim, "gt_test_regions")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 65, (8, 32)).astype(np.int64)
    y = rng.integers(0, 65, (8, 32)).astype(np.int64)
    for precision in ("bf16", "fp16"):
        gt.random.manual_seed(0)
        model = gt.models.GPT(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32)
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters()),
                            precision=precision, gradient_accumulation_steps=2,
                            scaler=gt.amp.GradScaler() if precision == "fp16" else None)
        step(x, y)
        before = counter.value
        for _ in range(3):
            step(x, y)
        print(precision, counter.value - before)
""")


# Natively only: its child runs with an LD_PRELOAD shim, which segfaulted under qemu-user in CI's
# Haswell stage and would replace the sanitizers' LD_PRELOAD.
@pytest.mark.native_only
def test_fp16_steps_enter_about_as_many_openmp_regions_as_bf16(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the counting shim")
    shim = tmp_path / "shim.so"
    (tmp_path / "shim.c").write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(shim), str(tmp_path / "shim.c"), "-ldl"], check=True)
    env = dict(os.environ, LD_PRELOAD=str(shim), OMP_NUM_THREADS="2")
    done = subprocess.run([sys.executable, "-c", CHILD, str(shim)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    counts = dict(line.split() for line in done.stdout.split("\n") if line)
    bf16, fp16 = int(counts["bf16"]), int(counts["fp16"])
    assert bf16 > 0  # the shim counts
    assert fp16 <= 2 * bf16, counts
