"""TrainingArguments(zero_stage=...) in one process: checked where it is built, refused with SGD
(no state to shard), the same run as zero_stage=0 on the cpu and on sim. The ranks' runs are
in test_distributed.py (tests/_zero_trainer_worker.py)."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt

nn = gt.nn


def arguments(tmp_path, **kwargs):
    options = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-2, save_strategy="no",
                   max_steps=3, logging_steps=1, disable_tqdm=True, seed=3)
    return gt.TrainingArguments(**{**options, **kwargs})


def model():
    gt.random.manual_seed(1)
    return nn.Sequential(nn.Linear(10, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 3))


def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((32, 10)).astype(np.float32), rng.integers(0, 3, 32)


@pytest.mark.parametrize("value, error, words", [
    (2, ValueError, ("zero_stage", "stages 2 and 3")), (-1, ValueError, ("zero_stage",)),
    (True, TypeError, ("zero_stage", "bool")), (1.0, TypeError, ("zero_stage", "float"))])
def test_bad_zero_stage_raises_naming_it(tmp_path, value, error, words):
    with pytest.raises(error) as raised:
        arguments(tmp_path, zero_stage=value)
    assert all(word in str(raised.value) for word in words), raised.value


def test_zero_stage_1_with_sgd_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"zero_stage=1 shards AdamW's state .*SGD"):
        arguments(tmp_path, zero_stage=1, optim="sgd")


def test_zero_stage_round_trips_through_json(tmp_path):
    args = arguments(tmp_path, zero_stage=1)
    assert gt.TrainingArguments.from_dict(args.to_dict()).zero_stage == 1
    assert arguments(tmp_path).zero_stage == 0


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_one_process_with_zero_stage_1_is_zero_stage_0(tmp_path, device):
    """Without other ranks there is nothing to shard: the optimizer is whole, the run the same."""
    runs = []
    for stage in (0, 1):
        trainer = gt.Trainer(model(), arguments(tmp_path / str(stage), zero_stage=stage, max_grad_norm=0.5,
                                                device=device), train_dataset=data())
        trainer.train()
        assert trainer.optimizer.zero_stage == stage and trainer.optimizer._shard is None
        assert ("zero_stage 1 (one process: the whole state)" in trainer._startup_block()) == (stage == 1)
        runs.append((trainer.model.state_dict(), [e for e in trainer.state.log_history if "loss" in e]))
    assert runs[0][1] == runs[1][1]
    assert all(np.array_equal(v, runs[1][0][k]) for k, v in runs[0][0].items())
