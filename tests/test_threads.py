"""Threads: a training step holds the model, optimizer and scaler it uses; any other call on
them from another thread raises "in use by another thread" instead of racing (or freeing memory
under the step), and threads sharing a DataLoader iterator each get whole batches, every batch
exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import gputrain as gt

nn = gt.nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# where the gputrain under test was imported from (installed, or an in-place build's python/)
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(gt.__file__)))
ACCUMULATION = 16  # micro-batches per step: a step long enough (~0.1-1 s) to act during it


def attempt(call, *args) -> str:
    """'ok' when call(*args) ran, 'refused' when another thread held what it needs."""
    try:
        call(*args)
    except RuntimeError as error:
        assert "in use by another thread" in str(error)
        return "refused"
    return "ok"


def make_setup(seed=0, optimizer="adamw"):
    gt.random.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
    if optimizer == "sim":  # a model on the simulated device: the optimizer over its device arenas
        model.to("sim")
        return model, gt.optim.AdamW(model.parameters(), lr=1e-3, cpu_offload_fraction=0.5)
    opt = gt.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw" else \
        gt.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt


def make_batch(seed=0):
    rng = np.random.default_rng(seed)
    rows = ACCUMULATION * 128
    return rng.standard_normal((rows, 64)).astype(np.float32), rng.integers(0, 10, rows)


def weights(model):
    return [p.data.copy() for p in model.parameters()]


def wait_until(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


class StepThread(threading.Thread):
    """Runs `call()` once; keeps its result or exception."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.result, self.error = call, None, None

    def run(self):
        try:
            self.result = self.call()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error


def during_step(step, x, y, action):
    """Runs step(x, y) in a thread and `action()` in this one while the step holds the model;
    returns (the exception action raised or None, the step's thread)."""
    thread = StepThread(lambda: step(x, y))
    thread.start()
    wait_until(lambda: step.model.compiled.busy or not thread.is_alive())
    assert thread.is_alive(), f"the step ended before the action could run: {thread.error!r}"
    raised = None
    try:
        action()
    except RuntimeError as error:
        raised = error
    still_running = thread.is_alive()
    thread.join()
    assert thread.error is None
    assert still_running, "the step ended before the action returned: lengthen it"
    return raised, thread


def not_refused(calls, message="in use by another thread"):
    """The names of the calls that did not raise RuntimeError(message)."""
    accepted = []
    for name, call in calls.items():
        try:
            call()
            accepted.append(name)
        except RuntimeError as error:
            if message not in str(error):
                accepted.append(f"{name}: {error}")
    return accepted


def serial_weights(steps, seed=0, optimizer="adamw", scaler=None):
    model, opt = make_setup(seed, optimizer)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION,
                        scaler=scaler)
    x, y = make_batch()
    for _ in range(steps):
        step(x, y)
    return weights(model)


def test_add_param_group_during_a_step_raises_and_changes_nothing():
    # Before: add_param_group replaced and freed the C optimizer the step was updating
    # (ASan: heap-use-after-free). In a subprocess, so that a crash fails this test only.
    code = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        import numpy as np, gputrain as gt
        from test_threads import make_setup, make_batch, during_step, ACCUMULATION
        model, opt = make_setup()
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION)
        x, y = make_batch()
        extra = gt.nn.Parameter(np.ones(8, np.float32))
        raised, _ = during_step(step, x, y, lambda: opt.add_param_group({{"params": [extra]}}))
        assert raised is not None and "in use by another thread" in str(raised), raised
        assert len(opt.param_groups) == 1 and opt.step_count == 1
        step(x, y)  # the optimizer is usable after the refusal
        assert opt.step_count == 2
        opt.add_param_group({{"params": [extra]}})  # and takes the group once no step runs
        assert len(opt.param_groups) == 2
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PACKAGE_DIR, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_same_train_step_from_two_threads_equals_serial_steps():
    # Before: both steps ran at once on one model and optimizer (max weight diff 0.27 vs serial).
    model, opt = make_setup()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION)
    x, y = make_batch()
    barrier = threading.Barrier(2)
    outcomes = []

    def worker():
        barrier.wait()
        for _ in range(2):
            outcomes.append(attempt(step, x, y))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = outcomes.count("ok")
    assert done >= 1 and len(outcomes) == 4
    assert opt.step_count == done == model.compiled.step
    for got, want in zip(weights(model), serial_weights(done)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("optimizer", ["adamw", "sim"])
def test_a_second_call_during_a_step_raises_and_the_step_is_exact(optimizer):
    model, opt = make_setup(optimizer=optimizer)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION)
    x, y = make_batch()
    calls = {"step": lambda: step(x, y), "push_hyperparameters": opt.push_hyperparameters}
    if optimizer == "sim":
        calls["state_dict"] = opt.state_dict
    accepted = []
    during_step(step, x, y, lambda: accepted.extend(not_refused(calls)))
    assert accepted == []
    for got, want in zip(weights(model), serial_weights(1, optimizer=optimizer)):
        np.testing.assert_array_equal(got, want)


