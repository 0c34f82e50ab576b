"""One vocabulary (issue 24): precision names and device strings, each parsed in one place
(gputrain/_vocab.py) and accepted alike by every API; TrainStep's micro_batches (and its
deprecated old name); Parameter's torch attributes; Module.to's torch signature."""

from __future__ import annotations

import pickle
import re
import warnings

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C, cuda, nn
from gputrain import _C_testing
from gputrain._vocab import c_dtype, parse_device, parse_precision
from gputrain.memory_plan import plan_training


class FakeTorchDtype:
    """What parse_precision reads of a torch.dtype: its class is torch's `dtype`, its str "torch.<name>"."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


FakeTorchDtype.__module__ = "torch"
FakeTorchDtype.__name__ = "dtype"


class FakeTorchDevice:
    """torch.device's duck type: `type` and `index` (None for the current device)."""

    def __init__(self, kind: str, index: int | None = None) -> None:
        self.type, self.index = kind, index


def mlp():
    gt.random.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))


def batch(rows=8):
    rng = np.random.default_rng(0)
    return rng.standard_normal((rows, 8)).astype(np.float32), rng.integers(0, 3, rows).astype(np.int64)


# ---- precision ---------------------------------------------------------------------------------

SPELLINGS = {
    "fp32": ["fp32", "f32", "float32", np.float32, np.dtype(np.float32), FakeTorchDtype("float32")],
    "bf16": ["bf16", "bfloat16", FakeTorchDtype("bfloat16")],
    "fp16": ["fp16", "f16", "float16", np.float16, np.dtype("float16"), FakeTorchDtype("float16")],
}
ALL = [(canonical, spelling) for canonical, spellings in SPELLINGS.items() for spelling in spellings]


@pytest.mark.parametrize(("canonical", "spelling"), ALL, ids=[str(s) for _, s in ALL])
def test_every_spelling_parses_to_one_name(canonical, spelling):
    assert parse_precision(spelling) == canonical
    assert c_dtype(spelling) == {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}[canonical]


def test_ml_dtypes_bfloat16_is_bf16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert parse_precision(ml_dtypes.bfloat16) == parse_precision(np.dtype(ml_dtypes.bfloat16)) == "bf16"


@pytest.mark.parametrize(("value", "error", "match"), [
    ("fp8", ValueError, r"^precision must be 'fp32', 'bf16' or 'fp16' .*got 'fp8'$"),
    ("FP16", ValueError, "got 'FP16'"),
    ("", ValueError, "got ''"),
    (np.int32, ValueError, "got the dtype int32"),
    (np.dtype(np.float64), ValueError, "got the dtype float64"),
    (FakeTorchDtype("int8"), ValueError, "got torch.int8"),
    (16, TypeError, "precision must be a str such as 'bf16' or a dtype, not int"),
    (None, TypeError, "not NoneType"),
])
def test_bad_precisions_are_refused_by_name(value, error, match):
    with pytest.raises(error, match=match):
        parse_precision(value)


@pytest.mark.parametrize("spelling", ["fp16", "f16", "float16", np.float16])
def test_summary_plan_and_train_step_take_every_spelling(spelling):
    model = mlp()
    assert model.summary((4, 8), precision=spelling) == model.summary((4, 8), precision="fp16")
    assert "in fp16:" in model.summary((4, 8), precision=spelling)
    plan = plan_training(model, (4, 8), precision=spelling)
    assert dict(plan) == dict(plan_training(model, (4, 8), precision="fp16"))
    assert plan.settings["precision"] == "fp16" and dict(plan) != dict(plan_training(model, (4, 8)))
    gt.TrainStep(model, nn.CrossEntropyLoss(), precision=spelling)
    assert model.compiled.precision == "f16"
    assert "in fp16:" in model.summary((4, 8))  # the model's own precision, in the same words


def test_summary_refuses_a_bad_precision_by_name():
    with pytest.raises(ValueError, match="precision must be .*got 'half16'"):
        mlp().summary((4, 8), precision="half16")
    with pytest.raises(ValueError, match="precision must be .*got 'fp8'"):
        gt.TrainStep(mlp(), nn.CrossEntropyLoss(), precision="fp8")


def test_cast_and_functional_take_the_same_names():
    x = np.linspace(-3, 3, 11, dtype=np.float32)
    expected = gt.cast(x, "f16")
    for spelling in ("fp16", "float16", np.float16, FakeTorchDtype("float16")):
        np.testing.assert_array_equal(gt.cast(x, spelling), expected)
    bits = gt.cast(x, "bf16").view(np.uint16)
    np.testing.assert_array_equal(gt.cast(bits, "fp32", src_dtype="bfloat16"), gt.cast(bits, "f32", src_dtype="bf16"))
    with pytest.raises(ValueError, match="dtype must be .*got 'fp8'"):
        gt.cast(x, "fp8")
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids = np.array([3, 0, 2])
    np.testing.assert_array_equal(gt.functional.embedding(ids, table, dtype="fp32"),
                                  gt.functional.embedding(ids, table, dtype="f32"))
    with pytest.raises(ValueError, match="dtype must be .*got 'int8'"):
        gt.functional.embedding(ids, table, dtype="int8")


