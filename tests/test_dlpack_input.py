"""TrainStep and forward read other libraries' arrays through DLPack and the CUDA array interface
(csrc/py/external.c, dlpack.c): where they lie on a device model (validated, ordered by events,
kept alive until the step's work has run), as zero-copy NumPy views on the CPU. On "sim" the
arrays use DLPack's kDLExtDev and __sim_array_interface__, read by the code that reads CUDA ones.

The producers here: NumPy (its own __dlpack__), gputrain's DeviceArray (its export), a ctypes
producer (tests/_dlpack_producer.py) for any device, dtype, layout or version, and PyTorch CPU
tensors when torch is installed."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gputrain as gt
from _dlpack_producer import BF16, CPU, EXT_DEV, F64, I64, Producer, capsule_name
from test_sim_ordering import run_with_delays
from test_sim_step import make_model

nn = gt.nn
sim = pytest.mark.sim

WRAPPERS = """
class DLPackOnly:
    '''Only the DLPack methods of `array` (legacy: a producer from before max_version; stream:
    the stream asked for instead of the consumer's, -1: no ordering).'''
    def __init__(self, array, legacy=False, stream=None):
        self.array, self.legacy, self.stream = array, legacy, stream
    def __dlpack_device__(self):
        return self.array.__dlpack_device__()
    def __dlpack__(self, stream=None, **kwargs):
        stream = stream if self.stream is None else self.stream
        if self.legacy:
            return self.array.__dlpack__() if stream is None else self.array.__dlpack__(stream=stream)
        return self.array.__dlpack__(stream=stream, **kwargs)

class InterfaceOnly:
    '''Only the array interface of `array` (no stream: the data is ready).'''
    def __init__(self, array, **changes):
        self.array, self.changes = array, changes
    @property
    def __sim_array_interface__(self):
        return {**self.array.__sim_array_interface__, **self.changes}
"""
exec(WRAPPERS)


def data(rows=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 12)).astype(np.float32), rng.integers(0, 7, rows).astype(np.int64)


def train_cpu(wrap, steps=4):
    model = make_model()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=3e-3))
    X, Y = data()
    losses = [step(wrap(X[i::steps].copy()), wrap(Y[i::steps].copy())).loss for i in range(steps)]
    return losses, model.compiled.read_parameters()


@pytest.mark.parametrize("wrap", [DLPackOnly, lambda a: DLPackOnly(a, legacy=True)], ids=["versioned", "legacy"])
def test_cpu_training_from_dlpack_is_bit_identical_to_numpy(wrap):
    losses, params = train_cpu(wrap)
    want_losses, want_params = train_cpu(lambda a: a)
    assert losses == want_losses
    np.testing.assert_array_equal(params, want_params)


def test_a_host_dlpack_input_is_read_without_a_copy_and_freed_once():
    X, _ = data(4)
    model = make_model()
    producer = Producer(X.ctypes.data, X.shape)
    np.testing.assert_array_equal(model(producer), model(X))
    assert producer.deleted == 1 and producer.unused_destroyed == 0
    X[0, 0] = 100.0  # the producer's memory is what was read: no copy was made
    changed = Producer(X.ctypes.data, X.shape)
    np.testing.assert_array_equal(model(changed), model(X))


@pytest.mark.parametrize("changes, error, words", [
    (dict(version=(2, 0)), BufferError, ["x: a DLPack 2.0 capsule"]),
    (dict(dtype=BF16), TypeError, ["x: a DLPack array of bfloat16", "no NumPy equivalent"]),
    (dict(dtype=F64), TypeError, ["x: expected a float32 array"]),
    (dict(tensor_device=(CPU, 1)), ValueError, ["x: the DLPack tensor lies on device (1, 1)"]),
])
def test_a_bad_host_dlpack_input_is_refused_and_freed_by_its_capsule(changes, error, words):
    X, _ = data(4)
    model = make_model()
    producer = Producer(X.ctypes.data, X.shape, **changes)
    with pytest.raises(error) as info:
        model(producer)
    for word in words:
        assert word in str(info.value)
    gc.collect()
    assert producer.deleted == 1
    assert producer.unused_destroyed == (0 if "dtype" in changes and changes["dtype"] == F64 else 1)


def test_a_failing_producer_is_reported_naming_the_argument():
    class Broken:
        def __dlpack_device__(self):
            return (CPU, 0)

        def __dlpack__(self, stream=None, max_version=None):
            raise RuntimeError("cannot export")

    with pytest.raises(BufferError, match=r"y: Broken.__dlpack__\(\) failed: cannot export") as info:
        gt.TrainStep(make_model(), nn.CrossEntropyLoss())(data(4)[0], Broken())
    assert isinstance(info.value.__cause__, RuntimeError)


# ---- sim: device arrays read where they lie -------------------------------------------------

SIM_INPUTS = WRAPPERS + """
from test_sim_step import make_model
X = np.random.default_rng(0).standard_normal((256, 12)).astype(np.float32)
Y = np.random.default_rng(1).integers(0, 7, 256).astype(np.int64)