def test_optimizer_step_during_a_train_step_raises():
    model, opt = make_setup(optimizer="sgd")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION)
    x, y = make_batch()
    raised, _ = during_step(step, x, y, opt.step)
    assert raised is not None and "in use by another thread" in str(raised)
    assert opt.step_count == 1
    for got, want in zip(weights(model), serial_weights(1, optimizer="sgd")):
        np.testing.assert_array_equal(got, want)


def test_a_train_step_during_an_optimizer_step_raises():
    # optimizer.step() holds the optimizer and the model its parameters live in: whichever of
    # the two calls comes second refuses; nothing runs concurrently, nothing is lost.
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.Linear(4096, 2))
    opt = gt.optim.AdamW(model.parameters(), lr=1e-3)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt)
    x, y = np.ones((2, 4096), np.float32), np.array([0, 1])
    step(x, y)
    outcomes = []

    def optimizer_steps():
        for _ in range(3):
            outcomes.append(attempt(opt.step))

    holder = StepThread(optimizer_steps)
    holder.start()
    wait_until(lambda: model.compiled.busy or not holder.is_alive())
    outcomes.append(attempt(step, x, y))
    holder.join()
    assert holder.error is None
    assert "refused" in outcomes
    assert opt.step_count == 1 + outcomes.count("ok")


def test_model_and_ema_calls_during_a_step_raise():
    model, opt = make_setup()
    ema = gt.optim.EMA(model, decay=0.9)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION)
    x, y = make_batch()
    calls = {
        "forward": lambda: model(x[:4]),
        "zero_grad": lambda: model.zero_grad(set_to_none=False),
        "eval": model.eval,
        "ema.update": ema.update,
        "optimizer.state_dict": opt.state_dict,
    }
    accepted = []
    during_step(step, x, y, lambda: accepted.extend(not_refused(calls)))
    assert accepted == []
    assert model.training and model.compiled.training
    assert ema.num_updates == 0
    for got, want in zip(weights(model), serial_weights(1)):
        np.testing.assert_array_equal(got, want)


def test_scaler_changes_during_a_step_raise():
    model, opt = make_setup()
    scaler = gt.amp.GradScaler(init_scale=256.0)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION,
                        scaler=scaler)
    x, y = make_batch()
    calls = {"update": lambda: scaler.update(8.0), "set_growth_factor": lambda: scaler.set_growth_factor(4.0),
             "load_state_dict": lambda: scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0})}
    accepted = []
    during_step(step, x, y, lambda: accepted.extend(not_refused(calls, "GradScaler is in use")))
    assert accepted == []
    assert scaler.get_scale() == 256.0 and scaler.get_growth_factor() == 2.0
    scaler.update(8.0)  # allowed again once no step runs
    assert scaler.get_scale() == 8.0


def test_scaler_reads_during_a_step_raise():
    # Before: these read the scale, tracker and counters while the step thread wrote them without
    # the GIL (ThreadSanitizer: a data race in _configure and every getter). Now each is refused
    # like the optimizer's state_dict; the settings a step only reads stay readable.
    model, opt = make_setup()
    scaler = gt.amp.GradScaler(init_scale=256.0)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=ACCUMULATION,
                        scaler=scaler)
    x, y = make_batch()
    grad = np.ones(8, np.float32)
    calls = {"get_scale": scaler.get_scale, "state_dict": scaler.state_dict,
             "skipped_steps": lambda: scaler.skipped_steps,
             "consecutive_skipped_steps": lambda: scaler.consecutive_skipped_steps,
             "growth_tracker": scaler._get_growth_tracker, "inv_scale": lambda: scaler._inv_scale,
             "scale": lambda: scaler.scale(np.float32(1.0)), "unscale_arrays": lambda: scaler.unscale_arrays([grad]),
             "pickle": scaler.__getstate__, "set_growth_interval": lambda: scaler.set_growth_interval(5),
             "__init__": lambda: gt.amp.GradScaler.__init__(scaler, init_scale=2.0)}
    accepted, readable = [], []
    during_step(step, x, y, lambda: (accepted.extend(not_refused(calls, "GradScaler is in use")),
                                     readable.append((scaler.get_growth_factor(), scaler.get_growth_interval(),
                                                      repr(scaler)))))
    assert accepted == []
    assert readable == [(2.0, 2000, "GradScaler(in use by another thread)")]
    np.testing.assert_array_equal(grad, 1.0)
    assert scaler.state_dict()["scale"] == 256.0 and scaler.skipped_steps == 0


