"""Dataset objects through gputrain.DataLoader: PyTorch's map-style and iterable protocols, the
collate_fn protocol and the NumPy default_collate, worker processes with shared-memory slots
giving the same batches as num_workers=0, and mid-epoch resume."""

from __future__ import annotations

import collections
import copy
import gc
import multiprocessing
import os
import pickle
import threading
import warnings
from multiprocessing import shared_memory

import numpy as np
import pytest

import gputrain as gt
from gputrain.data import Padded, default_collate, get_worker_info, pad_collate
from gputrain.data._shm import SlotRing, SlotWriter, segment_prefix

nn = gt.nn


class TorchStyleDataset:
    """Stands in for a torch.utils.data.Dataset subclass (torch is not imported)."""

    def __init__(self, n=100, seed=0):
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((n, 10)).astype(np.float32)
        self.y = ((self.x[:, 0] > 0).astype(np.int64) + (self.x[:, 1] > 0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index] * 1.0, int(self.y[index])


class Records(gt.data.Dataset):
    """Dicts with an array, a scalar, a ragged sequence and a string."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"x": np.full((3,), i, np.float32), "label": i % 3, "tokens": np.arange(i % 7 + 1, dtype=np.int32),
                "name": f"r{i}"}


class Stream(gt.data.IterableDataset):
    """range(n) sharded over the workers as PyTorch's documentation shows."""

    def __init__(self, n=50):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield np.array([i, i * i], np.int64)


def copied(batch):
    """A batch's arrays copied (batches of a slot may be reused once dropped)."""
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, dict):
        return {k: copied(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(copied(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(copied(v) for v in batch)
    return batch


def same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def epoch(loader):
    return [copied(b) for b in loader]


# ---- default_collate ---------------------------------------------------------------------------

def test_default_collate_stacks_each_leaf():
    Point = collections.namedtuple("Point", "a b")
    samples = [{"x": np.ones((2, 3), np.float32) * i, "i": i, "f": i / 2, "ok": i > 0, "s": f"s{i}",
                "pair": (np.int16(i), [i, -i]), "p": Point(i, np.float32(i))} for i in range(4)]
    batch = default_collate(samples)
    assert batch["x"].shape == (4, 2, 3) and batch["x"].dtype == np.float32
    assert np.array_equal(batch["x"][:, 0, 0], [0, 1, 2, 3])
    assert batch["i"].dtype == np.int64 and batch["f"].dtype == np.float64 and batch["ok"].dtype == np.bool_
    assert batch["s"] == ["s0", "s1", "s2", "s3"]
    assert isinstance(batch["pair"], tuple) and batch["pair"][0].dtype == np.int16
    assert isinstance(batch["pair"][1], list) and np.array_equal(batch["pair"][1][1], [0, -1, -2, -3])
    assert isinstance(batch["p"], Point) and batch["p"].b.dtype == np.float32


def test_ragged_arrays_are_padded_with_lengths():
    samples = [np.arange(n, dtype=np.int32).reshape(n, 1) + 1 for n in (3, 1, 2)]
    values, lengths = default_collate(samples)
    assert values.shape == (3, 3, 1) and values.dtype == np.int32 and lengths.dtype == np.int64
    assert np.array_equal(values[:, :, 0], [[1, 2, 3], [1, 0, 0], [1, 2, 0]])
    assert np.array_equal(lengths, [3, 1, 2])
    equal = default_collate([np.zeros(2), np.ones(2)])
    assert isinstance(equal, np.ndarray) and equal.shape == (2, 2)
    padded = pad_collate([np.zeros(2), np.ones(2)])
    assert isinstance(padded, Padded) and np.array_equal(padded.lengths, [2, 2])


@pytest.mark.parametrize("samples,error,message", [
    ([None, None], TypeError, "found NoneType"),
    ([[1, 2], [1]], RuntimeError, "equal size"),
    ([np.zeros((2, 3)), np.zeros((2, 4))], RuntimeError, "same shape"),
    ([], ValueError, "non-empty"),
])
def test_default_collate_errors(samples, error, message):
    with pytest.raises(error, match=message):
        default_collate(samples)


# ---- map-style datasets --------------------------------------------------------------------------

@pytest.mark.parametrize("options", [dict(), dict(shuffle=True), dict(shuffle=True, drop_last=True),
                                     dict(batch_size=None)])
def test_workers_give_the_batches_of_num_workers_0(options):
    options = dict(dict(batch_size=5, seed=4), **options)
    reference = epoch(gt.DataLoader(Records(), **options))
    assert len(reference) == len(gt.DataLoader(Records(), **options))
    for num_workers, prefetch in [(1, 1), (2, 3)]:
        got = epoch(gt.DataLoader(Records(), num_workers=num_workers, prefetch_factor=prefetch, **options))
        assert same(reference, got), (num_workers, prefetch)


def test_batches_held_by_the_caller_are_not_overwritten():
    loader = gt.DataLoader(Records(), batch_size=4, num_workers=2, prefetch_factor=1)
    held = list(loader)  # no copies: every batch keeps its slot
    assert same([copied(b) for b in held], epoch(gt.DataLoader(Records(), batch_size=4)))


def test_collate_fn_receives_the_list_of_samples():
    def collate(samples):
        assert isinstance(samples, list) and all(isinstance(s, dict) for s in samples)
        return {"sum": np.stack([s["x"] for s in samples]).sum(0), "names": "".join(s["name"] for s in samples),
                "count": len(samples)}

    reference = epoch(gt.DataLoader(Records(), batch_size=6, collate_fn=collate))
    assert reference[0]["names"] == "r0r1r2r3r4r5" and reference[-1]["count"] == 1
    assert same(reference, epoch(gt.DataLoader(Records(), batch_size=6, collate_fn=collate, num_workers=2)))


def test_out_of_order_delivery_and_transform():
    reference = epoch(gt.DataLoader(Records(), batch_size=4, transform=lambda b: b["x"] * 2))
    loader = gt.DataLoader(Records(), batch_size=4, num_workers=2, in_order=False, transform=lambda b: b["x"] * 2)
    got = epoch(loader)
    assert sorted(b[0, 0] for b in got) == sorted(b[0, 0] for b in reference)
    assert same(sorted(got, key=lambda b: b[0, 0]), sorted(reference, key=lambda b: b[0, 0]))
    assert loader.state_dict()["epoch"] == 1


def test_bad_multiprocessing_context_fails_at_construction():
    with pytest.raises(TypeError, match="multiprocessing_context must be"):
        gt.DataLoader(Records(), num_workers=2, multiprocessing_context=3)
    with pytest.raises(ValueError, match="cannot find context"):
        gt.DataLoader(Records(), num_workers=2, multiprocessing_context="threads")


def test_plain_list_of_samples_and_batch_sampler():
    data = [(np.float32(i), i) for i in range(10)]
    batches = [[0, 9], [3], [4, 5, 6]]
    for num_workers in (0, 2):
        got = epoch(gt.DataLoader(data, batch_sampler=batches, num_workers=num_workers))
        assert [b[1].tolist() for b in got] == batches


def test_getitems_fetches_a_batch_at_once():
    class Batched(Records):
        def __getitems__(self, indices):
            return [dict(self[i], x=self[i]["x"] + 100) for i in indices]

    got = epoch(gt.DataLoader(Batched(), batch_size=4, num_workers=2))
    assert np.array_equal(got[0]["x"][:, 0], [100, 101, 102, 103])


def test_a_finished_epoch_leaves_no_thread_behind():
    """The task queues' feeder threads are gone, not only told to stop, when an epoch's workers
    are: a thread still exiting while the next epoch forks its workers can leave a child's
    allocator locked (ASan's, GCC 12, does not lock itself around fork)."""
    def os_threads():  # Linux: the process's threads as the kernel lists them
        return sorted(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else []

    loader = gt.DataLoader(Records(), batch_size=8, num_workers=2)
    epoch(loader)
    python_threads, kernel_threads = threading.enumerate(), os_threads()
    for _ in range(3):
        assert len(epoch(loader)) == 5
        assert threading.enumerate() == python_threads
        assert os_threads() == kernel_threads


def test_persistent_workers_keep_their_processes_across_epochs():
    loader = gt.DataLoader(Records(), batch_size=8, shuffle=True, seed=1, num_workers=2, persistent_workers=True)
    first = epoch(loader)
    pids = {p.pid for p in loader._iterator.pool.processes}
    second = epoch(loader)
    assert {p.pid for p in loader._iterator.pool.processes} == pids
    assert not same(first, second)  # a new shuffle per epoch
    reference = gt.DataLoader(Records(), batch_size=8, shuffle=True, seed=1)
    assert same([first, second], [epoch(reference), epoch(reference)])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mid_epoch_resume_is_exact(num_workers):
    options = dict(batch_size=4, shuffle=True, seed=7, num_workers=num_workers)
    reference = gt.DataLoader(Records(), **options)
    full = epoch(reference) + epoch(reference)
    loader = gt.DataLoader(Records(), **options)
    it = iter(loader)
    head = [copied(next(it)) for _ in range(3)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    del it
    resumed = gt.DataLoader(Records(), **dict(options, seed=0))
    resumed.load_state_dict(state)
    assert same(head + epoch(resumed), full[:len(full) // 2])
    assert same(epoch(resumed), full[len(full) // 2:])  # the next epoch follows


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_deep_copy_mid_epoch_yields_the_rest(num_workers):
    loader = gt.DataLoader(Records(), batch_size=4, shuffle=True, seed=5, num_workers=num_workers)
    it = iter(loader)
    next(it)
    duplicate = copy.deepcopy(loader)
    assert duplicate.state_dict() == loader.state_dict()
    assert same(epoch(duplicate), [copied(b) for b in it])


def test_worker_init_fn_and_worker_info_in_processes():
    def init(worker_id):
        info = get_worker_info()
        assert info.id == worker_id and info.num_workers == 2

    class WhoAmI(Records):
        def __getitem__(self, i):
            return np.int64(get_worker_info().id)

    got = epoch(gt.DataLoader(WhoAmI(8), batch_size=2, num_workers=2, worker_init_fn=init))
    assert [b.tolist() for b in got] == [[0, 0], [1, 1], [0, 0], [1, 1]]
    assert get_worker_info() is None


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_other_start_methods(method):
    data = [(np.arange(3, dtype=np.float32) + i, i) for i in range(9)]
    ctx = multiprocessing.get_context(method)
    got = epoch(gt.DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context=ctx))
    assert same(got, epoch(gt.DataLoader(data, batch_size=4)))


# ---- iterable datasets --------------------------------------------------------------------------

def test_iterable_dataset_is_sharded_by_worker_info():
    single = epoch(gt.DataLoader(Stream(), batch_size=4))
    assert np.array_equal(np.concatenate(single)[:, 0], np.arange(50))
    for num_workers in (1, 2):
        loader = gt.DataLoader(Stream(), batch_size=4, num_workers=num_workers, persistent_workers=True)
        for _ in range(2):
            rows = np.concatenate(epoch(loader))[:, 0]
            assert sorted(rows.tolist()) == list(range(50))
    interleaved = epoch(gt.DataLoader(Stream(), batch_size=2, num_workers=2))
    assert [b[:, 0].tolist() for b in interleaved[:3]] == [[0, 2], [1, 3], [4, 6]]  # worker 0, 1, 0


def test_iterable_dataset_options():
    assert [len(b) for b in gt.DataLoader(Stream(10), batch_size=4, drop_last=True)] == [4, 4]
    assert len(list(gt.DataLoader(Stream(10), batch_size=None))) == 10
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        gt.DataLoader(Stream(), shuffle=True)
    with pytest.raises(ValueError, match="expected unspecified sampler option"):
        gt.DataLoader(Stream(), sampler=[0, 1])


def test_iterable_resume_replays_to_the_saved_batch():
    loader = gt.DataLoader(Stream(), batch_size=4, num_workers=2)
    it = iter(loader)
    [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it
    rest = epoch(gt.DataLoader(Stream(), batch_size=4, num_workers=2))[5:]
    resumed = gt.DataLoader(Stream(), batch_size=4, num_workers=2)
    resumed.load_state_dict(state)
    assert same(epoch(resumed), rest)
    assert resumed.state_dict()["epoch"] == 1


# ---- shared-memory slots -------------------------------------------------------------------------

def test_a_batch_crosses_as_a_small_skeleton():
    writer, ring = SlotWriter(os.getpid()), SlotRing()
    slot = ring.acquire()
    batch = {"x": np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32), "n": "name"}
    skeleton, created, capacity = writer.write(slot.id, None, 0, "object", batch)
    assert len(pickle.dumps(skeleton)) < 400 and capacity >= batch["x"].nbytes
    ring.adopt(slot, created, capacity)
    out = ring.deliver(slot, skeleton)
    assert np.array_equal(out["x"], batch["x"]) and out["n"] == "name"
    assert ring.acquire() is not slot  # still viewed by `out`
    del out
    assert ring.acquire() is slot
    writer.close()
    ring.close()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory lives in /dev/shm on Linux")
def test_a_stopped_worker_unlinks_the_segments_it_never_announced():
    writer = SlotWriter(os.getpid())
    _, announced, _ = writer.write(0, None, 0, "object", np.zeros(10))
    writer.sent()
    _, unannounced, _ = writer.write(1, None, 0, "object", np.zeros(10))
    writer.close()  # as after SIGTERM between creating a segment and sending its name
    assert os.path.exists(f"/dev/shm/{announced}") and not os.path.exists(f"/dev/shm/{unannounced}")
    ring = SlotRing()
    ring.adopt(ring.acquire(), announced, 4096)
    ring.close()
    assert not os.path.exists(f"/dev/shm/{announced}")


def test_what_is_not_a_dataset():
    with pytest.raises(TypeError, match="map-style dataset"):
        gt.DataLoader(object())
    with pytest.raises(TypeError, match=r"data\['y'\] must be a NumPy array"):
        gt.DataLoader({"x": np.zeros((3, 2)), "y": 3})  # a dict of arrays with a mistake, not a dataset


# ---- the acceptance test ------------------------------------------------------------------

def test_torch_style_dataset_trains_with_worker_processes(tmp_path):
    def loader(**options):
        return gt.DataLoader(TorchStyleDataset(), batch_size=8, shuffle=True, seed=3, **options)

    fast = loader(num_workers=2, persistent_workers=True, pin_memory=True)
    reference = loader()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator
        for _ in range(2):
            assert same(epoch(fast), epoch(reference))

    def train(data):
        gt.random.manual_seed(1)
        model = nn.Sequential(nn.Linear(10, 16), nn.GELU(), nn.Linear(16, 3))
        args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-2,
                                    save_strategy="no", disable_tqdm=True, seed=3, num_train_epochs=2)
        gt.Trainer(model, args, train_dataset=data).train()
        return model.state_dict()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = train(loader(num_workers=2, persistent_workers=True, pin_memory=True))
    b = train(loader())
    assert all(np.array_equal(a[k], b[k]) for k in a)
    x, y = TorchStyleDataset().x, TorchStyleDataset().y
    c = train(gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=3))  # the array path: same batches
    assert all(np.array_equal(a[k], c[k]) for k in a)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory lives in /dev/shm on Linux")
def test_a_batch_that_fails_to_pack_leaves_no_segment():
    from gputrain.data.collate import _Leaf

    def fill(out):
        raise RuntimeError("cannot fill")

    gc.collect()  # loaders of earlier tests, and their segments, are gone
    writer = SlotWriter(os.getpid())
    with pytest.raises(RuntimeError, match="cannot fill"):  # fails after its segment was made
        writer.write(0, None, 0, "spec", _Leaf((4,), np.dtype(np.float32), fill))
    _, announced, _ = writer.write(1, None, 0, "object", np.zeros(3))  # the next batch goes through
    writer.sent()
    writer.close()
    assert {n for n in os.listdir("/dev/shm") if n.startswith(segment_prefix(os.getpid()))} == {announced}
    leftover = shared_memory.SharedMemory(name=announced)
    leftover.close()
    leftover.unlink()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_size_beyond_the_dataset_gives_one_batch_of_it_all(num_workers):
    """batch_size up to 2**63 - 1 (and 2**63, as Python ints go) is one batch, as in PyTorch; it
    raised OverflowError while the batch offsets were computed (found by the fuzz suite)."""
    data = TorchStyleDataset(n=5)
    for size in (6, 2**62, 2**63):
        batches = list(gt.DataLoader(data, batch_size=size, num_workers=num_workers))
        assert len(batches) == 1 and np.array_equal(batches[0][0], data.x)
        assert list(gt.DataLoader(data, batch_size=size, drop_last=True, num_workers=num_workers)) == []