def train(kind):
    model = make_model().to("sim")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=3e-3))
    loader = gt.DataLoader((X, Y), batch_size=32, shuffle=True, seed=1, device=None if kind == "numpy" else "sim")
    wrap = {"numpy": lambda a: a, "device_array": lambda a: a, "dlpack": DLPackOnly,
            "dlpack_legacy": lambda a: DLPackOnly(a, legacy=True), "interface": InterfaceOnly}[kind]
    losses = [step(wrap(xb), wrap(yb)).loss for epoch in range(2) for xb, yb in loader]
    return losses, model.compiled.read_parameters()

want_losses, want_params = train("numpy")
for kind in ("device_array", "dlpack", "dlpack_legacy", "interface"):
    losses, params = train(kind)
    assert np.isfinite(params).all(), kind
    assert losses == want_losses, kind
    np.testing.assert_array_equal(params, want_params)
"""


@sim
def test_sim_training_from_dlpack_and_the_array_interface_is_bit_identical_with_random_delays():
    run_with_delays(SIM_INPUTS)


# Each step reads a batch whose copy was queued just before it (a loader of one batch), so only
# the stream ordering makes the step read the copied values: DLPack's stream= argument (the
# DeviceArray makes the step's stream wait for its copy event) and the array interface's stream
# (the step's stream waits for an event recorded on the copy stream). Removing the DLPack wait
# fails this test (3 runs of 3); removing the array-interface wait did not in 5 runs, nor when no
# loader is freed in the loop (something else still orders that case: not found yet), so it stays
# here for when that goes.
ORDERING = WRAPPERS + """
from test_sim_step import make_model
X = np.random.default_rng(0).standard_normal((24, 16, 12)).astype(np.float32)
Y = np.random.default_rng(1).integers(0, 7, (24, 16)).astype(np.int64)

def train(wrap):
    model = make_model().to("sim")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=3e-3))
    losses = []
    for i in range(24):  # one batch per loader: the step is queued right after its copy
        loader = gt.DataLoader((X[i], Y[i]), batch_size=16, device=None if wrap is None else "sim")
        xb, yb = next(iter(loader))
        losses.append(step(xb, yb).loss if wrap is None else step(wrap(xb), wrap(yb)).loss)
    return losses, model.compiled.read_parameters()

want = train(None)
for wrap in (DLPackOnly, InterfaceOnly):
    losses, params = train(wrap)
    assert losses == want[0], wrap.__name__
    np.testing.assert_array_equal(params, want[1])
"""


@sim
def test_a_step_waits_for_the_producers_stream_by_an_event():
    run_with_delays(ORDERING, delay_us=2000)


# The producer's memory is a loader batch that returns to the loader (and is poisoned, 0xFF) as
# soon as nothing holds it; its copy is waited for on the host, and the producers ask for no stream
# ordering, so only the keep-alive until the step's work has run protects the backward pass
# (which reads x after the step returned). Without it the parameters come out NaN or different.
KEEP_ALIVE = WRAPPERS + """
from test_sim_step import make_model
X = np.random.default_rng(0).standard_normal((256, 12)).astype(np.float32)
Y = np.random.default_rng(1).integers(0, 7, 256).astype(np.int64)

def one_step(step, batches, wrap):
    xb, yb = next(batches)
    xb.wait()
    return step(wrap(xb), wrap(yb)).loss  # the batch's last references go with this frame

def train(wrap):
    model = make_model().to("sim")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=3e-3))
    loader = gt.DataLoader((X, Y), batch_size=32, shuffle=True, seed=1, device=None if wrap is None else "sim")
    losses = []
    for epoch in range(2):
        batches = iter(loader)
        if wrap is None:
            losses += [step(xb, yb).loss for xb, yb in batches]
        else:
            losses += [one_step(step, batches, wrap) for _ in range(len(loader))]
    return losses, model.compiled.read_parameters()

want = train(None)
for wrap in (lambda a: DLPackOnly(a, stream=-1), InterfaceOnly):
    losses, params = train(wrap)
    assert np.isfinite(params).all(), "a producer's memory was freed before the step read it"
    assert losses == want[0]
    np.testing.assert_array_equal(params, want[1])
