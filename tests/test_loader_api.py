"""The PyTorch-compatible surface of gputrain.DataLoader: argument checks worded as PyTorch's,
len(), samplers, set_epoch, collate_fn/transform hooks, worker errors and timeout."""

from __future__ import annotations

import re
import threading
import time
import warnings

import numpy as np
import pytest

import gputrain as gt
from gputrain.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler, get_worker_info

X = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
Y = np.arange(40)


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_workers=-1), "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing."),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(timeout=1.5e16), "timeout must be a finite number of seconds up to 2147483"),
    (dict(prefetch_factor=2), "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
                              "to enable multiprocessing, otherwise set prefetch_factor to None."),
    (dict(num_workers=1, prefetch_factor=-1), "prefetch_factor option should be non-negative"),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(sampler=[0, 1], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive with batch_size, "
                                              "shuffle, sampler, and drop_last"),
    (dict(batch_sampler=[[0]], shuffle=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], sampler=[0]), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching and is mutually "
                                            "exclusive with drop_last"),
    (dict(batch_size=0), "batch_size should be a positive integer value, but got batch_size=0"),
    (dict(batch_size=-3), "batch_size should be a positive integer value, but got batch_size=-3"),
    (dict(drop_last=1), "drop_last should be a boolean value, but got drop_last=1"),
    (dict(multiprocessing_context="spawn"), "multiprocessing_context can only be used with multi-process loading"),
    (dict(device="tpu"), "device must be None, 'cpu', 'cuda', 'cuda:N', 'sim' or 'sim:N'"),
])
def test_value_errors_worded_as_pytorch(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        gt.DataLoader((X, Y), **kwargs)


@pytest.mark.parametrize("data,error,message", [
    ((X, Y[:39]), ValueError, "same first dimension"),
    (np.float32(3.0), ValueError, "0-d"),
    (np.array([object(), object()]), TypeError, "Python objects"),
    ((), ValueError, "at least one array"),
    ("not data", TypeError, "must be a NumPy array"),
    ({"x": X, "y": 3}, TypeError, r"data\['y'\] must be a NumPy array"),
    ({"x": X, "y": np.array(3)}, ValueError, r"data\['y'\] is 0-d"),
])
def test_bad_data(data, error, message):
    with pytest.raises(error, match=message):
        gt.DataLoader(data)


def test_type_errors():
    with pytest.raises(TypeError, match="num_workers must be an int"):
        gt.DataLoader(X, num_workers=1.5)
    with pytest.raises(TypeError, match="collate_fn must be callable"):
        gt.DataLoader(X, collate_fn=3)
    with pytest.raises(TypeError, match="seed must be an int"):
        gt.DataLoader(X, shuffle=True, seed="0")
    with pytest.raises(TypeError, match="generator must be"):
        gt.DataLoader(X, shuffle=True, generator=42)
    with pytest.raises(TypeError, match="epoch must be an int"):
        gt.DataLoader(X).set_epoch(1.0)


def test_cuda_device_needs_a_gpu():
    if gt.cuda.is_available():
        assert gt.DataLoader(X, device="cuda").device == "cuda:0"
    else:
        with pytest.raises(gt.CudaError, match="not available"):
            gt.DataLoader(X, device="cuda")
    with pytest.raises(gt.CudaError, match="CUDA device 99 is not available"):
        gt.DataLoader(X, device="cuda:99")


def test_attributes_frozen_after_init():
    loader = gt.DataLoader((X, Y), batch_size=4)
    for name in ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"):
        with pytest.raises(ValueError, match=f"{name} attribute should not be set after DataLoader is initialized"):
            setattr(loader, name, None)
    loader.timeout = 3  # others stay settable, as in PyTorch


def test_defaults_mirror_pytorch():
    loader = gt.DataLoader((X, Y))
    assert loader.batch_size == 1 and loader.num_workers == 0 and loader.prefetch_factor is None
    assert loader.pin_memory is False and loader.drop_last is False and loader.timeout == 0
    assert loader.persistent_workers is False and loader.in_order is True
    assert isinstance(loader.sampler, SequentialSampler) and isinstance(loader.batch_sampler, BatchSampler)
    assert len(loader) == 40
    assert gt.DataLoader(X, num_workers=2).prefetch_factor == 2
    shuffled = gt.DataLoader(X, shuffle=True)
    assert isinstance(shuffled.sampler, RandomSampler)
    assert isinstance(gt.DataLoader(X, shuffle=True).seed, int)
    assert shuffled.dataset is X


def test_warns_when_workers_exceed_cpus(monkeypatch):
    monkeypatch.setattr("gputrain.data.loader._cpu_count", lambda: 2)
    with pytest.warns(UserWarning, match="This DataLoader will create 3 worker threads in total. Our suggested "
                                         "max number of worker in current system is 2"):
        gt.DataLoader(X, num_workers=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gt.DataLoader(X, num_workers=2)


def test_generator_seeds_the_order():
    a = gt.DataLoader(Y, batch_size=5, shuffle=True, generator=np.random.default_rng(7))
    b = gt.DataLoader(Y, batch_size=5, shuffle=True, generator=np.random.default_rng(7))
    assert a.seed == b.seed
    assert [x.tolist() for x in a] == [x.tolist() for x in b]

    class TorchGeneratorLike:
        def initial_seed(self):
            return 1234

    assert gt.DataLoader(Y, shuffle=True, generator=TorchGeneratorLike()).seed == 1234


def test_set_epoch_selects_the_order():
    loader = gt.DataLoader(Y, batch_size=40, shuffle=True, seed=3)
    epochs = [next(iter(loader)).tolist() for _ in range(3)]
    loader.set_epoch(1)
    assert next(iter(loader)).tolist() == epochs[1]
    assert next(iter(loader)).tolist() == epochs[2]  # then counting on from there
    assert gt.data.RandomSampler(40, seed=3).rows(2).tolist() == epochs[2]
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        loader.set_epoch(-1)


def test_set_epoch_is_forwarded_to_foreign_samplers():
    class EpochSampler:
        def __init__(self):
            self.epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            return iter([self.epoch or 0])

        def __len__(self):
            return 1

    sampler = EpochSampler()
    loader = gt.DataLoader(Y, sampler=sampler)
    loader.set_epoch(7)
    assert sampler.epoch == 7
    assert next(iter(loader)).tolist() == [7]


def test_distributed_sampler_shards_like_pytorch():
    n, replicas = 10, 3
    shards = [list(DistributedSampler(n, num_replicas=replicas, rank=r, shuffle=False)) for r in range(replicas)]
    # PyTorch: indices padded by wrapping to 12, then rank r takes indices[r::3]
    padded = list(range(n)) + list(range(2))
    assert shards == [padded[r::replicas] for r in range(replicas)]
    dropped = [list(DistributedSampler(n, num_replicas=replicas, rank=r, shuffle=False, drop_last=True))
               for r in range(replicas)]
    assert dropped == [list(range(9))[r::replicas] for r in range(replicas)]
    sampler = DistributedSampler(n, num_replicas=replicas, rank=1, seed=4)
    assert len(sampler) == 4 and sampler.total_size == 12
    loader = gt.DataLoader(Y[:n], batch_size=2, sampler=sampler, num_workers=2)
    assert len(loader) == 2
    full = np.concatenate([DistributedSampler(n, num_replicas=replicas, rank=r, seed=4).rows(0) for r in range(3)])
    assert sorted(set(full.tolist())) == list(range(n))
    assert np.concatenate(list(loader)).tolist() == sampler.rows(0).tolist()
    with pytest.raises(ValueError, match=re.escape("Invalid rank 3, rank should be in the interval [0, 2]")):
        DistributedSampler(n, num_replicas=3, rank=3)


def test_distributed_sampler_epoch_set_on_the_sampler():
    sampler = DistributedSampler(Y, num_replicas=2, rank=0, seed=1)
    loader = gt.DataLoader(Y, batch_size=20, sampler=sampler)
    sampler.set_epoch(5)
    first = next(iter(loader)).tolist()
    assert first == sampler.rows(5).tolist()
    assert next(iter(loader)).tolist() == first  # PyTorch semantics: same epoch until set again


def test_random_sampler_replacement_and_num_samples():
    sampler = RandomSampler(10, replacement=True, num_samples=1000, seed=0)
    rows = sampler.rows(0)
    assert len(sampler) == len(rows) == 1000 and rows.min() >= 0 and rows.max() < 10
    counts = np.bincount(rows, minlength=10)
    assert counts.min() > 60  # uniform draws: about 100 each
    long = RandomSampler(10, num_samples=25, seed=0).rows(0)
    assert sorted(long[:10].tolist()) == list(range(10)) and sorted(long[10:20].tolist()) == list(range(10))
    assert not np.array_equal(long[:10], long[10:20])
    with pytest.raises(ValueError, match="num_samples should be a positive integer value, but got num_samples=0"):
        RandomSampler(10, num_samples=0)
    with pytest.raises(TypeError, match="replacement should be a boolean value"):
        RandomSampler(10, replacement=1)
    assert list(RandomSampler(10, seed=1)) != list(RandomSampler(10, seed=2))
    standalone = RandomSampler(10, seed=1)
    assert list(standalone) != list(standalone)  # each iteration is a new epoch, as in PyTorch


def test_collate_fn_and_transform_run_on_the_gathered_batch():
    seen = []

    def transform(batch):
        x, y = batch
        seen.append(threading.get_ident())
        return x * 2, y

    def collate(batch):
        x, y = batch
        return {"x": x, "y": y}

    for workers in (0, 2):
        seen.clear()
        loader = gt.DataLoader((X, Y), batch_size=8, num_workers=workers, transform=transform, collate_fn=collate)
        batches = list(loader)
        assert all(isinstance(b, dict) for b in batches)
        np.testing.assert_array_equal(batches[1]["x"], X[8:16] * 2)
        assert set(seen) == {threading.get_ident()}  # in the consumer thread by default


def test_transform_in_workers_runs_in_worker_threads():
    threads, infos = set(), set()

    def transform(batch):
        threads.add(threading.get_ident())
        info = get_worker_info()
        infos.add((info.id, info.num_workers, info.seed))
        return batch[0].sum(axis=1), batch[1]

    loader = gt.DataLoader((X, Y), batch_size=4, num_workers=2, transform=transform, transform_in_workers=True,
                           seed=10)
    batches = list(loader)
    assert threading.get_ident() not in threads and len(threads) >= 1
    assert infos <= {(0, 2, 10), (1, 2, 10 + 1)}
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), X.sum(axis=1))
    assert get_worker_info() is None


