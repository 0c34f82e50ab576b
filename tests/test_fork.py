"""gputrain in a process forked from one that already ran it: GNU OpenMP's thread pool does not
survive fork (a team of more than one thread hangs in the child), so a forked child runs
gputrain on one thread and refuses more with a clear error. DataLoader workers are such children
with the default start method."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

import gputrain as gt

# where the gputrain under test was imported from (installed, or an in-place build's python/)
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(gt.__file__)))

TRAIN_THEN_FORK = textwrap.dedent("""
    import os, sys
    import numpy as np
    import gputrain as gt

    gt.set_num_threads(2)  # a team of threads exists before the fork
    model = gt.nn.Sequential(gt.nn.Linear(256, 512), gt.nn.ReLU(), gt.nn.Linear(512, 10))
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters()))
    x = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
    y = np.arange(256) % 10
    parent_loss = float(step(x, y).loss)
    pid = os.fork()
    if pid == 0:
        try:
            assert gt.get_num_threads() == 1, gt.get_num_threads()
            child_loss = float(step(x, y).loss)
            assert np.isfinite(child_loss) and child_loss != parent_loss
            try:
                gt.set_num_threads(2)
            except RuntimeError as error:
                assert "num_threads=2" in str(error) and "spawn" in str(error), error
            else:
                raise AssertionError("set_num_threads(2) in a forked child was accepted")
            gt.set_num_threads(1)
        except BaseException as error:
            print("child:", repr(error), flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert gt.get_num_threads() == 2  # the parent keeps its threads
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
""")


SIM_GARBAGE_THEN_FORK = textwrap.dedent("""
    import gc, os, sys
    import numpy as np
    import gputrain as gt

    loader = gt.DataLoader(np.arange(64, dtype=np.float32).reshape(16, 4), batch_size=4, device="sim")
    it = iter(loader)
    batch = next(it)           # a device batch in flight on sim's streams
    cycle = [it, batch]
    cycle.append(cycle)        # garbage the parent has not collected yet
    del it, batch, cycle
    gc.disable()
    pid = os.fork()
    if pid == 0:
        gc.collect()           # the child finalises the parent's loader: it must not wait for sim's threads
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    gc.enable()
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
""")


def run(script: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_DIR, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)


def test_a_forked_child_trains_on_one_thread_and_refuses_more():
    result = run(TRAIN_THEN_FORK)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "child exit 0" in result.stdout, result.stdout + result.stderr


class Projected(gt.data.Dataset):
    """Each sample computed with a gputrain GEMM, in the worker process."""

    def __init__(self):
        rng = np.random.default_rng(1)
        self.weight = rng.standard_normal((512, 256), dtype=np.float32)
        self.x = rng.standard_normal((8, 256, 256), dtype=np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return gt.functional.linear(self.x[i], self.weight)


def test_dataloader_workers_run_gputrain_ops_after_the_parent_did():
    dataset = Projected()
    in_parent = [dataset[i] for i in range(len(dataset))]  # the parent's OpenMP team now exists
    loader = gt.DataLoader(dataset, batch_size=2, num_workers=2, timeout=60)
    batches = [np.array(b) for b in loader]
    np.testing.assert_array_equal(np.concatenate(batches), np.stack(in_parent))


def test_a_forked_child_collects_the_parents_sim_loader_without_waiting():
    """A forked child inherits the parent's sim streams but not their threads: finalising the
    parent's garbage there (a DataLoader worker's collection did) must not wait for them."""
    result = run(SIM_GARBAGE_THEN_FORK)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "child exit 0" in result.stdout, result.stdout + result.stderr