def test_scaler_configure_keeps_a_step_run_while_reading_its_arguments():
    # Before: _configure copied the state, then read its arguments (Python code, here a whole
    # step), then stored the stale copy: the step's growth of the scale was undone.
    model, opt = make_setup()
    scaler = gt.amp.GradScaler(init_scale=256.0, growth_interval=1)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=2, scaler=scaler)
    x, y = make_batch()

    class StepsWhenRead:
        def __float__(self):
            step(x[:256], y[:256])
            return 4.0

    scaler._configure(growth_factor=StepsWhenRead())
    assert scaler.get_growth_factor() == 4.0
    assert scaler.get_scale() == 512.0  # the step's growth (256 * 2), kept


def loader_rows(features=8192, rows=1024):
    """Row i holds i in every column, and its label is i: a torn or repeated row shows."""
    x = np.repeat(np.arange(rows, dtype=np.float32)[:, None], features, axis=1)
    return x, np.arange(rows, dtype=np.int64)


def check_batches(batches, rows, batch_size):
    seen = []
    for xb, yb in batches:
        assert xb.shape[0] == yb.shape[0] == batch_size
        assert np.array_equal(xb, np.repeat(yb.astype(np.float32)[:, None], xb.shape[1], axis=1)), "torn batch"
        seen.extend(yb.tolist())
    assert sorted(seen) == list(range(rows)), "missing or repeated samples"


def consume_in_threads(next_batch, count=4):
    """Calls next_batch() in `count` threads at once until it returns None; the batches' copies."""
    barrier = threading.Barrier(count)
    got, errors = [], []

    def consume():
        barrier.wait()
        try:
            while (batch := next_batch()) is not None:
                got.append(tuple(array.copy() for array in batch))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=consume) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return got


@pytest.mark.parametrize("num_workers", [0, 2])
def test_threads_sharing_a_loader_iterator_get_each_batch_once_and_whole(num_workers):
    # Before (num_workers=0): threads gathered into one row buffer at once and got duplicated,
    # missing and torn batches. Several epochs: one overlap anywhere fails.
    x, y = loader_rows()
    loader = gt.DataLoader((x, y), batch_size=64, shuffle=True, num_workers=num_workers, seed=3)
    for _ in range(4):
        iterator = iter(loader)
        check_batches(consume_in_threads(lambda: next(iterator, None)), len(y), 64)


def test_threads_sharing_an_iterator_count_progress_once():
    # state_dict() mid-epoch after 4 threads took 3 batches each: a resumed loader yields
    # exactly the other batches.
    x, y = loader_rows(features=64)
    loader = gt.DataLoader((x, y), batch_size=32, shuffle=True, num_workers=0, seed=5)
    iterator = iter(loader)
    taken = []
    barrier = threading.Barrier(4)

    def take_three():
        barrier.wait()
        for _ in range(3):
            taken.append(tuple(a.copy() for a in next(iterator)))

    threads = [threading.Thread(target=take_three) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = loader.state_dict()
    assert state["batches_yielded"] == 12
    resumed = gt.DataLoader((x, y), batch_size=32, shuffle=True, num_workers=0, seed=5)
    resumed.load_state_dict(state)
    rest = [tuple(a.copy() for a in batch) for batch in resumed]
    check_batches(taken + rest, len(y), 32)


def test_threads_calling_the_engine_directly_take_turns():
    # The C engine itself (no Python lock): callers gathering with num_workers=0 take turns.
    x, y = loader_rows()
    loader = gt.DataLoader((x, y), batch_size=64, shuffle=True, num_workers=0, seed=4)
    for _ in range(4):
        engine = iter(loader).engine.engine

        def next_batch():
            item = engine.next(0.0)
            return None if item is None else item[1]

        check_batches(consume_in_threads(next_batch), len(y), 64)
