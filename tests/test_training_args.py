"""TrainingArguments: Hugging Face's defaults, its checks with clear messages, and dict/JSON round trips."""

from __future__ import annotations

import dataclasses

import pytest

import gputrain as gt

TA = gt.TrainingArguments


def test_defaults_are_hugging_faces():
    args = TA()
    expected = dict(output_dir="trainer_output", num_train_epochs=3.0, max_steps=-1, per_device_train_batch_size=8,
                    per_device_eval_batch_size=8, gradient_accumulation_steps=1, learning_rate=5e-5,
                    weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
                    lr_scheduler_type="linear", warmup_ratio=0.0, warmup_steps=0, logging_steps=500,
                    eval_strategy="no", save_strategy="steps", save_steps=500, save_total_limit=None,
                    load_best_model_at_end=False, metric_for_best_model=None, seed=42, fp16=False, bf16=False,
                    tf32=None, gradient_checkpointing=False, auto_find_batch_size=False,
                    label_smoothing_factor=0.0, optim="adamw_torch", dataloader_num_workers=0,
                    dataloader_prefetch_factor=None, dataloader_pin_memory=True,
                    dataloader_persistent_workers=False, dataloader_drop_last=False)
    for name, value in expected.items():
        assert getattr(args, name) == value, name
    assert args.precision == "fp32"


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(fp16=True, bf16=True), ValueError, "At most one of fp16 and bf16"),
    (dict(eval_strategy="sometimes"), ValueError, "eval_strategy must be one of"),
    (dict(eval_strategy="steps", eval_steps=None, logging_steps=0, logging_strategy="no"), ValueError,
     "requires either non-zero --eval_steps or --logging_steps"),
    (dict(logging_steps=0), ValueError, "requires non-zero --logging_steps"),
    (dict(save_steps=2.5), ValueError, "--save_steps must be an integer if bigger than 1"),
    (dict(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="steps"), ValueError,
     "requires the save and eval strategy to match"),
    (dict(load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps", eval_steps=30, save_steps=50),
     ValueError, "round multiple of the evaluation steps"),
    (dict(warmup_ratio=1.5), ValueError, r"warmup_ratio must lie in range \[0,1\]"),
    (dict(lr_scheduler_type="exponential"), ValueError, "is not a valid SchedulerType"),
    (dict(optim="adafactor"), ValueError, "optim must be one of"),
    (dict(dataloader_prefetch_factor=2), ValueError, "dataloader_num_workers > 0"),
    (dict(dataloader_persistent_workers=True), ValueError, "dataloader_num_workers > 0"),
    (dict(per_device_train_batch_size=0), ValueError, "per_device_train_batch_size must be >= 1"),
    (dict(gradient_accumulation_steps=1.0), TypeError, "gradient_accumulation_steps must be an int"),
    (dict(learning_rate=-1.0), ValueError, "learning_rate must be in"),
    (dict(adam_beta2=1.0), ValueError, r"adam_beta2 must be in \[0, 1\)"),
    (dict(label_smoothing_factor=1.5), ValueError, "label_smoothing_factor must be in"),
    (dict(memory_limit=1 << 30, memory_fraction=0.5), ValueError, "at most one of memory_limit"),
    (dict(memory_fraction=0.0), ValueError, "memory_fraction must be in"),
    (dict(ema_decay=1.5), ValueError, "ema_decay must be in"),
    (dict(llrd=0.0), ValueError, "llrd must be in"),
    (dict(rdrop_alpha=-0.5), ValueError, "rdrop_alpha must be in"),
    (dict(cpu_offload_fraction=0.5, optim="sgd"), ValueError, "needs an AdamW optimizer"),
    (dict(device="tpu"), ValueError, "device must be"),
    (dict(bf16="yes"), TypeError, "bf16 must be a bool"),
    (dict(max_steps=0, num_train_epochs=0), ValueError, "nothing to train"),
])
def test_misconfigurations_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        TA(**kwargs)


def test_derived_values_follow_hugging_face():
    args = TA(eval_strategy="steps", logging_steps=20)
    assert args.eval_steps == 20  # eval_steps falls back on logging_steps
    best = TA(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch")
    assert best.metric_for_best_model == "loss" and best.greater_is_better is False
    assert TA(metric_for_best_model="accuracy").greater_is_better is True
    assert TA(warmup_ratio=0.1).get_warmup_steps(95) == 10
    assert TA(warmup_ratio=0.1, warmup_steps=3).get_warmup_steps(95) == 3
    assert TA(bf16=True).precision == "bf16"
    TA(load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps", eval_steps=0.1, save_steps=0.2)


def test_dict_and_json_round_trip(tmp_path):
    args = TA(output_dir=str(tmp_path), bf16=True, gradient_accumulation_steps=4, ema_decay=0.999,
              lr_scheduler_kwargs={"num_cycles": 0.25}, eval_strategy="epoch", save_strategy="epoch")
    assert TA.from_dict(args.to_dict()) == args
    path = tmp_path / "args.json"
    args.to_json_file(path)
    assert TA.from_json_file(path) == args
    assert set(args.to_dict()) == {f.name for f in dataclasses.fields(TA)}
    with pytest.raises(TypeError, match=r"unknown arguments \['learning_rat'\]"):
        TA.from_dict({"learning_rat": 1e-3})