"""


@sim
def test_a_producer_is_kept_alive_until_the_step_that_reads_it_has_run():
    run_with_delays(KEEP_ALIVE, delay_us=300)


def sim_batch(device="sim", rows=16, seed=5):
    X, Y = data(rows, seed)
    xb, yb = next(iter(gt.DataLoader((X, Y), batch_size=rows, device=device)))
    xb.wait()
    return X, Y, xb, yb


def sim_step(device="sim"):
    model = make_model().to(device)
    return gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-3)), model


@sim
@pytest.mark.parametrize("versioned", [True, False])
def test_a_device_capsule_is_taken_per_protocol_and_freed_once_after_the_step(versioned):
    step, model = sim_step()
    X, Y, xb, yb = sim_batch()
    producer = Producer(xb.address, xb.shape, device=(EXT_DEV, 0), version=(1, 0) if versioned else None)
    capsules = []
    take = producer.__dlpack__
    producer.__dlpack__ = lambda **kwargs: capsules.append(take(**kwargs)) or capsules[-1]
    step(producer, yb)
    assert capsule_name(capsules[0]) == ("used_dltensor_versioned" if versioned else "used_dltensor")
    assert producer.streams == [1]  # the step's stream: sim:0's default stream
    assert producer.deleted == 0     # held until the step's work has run
    model.compiled.read_parameters()  # waits for the device
    model(X)                          # a later input releases what finished
    assert producer.deleted == 1 and producer.unused_destroyed == 0
    del capsules[:]
    gc.collect()
    assert producer.deleted == 1


def interface_of(xb, **changes):
    return InterfaceOnly(xb, **changes)


@sim
@pytest.mark.parametrize("case, error, words", [
    ("dlpack on sim:1", ValueError, ["x: a DLPack array on sim:1, but the model is on sim:0"]),
    ("dlpack on cuda", ValueError, ["x: a DLPack array on cuda:0, but the model is on sim:0"]),
    ("dlpack float64", TypeError, ["x: expected a DLPack array of float32", "float64"]),
    ("dlpack y float32", TypeError, ["y: expected a DLPack array of int64", "float32"]),
    ("dlpack strided", ValueError, ["x: stride 2 elements in dimension 1", "contiguous"]),
    ("dlpack 2.0", BufferError, ["x: a DLPack 2.0 capsule"]),
    ("dlpack lies elsewhere", ValueError, ["x: the DLPack tensor lies on device (12, 1)"]),
    ("dlpack 0 dims", ValueError, ["x: expected 1 to 8 dimensions, got 0"]),
    ("cuda interface", ValueError, ["x: an array in CUDA device memory (__cuda_array_interface__)", "sim:0"]),
    ("interface float64", TypeError, ["x: expected an array of float32", "'<f8'"]),
    ("interface strided", ValueError, ["x: stride"]),
    ("interface masked", ValueError, ["x: a masked array"]),
    ("interface host memory", ValueError, ["is not sim device memory, but the model is on sim:0"]),
    ("interface on sim:1", ValueError, ["lies on sim:1, but the model is on sim:0"]),
    ("interface bad stream", ValueError, ["x: 0x3039 is not a stream of sim:0"]),
    ("interface no version", TypeError, ["needs 'version'"]),
])
def test_a_bad_device_input_is_refused_naming_it_and_nothing_changes(case, error, words):
    step, model = sim_step()
    before = model.compiled.read_parameters()
    X, Y, xb, yb = sim_batch()
    _, _, xb1, _ = sim_batch("sim:1")
    at = xb.address
    producers = {
        "dlpack on sim:1": Producer(xb1.address, xb1.shape, device=(EXT_DEV, 1)),
        "dlpack on cuda": Producer(at, xb.shape, device=(2, 0)),
        "dlpack float64": Producer(at, (16, 6), device=(EXT_DEV, 0), dtype=F64),
        "dlpack y float32": Producer(yb.address, (16,), device=(EXT_DEV, 0)),
        "dlpack strided": Producer(at, (8, 12), device=(EXT_DEV, 0), strides=(12, 2)),
        "dlpack 2.0": Producer(at, xb.shape, device=(EXT_DEV, 0), version=(2, 0)),
        "dlpack lies elsewhere": Producer(at, xb.shape, device=(EXT_DEV, 0), tensor_device=(EXT_DEV, 1)),
        "dlpack 0 dims": Producer(at, (), device=(EXT_DEV, 0)),
    }

    class CudaInterface:
        __cuda_array_interface__ = {"shape": (16, 12), "typestr": "<f4", "data": (at, False), "version": 3}

    host = np.zeros((16, 12), np.float32)
    others = {
        "cuda interface": CudaInterface(),
        "interface float64": interface_of(xb, typestr="<f8", shape=(16, 6)),
        "interface strided": interface_of(xb, shape=(16, 6), strides=(48, 8)),
        "interface masked": interface_of(xb, mask=object()),
        "interface host memory": interface_of(xb, data=(host.ctypes.data, False)),
        "interface on sim:1": interface_of(xb, data=(xb1.address, False)),
        "interface bad stream": interface_of(xb, stream=12345),
        "interface no version": interface_of(xb, version=None),
    }
    given = producers.get(case) or others[case]
    args = (xb, given) if case.startswith("dlpack y") else (given, yb)
    with pytest.raises(error) as info:
        step(*args)
    for word in words:
        assert word in str(info.value)
    np.testing.assert_array_equal(model.compiled.read_parameters(), before)
    if isinstance(given, Producer):
        gc.collect()
        assert given.deleted == given.unused_destroyed == len(given.streams) <= 1  # untaken: freed by its capsule
    assert np.isfinite(step(xb, yb).loss)  # the step still works after the refusal


@sim
def test_a_contiguous_layout_given_with_strides_is_accepted():
    step, model = sim_step()
    X, Y, xb, yb = sim_batch()
    strided = Producer(xb.address, xb.shape, device=(EXT_DEV, 0), strides=(12, 1))
    interface = interface_of(xb, strides=(48, 4))
    np.testing.assert_array_equal(model(strided), model(X))
    np.testing.assert_array_equal(model(interface), model(X))


@sim
def test_a_cpu_model_refuses_device_arrays_of_other_libraries():
    model = make_model()
    _, _, xb, _ = sim_batch()
    with pytest.raises(ValueError, match="x: a DLPack array on sim:0, but the model is on cpu"):
        model(DLPackOnly(xb))
    with pytest.raises(ValueError, match=r"x: an array in sim device memory \(__sim_array_interface__\), but the "
                                         "model is on cpu"):
        model(InterfaceOnly(xb))


# ---- DeviceArray's export ------------------------------------------------------------------

@sim
def test_a_sim_device_array_exports_dlpack_and_no_cuda_interface():
    _, _, xb, _ = sim_batch()
    _, _, xb1, _ = sim_batch("sim:1")
    assert xb.__dlpack_device__() == (EXT_DEV, 0) and xb1.__dlpack_device__() == (EXT_DEV, 1)
    assert not hasattr(xb, "__cuda_array_interface__")
    assert xb.__sim_array_interface__["data"] == (xb.address, False)
    assert capsule_name(xb.__dlpack__(max_version=(1, 1))) == "dltensor_versioned"
    assert capsule_name(xb.__dlpack__()) == "dltensor"
    with pytest.raises(BufferError, match="without a copy"):
        xb.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="cannot be exported to DLPack device"):
        xb.__dlpack__(dl_device=(CPU, 0))
    with pytest.raises(ValueError, match="stream: 0x3039 is not a stream of sim:0"):
        xb.__dlpack__(stream=12345)


# ---- PyTorch tensors ------------------------------------------------------------------------

def test_torch_cpu_tensors_train_bit_identically_to_numpy():
    torch = pytest.importorskip("torch")
    losses, params = train_cpu(torch.from_numpy)
    want_losses, want_params = train_cpu(lambda a: a)
    assert losses == want_losses
    np.testing.assert_array_equal(params, want_params)
    with pytest.raises(BufferError, match="x: Tensor.__dlpack__"):
        make_model()(torch.zeros(4, 12, requires_grad=True))


@sim
def test_torch_cpu_tensors_feed_a_sim_model():
    torch = pytest.importorskip("torch")
    X, Y = data(16)
    step, model = sim_step()
    want_step, want_model = sim_step()
    assert step(torch.from_numpy(X), torch.from_numpy(Y)).loss == want_step(X, Y).loss
    np.testing.assert_array_equal(model.compiled.read_parameters(), want_model.compiled.read_parameters())


# ---- references ----------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=sim)])
def test_inputs_of_other_libraries_leak_no_references(device):
    import sys

    X, Y = data(16)
    model = make_model().to(device) if device != "cpu" else make_model()
    if device == "cpu":
        x, y = DLPackOnly(X), DLPackOnly(Y)
    else:
        _, _, xb, yb = sim_batch()
        x, y = InterfaceOnly(xb), DLPackOnly(yb)
    loss_fn = nn.CrossEntropyLoss()
    step = gt.TrainStep(model, loss_fn)
    step(x, y)
    model.compiled.read_parameters()
    model(X)  # releases what the finished step held
    before = sys.getrefcount(x), sys.getrefcount(y), sys.getrefcount(X), sys.getrefcount(Y)
    for _ in range(20):
        step(x, y)
    model.compiled.read_parameters()
    model(X)
    assert (sys.getrefcount(x), sys.getrefcount(y), sys.getrefcount(X), sys.getrefcount(Y)) == before