def test_worker_init_fn_runs_once_per_worker():
    calls = []
    lock = threading.Lock()

    def init(worker_id):
        with lock:
            calls.append((worker_id, threading.get_ident(), get_worker_info().id))

    loader = gt.DataLoader(Y, batch_size=4, num_workers=2, worker_init_fn=init, persistent_workers=True)
    for _ in range(2):
        assert len(list(loader)) == 10
    del loader  # joins the workers: each ran worker_init_fn first (one may not have gathered at all)
    assert sorted(c[0] for c in calls) == [0, 1]
    assert all(c[0] == c[2] for c in calls) and len({c[1] for c in calls}) == 2


def bad_collate(batch):
    raise KeyError("missing-key")


def test_consumer_hook_error_keeps_its_traceback():
    loader = gt.DataLoader(Y, batch_size=4, collate_fn=bad_collate)
    with pytest.raises(KeyError, match="missing-key") as info:
        next(iter(loader))
    assert "bad_collate" in "".join(str(entry) for entry in info.traceback)


def failing_transform(batch):
    if batch[-1] >= 20:
        raise ValueError("bad batch starting at %d" % batch[0])
    return batch


def test_worker_hook_error_reraised_with_original_traceback():
    loader = gt.DataLoader(Y, batch_size=4, num_workers=2, transform=failing_transform, transform_in_workers=True)
    with pytest.raises(ValueError) as info:
        list(loader)
    message = str(info.value)
    assert message.startswith("Caught ValueError in DataLoader worker thread ")
    assert "Original Traceback (most recent call last):" in message
    assert "in failing_transform" in message and "bad batch starting at" in message