# ---- devices ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("device", "canonical"), [
    ("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:3", "cuda:3"), ("sim", "sim:0"), ("sim:1", "sim:1"),
    (FakeTorchDevice("cuda", 2), "cuda:2"), (FakeTorchDevice("cpu"), "cpu"), (FakeTorchDevice("sim"), "sim:0"),
])
def test_device_names_have_one_canonical_form(device, canonical):
    assert parse_device(device) == canonical


@pytest.mark.parametrize(("device", "error", "match"), [
    ("tpu", ValueError, r"^device must be 'cpu', 'cuda', 'cuda:N', 'sim' or 'sim:N', got 'tpu'$"),
    ("cuda:x", ValueError, "got 'cuda:x'"),
    ("cuda:-1", ValueError, "got 'cuda:-1'"),
    ("cuda:01", ValueError, "got 'cuda:01'"),
    ("cuda:", ValueError, "got 'cuda:'"),
    ("cpu:0", ValueError, "got 'cpu:0'"),
    (" cpu", ValueError, "got ' cpu'"),
    ("cuda:٣", ValueError, "got 'cuda:٣'"),  # a non-ASCII digit
    (f"cuda:{2**40}", ValueError, "out of range"),
    (0, TypeError, "not an int"),
    (1.5, TypeError, "not float"),
    (None, TypeError, "not None"),
])
def test_bad_devices_are_refused_by_name(device, error, match):
    with pytest.raises(error, match=match):
        parse_device(device)


def test_the_former_parsers_all_use_the_one_function():
    # DataLoader, TrainingArguments, gputrain.cuda, Module.to and the C run_op each parsed
    # device strings their own way; they now agree and their messages name the argument.
    x, y = batch()
    assert gt.DataLoader((x, y), batch_size=4, device="sim").device == "sim:0"
    assert gt.DataLoader((x, y), batch_size=4, device=FakeTorchDevice("sim", 0)).device == "sim:0"
    assert gt.DataLoader((x, y), batch_size=4, device="cpu").device is None
    with pytest.raises(ValueError, match="device must be None, 'cpu', 'cuda', 'cuda:N', 'sim' or 'sim:N'"):
        gt.DataLoader((x, y), batch_size=4, device="sim:x")
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda', 'cuda:N', 'sim' or 'sim:N'"):
        gt.TrainingArguments(output_dir="unused", device="cudax")
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cuda:N', got 'sim:0'"):
        cuda.get_device_properties("sim:0")
    with pytest.raises(ValueError, match="device: .*'sim:99'"):
        _C_testing.run_op("sim", "add", [np.zeros(8, np.float32)] * 3, (8, "f32"), 99)
    with pytest.raises(ValueError, match="device must be >= 0"):
        _C_testing.run_op("sim", "add", [np.zeros(8, np.float32)] * 3, (8, "f32"), -1)
    for spelling in ("sim: 0", "sim:+0", "sim:00", "cuda:-0"):  # the C parser takes what Python's takes
        with pytest.raises(ValueError, match=re.escape(f"invalid device '{spelling}'")):
            _C.memory_stats(device=spelling)


def test_module_to_takes_torch_s_signature_and_spellings():
    model = mlp()
    x, _ = batch()
    expected = model(x)
    assert model.to("sim", non_blocking=True) is model
    compiled = model._compiled
    model.to("sim:0")  # the same device in another spelling: nothing is rebuilt
    model.to(FakeTorchDevice("sim", 0))
    assert model._compiled is compiled and model._compiled.device == "sim:0"
    model.to(dtype=np.float32)  # float32 master weights: a no-op
    assert model.to(np.float32) is model and model.to(FakeTorchDtype("float32")) is model  # to(dtype), as torch
    assert model._compiled is compiled
    with pytest.raises(ValueError, match="dtype=torch.float16: gputrain keeps parameters as float32"):
        model.to(FakeTorchDtype("float16"))
    model.to("cpu", non_blocking=False)
    np.testing.assert_array_equal(model(x), expected)
    with pytest.raises(TypeError, match="non_blocking must be a bool, not str"):
        model.to("sim", non_blocking="yes")
    with pytest.raises(ValueError, match=r"dtype='bf16': gputrain keeps parameters as float32"):
        model.to("sim", dtype="bf16")
    with pytest.raises(ValueError, match="device must be .*got 'gpu'"):
        model.to("gpu")
    assert model._compiled.device == "cpu"  # the refused moves changed nothing
    np.testing.assert_array_equal(model(x), expected)


