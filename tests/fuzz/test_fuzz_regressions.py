"""Regression tests for what the fuzz suite (test_fuzz_api.py) found, one per finding."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gputrain as gt
import gputrain.functional as F
from gputrain.data import RaggedArray
from gputrain.optim import total_norm


def test_embedding_takes_dtype_none_as_its_error_message_says():
    # raised KeyError(None) from a dict lookup; the message for a bad dtype lists None as valid
    ids, table = np.array([[1, 2]]), np.arange(20, dtype=np.float32).reshape(5, 4)
    np.testing.assert_array_equal(F.embedding(ids, table, dtype=None), table[ids])


@pytest.mark.parametrize("norm_type", [1.0, 3.0])
def test_total_norm_of_something_not_an_array_is_a_type_error(norm_type):
    # raised AttributeError: 'float' object has no attribute 'astype' for p other than 2 and inf
    with pytest.raises(TypeError, match="grads must be NumPy arrays"):
        total_norm([np.ones(3, np.float32), 1.5], norm_type)
    assert total_norm([np.ones(4, np.float32)], norm_type) == pytest.approx(4 ** (1 / norm_type))
    assert total_norm([np.ones(4, np.float32)], math.inf) == 1.0


@pytest.mark.parametrize("kwargs", [{"pad_value": 2**100}, {"offsets": [0, 2**70]}])
def test_ragged_array_with_an_int_beyond_int64_is_a_value_error_naming_it(kwargs):
    # raised NumPy's OverflowError "Python int too large to convert to C long", naming nothing
    args = {"values": np.arange(4), "offsets": [0, 2, 4], **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RaggedArray(**args)


def test_set_memory_limit_beyond_int64_is_a_value_error():
    # raised OverflowError "int too big to convert" from the C conversion
    with pytest.raises(ValueError, match="limit must be"):
        gt.set_memory_limit(2**64)
    gt.set_memory_limit(None)


@pytest.mark.parametrize("argument", ["scaler", "scheduler"])
def test_train_step_refuses_a_scaler_or_scheduler_of_the_wrong_type_before_any_step(argument):
    # an array as scaler raised AttributeError in the first call; as scheduler, after the
    # optimizer had already updated the weights
    model = gt.nn.Sequential(gt.nn.Linear(4, 3))
    with pytest.raises(TypeError, match=argument):
        gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters()),
                     **{argument: np.zeros(2)})


def test_total_norm_beyond_the_float_range_is_inf():
    # norm_type=1e-45 raised OverflowError "Numerical result out of range" from float ** float
    assert total_norm([np.full(3, 2.0, np.float32)], 1e-45) == math.inf


@pytest.mark.parametrize("make", [
    lambda opt: gt.optim.get_inverse_sqrt_schedule(opt, num_warmup_steps=-1),
    lambda opt: gt.optim.get_inverse_sqrt_schedule(opt, num_warmup_steps=2, timescale=0),
    lambda opt: gt.optim.get_polynomial_decay_schedule_with_warmup(opt, 4, 4),
    lambda opt: gt.optim.get_linear_schedule_with_warmup(opt, 2, 10.5),
])
def test_schedule_step_counts_are_checked_when_the_schedule_is_made(make):
    # these raised ZeroDivisionError (or TypeError) at some step in the middle of training
    opt = gt.optim.SGD([gt.nn.Parameter(np.zeros(2, np.float32))], lr=0.1)
    with pytest.raises((ValueError, TypeError), match="num_warmup_steps|num_training_steps|timescale"):
        schedule = make(opt)
        for _ in range(6):
            schedule.step()


def test_train_step_with_micro_batches_beyond_c_int_is_refused_when_made():
    # accepted, then every call raised OverflowError "signed integer is greater than maximum"
    model = gt.nn.Sequential(gt.nn.Linear(4, 3))
    with pytest.raises(ValueError, match="micro_batches"):
        gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters()),
                     micro_batches=2**32)


def test_ignore_index_beyond_int64_is_a_value_error():
    # F.cross_entropy raised OverflowError "int too big to convert" from the C call;
    # CrossEntropyLoss accepted it and every TrainStep call raised OverflowError
    logits, targets = np.zeros((2, 3), np.float32), np.array([0, 1])
    with pytest.raises(ValueError, match="ignore_index"):
        F.cross_entropy(logits, targets, ignore_index=2**100)
    with pytest.raises(ValueError, match="ignore_index"):
        gt.nn.CrossEntropyLoss(ignore_index=-2**64)


def unaligned_int64(values: list[int]) -> np.ndarray:
    raw = np.zeros(len(values) * 8 + 1, np.uint8)
    view = raw[1:].view(np.int64)
    view[:] = values
    return view


def test_ragged_offsets_that_are_not_aligned_are_copied_not_read_misaligned():
    # found by the fuzz run under UBSan: "load of misaligned address ... for type 'const int64_t'"
    # (loader_fields.c) for RaggedArray offsets in an unaligned buffer
    offsets = unaligned_int64([0, 2, 3, 6])
    assert not offsets.flags.aligned
    ragged = RaggedArray(np.arange(6), offsets, pad_value=-1)
    batches = [b.tolist() for b in gt.DataLoader(ragged, batch_size=3)]
    assert batches == [[[0, 1, -1], [2, -1, -1], [3, 4, 5]]]
    engine_fields = [(np.arange(6), offsets, np.full((), -1, np.int64))]
    with pytest.raises(ValueError, match="aligned int64 offsets"):
        gt._C.LoaderEngine(engine_fields, 3, 0, 1)


def test_linear_backward_of_a_0d_x_is_a_value_error():
    # raised IndexError "tuple index out of range" while formatting the weight-shape message
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        F.linear_backward(np.ones((5, 3), np.float32), np.ones((), np.float32),
                          np.ones((3, 4), np.float32))