def test_worker_key_error_message_stays_readable():
    loader = gt.DataLoader(Y, batch_size=4, num_workers=1, collate_fn=bad_collate, transform_in_workers=True)
    with pytest.raises(KeyError) as info:
        next(iter(loader))
    assert "Caught KeyError" in str(info.value) and "\n" in str(info.value)


def test_worker_init_fn_error_reraised():
    def init(worker_id):
        raise RuntimeError(f"cannot open shard {worker_id}")

    loader = gt.DataLoader(Y, batch_size=4, num_workers=2, worker_init_fn=init)
    with pytest.raises(RuntimeError, match=r"Caught RuntimeError in DataLoader worker thread \d") as info:
        list(loader)
    assert "cannot open shard" in str(info.value)


def test_error_type_that_cannot_take_a_message_becomes_runtime_error():
    class Picky(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    def transform(batch):
        raise Picky(1, 2)

    loader = gt.DataLoader(Y, batch_size=4, num_workers=1, transform=transform, transform_in_workers=True)
    with pytest.raises(RuntimeError, match="Caught Picky"):
        next(iter(loader))


def test_timeout_raises_pytorch_message():
    def slow_init(worker_id):
        time.sleep(1.0)

    loader = gt.DataLoader(Y, batch_size=4, num_workers=1, worker_init_fn=slow_init, timeout=0.2)
    start = time.monotonic()
    it = iter(loader)  # dropping it waits a moment for the sleeping worker: keep it out of the measurement
    with pytest.raises(RuntimeError, match=re.escape("DataLoader timed out after 0.2 seconds")):
        next(it)
    assert time.monotonic() - start < 0.9
    with pytest.raises(StopIteration):
        next(it)  # the epoch ended with the timeout
    it.engine.engine.shutdown()  # waits for the worker: dropped, it would be detached, still in slow_init,
    # and free the engine's memory during a later test that counts allocated bytes


def test_timeout_not_hit_when_batches_arrive():
    loader = gt.DataLoader(Y, batch_size=4, num_workers=2, timeout=5)
    assert len(list(loader)) == 10


def test_iterator_len_and_repr():
    loader = gt.DataLoader(Y, batch_size=6, num_workers=1)
    it = iter(loader)
    assert len(it) == 7
    assert "batch_size=6" in repr(loader)


def test_to_device_cpu_keeps_zero_copy():
    loader = gt.DataLoader(Y, batch_size=4).to("cpu")
    assert loader.device is None
    assert isinstance(next(iter(loader)).base, gt._C._LoaderSlot)