# ---- micro_batches and the deprecated gradient_accumulation_steps -----------------------------------

def test_micro_batches_splits_the_batch():
    x, y = batch(8)
    whole = gt.TrainStep(mlp(), nn.CrossEntropyLoss())
    split = gt.TrainStep(mlp(), nn.CrossEntropyLoss(), micro_batches=4)
    assert split.micro_batches == 4
    assert split(x, y).loss == pytest.approx(whole(x, y).loss, rel=1e-5)
    with pytest.raises(ValueError, match=r"does not split into 4 equal micro-batches \(micro_batches\)"):
        split(x[:6], y[:6])
    with pytest.raises(ValueError, match="micro_batches must be >= 1 and < 2\\*\\*31, got 0"):
        gt.TrainStep(mlp(), nn.CrossEntropyLoss(), micro_batches=0)
    with pytest.raises(TypeError, match="micro_batches must be an int, not float"):
        gt.TrainStep(mlp(), nn.CrossEntropyLoss(), micro_batches=2.0)


def test_the_old_name_still_works_with_a_deprecation_warning_naming_the_new_one():
    x, y = batch(8)
    new = gt.TrainStep(mlp(), nn.CrossEntropyLoss(), micro_batches=2)
    with pytest.warns(DeprecationWarning, match="use micro_batches"):
        old = gt.TrainStep(mlp(), nn.CrossEntropyLoss(), gradient_accumulation_steps=2)
    assert old.micro_batches == 2
    assert old(x, y).loss == new(x, y).loss  # the same split, bit for bit
    with pytest.warns(DeprecationWarning, match="use micro_batches"):
        assert old.gradient_accumulation_steps == 2
    with pytest.warns(DeprecationWarning, match="use micro_batches"):
        old.gradient_accumulation_steps = 4
    assert old.micro_batches == 4
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="give micro_batches only"):
        gt.TrainStep(mlp(), nn.CrossEntropyLoss(), micro_batches=2, gradient_accumulation_steps=2)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="micro_batches must be >= 1"):
        gt.TrainStep(mlp(), nn.CrossEntropyLoss(), gradient_accumulation_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copied = pickle.loads(pickle.dumps(new))  # the new name alone: no warning
    assert copied.micro_batches == 2


def test_a_step_pickled_under_the_old_attribute_name_loads():
    step = gt.TrainStep(mlp(), nn.CrossEntropyLoss(), micro_batches=2)
    state = step.__getstate__()
    state["gradient_accumulation_steps"] = state.pop("micro_batches")
    revived = gt.TrainStep.__new__(gt.TrainStep)
    revived.__setstate__(state)
    assert revived.micro_batches == 2 and "gradient_accumulation_steps" not in vars(revived)


# ---- Parameter's torch attributes ----------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_parameter_answers_torch_s_shape_questions(device):
    model = mlp().to(device)
    named = dict(model.named_parameters())
    weight, bias, norm = named["0.weight"], named["0.bias"], named["2.weight"]
    assert weight.ndim == weight.dim() == 2 and bias.ndim == bias.dim() == 1
    assert weight.dtype == np.float32 and bias.dtype == np.dtype("float32")
    assert weight.size() == weight.shape == (16, 8) and isinstance(weight.size(), tuple)
    assert weight.size(0) == 16 and weight.size(1) == 8 and weight.size(-1) == 8 and weight.size(-2) == 16
    assert weight.size(np.int64(1)) == 8
    # the usual no-decay rule works as written for PyTorch
    no_decay = [name for name, p in model.named_parameters() if p.ndim < 2]
    assert no_decay == ["0.bias", "2.weight", "2.bias", "3.bias"]
    with pytest.raises(IndexError, match=r"dim 2 is out of range .* \[-2, 1\]"):
        weight.size(2)
    with pytest.raises(IndexError, match="dim -2 is out of range"):
        bias.size(-2)
    with pytest.raises(TypeError, match="dim must be an int or None, not str"):
        weight.size("0")
    with pytest.raises(TypeError, match="dim must be an int or None, not bool"):
        weight.size(True)


def test_requires_grad_underscore_returns_the_parameter_and_freezes_it():
    model = mlp()
    weight = dict(model.named_parameters())["0.weight"]
    before = weight.data.copy()
    assert weight.requires_grad_(False) is weight and weight.requires_grad is False
    x, y = batch()
    gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.5))(x, y)
    np.testing.assert_array_equal(weight.data, before)  # frozen: not updated
    assert weight.requires_grad_() is weight and weight.requires_grad is True
    with pytest.raises(TypeError, match="requires_grad must be a bool, not int"):
        weight.requires_grad_(1)
    assert weight.requires_grad is True
