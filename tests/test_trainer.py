"""Trainer: Hugging Face's gradient accumulation (N loader batches per step, one C call), the short
last group, evaluate/predict, callbacks and early stopping, logging without prints, EMA, groups."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

import gputrain as gt

nn = gt.nn


def data(rows=100, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 10)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    return x, y


def model(dropout=0.0):
    gt.random.manual_seed(1)
    return nn.Sequential(nn.Linear(10, 16), nn.GELU(), nn.Dropout(dropout), nn.LayerNorm(16), nn.Linear(16, 3))


def args(tmp_path, **kwargs):
    options = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-2, save_strategy="no",
                   logging_steps=5, disable_tqdm=True, seed=3)
    options.update(kwargs)
    return gt.TrainingArguments(**options)


def test_accumulation_is_n_loader_batches_per_step(tmp_path):
    """One optimizer step = the mean loss over the rows of N consecutive loader batches (HF)."""
    x, y = data()
    m = model()
    before = {k: v.copy() for k, v in m.state_dict().items()}
    trainer = gt.Trainer(m, args(tmp_path, gradient_accumulation_steps=3, max_steps=1, optim="sgd",
                                 learning_rate=1.0, max_grad_norm=0.0, lr_scheduler_type="constant"),
                         train_dataset=(x, y))
    trainer.train()
    loader = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=3)
    rows = [np.array(b[0]) for _, b in zip(range(3), loader)]
    labels = [np.array(b[1]) for _, b in zip(range(3), gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=3))]
    reference = model()
    gt.TrainStep(reference, nn.CrossEntropyLoss())(np.concatenate(rows), np.concatenate(labels))
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(before[name] - m.state_dict()[name], p.grad, rtol=1e-4, atol=1e-6)


def test_short_last_group_and_step_counts(tmp_path):
    x, y = data(101)  # 13 batches of 8 (the last one 5 rows): groups of 4 -> 3 full + 1 short
    trainer = gt.Trainer(model(), args(tmp_path, gradient_accumulation_steps=4, num_train_epochs=2),
                         train_dataset=(x, y))
    out = trainer.train()
    assert out.global_step == trainer.state.global_step == 8
    assert trainer.state.epoch == 2.0
    dropped = gt.Trainer(model(), args(tmp_path, gradient_accumulation_steps=4, num_train_epochs=1,
                                       dataloader_drop_last=True), train_dataset=(x, y))
    assert dropped.train().global_step == 3  # 12 full batches: the 5-row batch is dropped, not the group


def test_a_ready_dataloader_is_grouped_into_the_same_steps(tmp_path):
    x, y = data(90, seed=2)
    a = gt.Trainer(model(0.1), args(tmp_path, gradient_accumulation_steps=2, num_train_epochs=2),
                   train_dataset=(x, y))
    a.train()
    loader = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=3)
    b = gt.Trainer(model(0.1), args(tmp_path, gradient_accumulation_steps=2, num_train_epochs=2),
                   train_dataset=loader)
    b.train()
    assert a.state.global_step == b.state.global_step == 12
    for name, value in a.model.state_dict().items():
        assert np.array_equal(value, b.model.state_dict()[name]), name


def test_evaluate_and_predict(tmp_path):
    x, y = data()
    trainer = gt.Trainer(model(), args(tmp_path, max_steps=5), train_dataset=(x, y), eval_dataset=(x[:30], y[:30]),
                         compute_metrics=gt.metrics.classification_metrics("micro"))
    trainer.train()
    metrics = trainer.evaluate()
    assert {"eval_loss", "eval_accuracy", "eval_f1_micro", "eval_runtime"} <= set(metrics)
    assert all(key.startswith("eval_") for key in metrics)
    logits = trainer.model.eval()(x[:30])
    assert metrics["eval_loss"] == pytest.approx(nn.CrossEntropyLoss()(logits, y[:30]), rel=1e-6)
    assert metrics["eval_accuracy"] == pytest.approx((logits.argmax(1) == y[:30]).mean())
    out = trainer.predict((x[30:60], y[30:60]))
    np.testing.assert_allclose(out.predictions, trainer.model(x[30:60]), rtol=1e-5, atol=1e-6)  # 8-row batches
    assert np.array_equal(out.label_ids, y[30:60])
    assert out.metrics["test_accuracy"] == pytest.approx((out.predictions.argmax(1) == y[30:60]).mean())
    assert trainer.state.log_history[-1]["eval_loss"] == metrics["eval_loss"]


def test_ema_weights_are_evaluated_and_saved(tmp_path):
    pytest.importorskip("safetensors")
    x, y = data()
    trainer = gt.Trainer(model(), args(tmp_path, max_steps=6, ema_decay=0.5, bf16=True), train_dataset=(x, y),
                         eval_dataset=(x, y))
    trainer.train()
    raw = trainer.model.state_dict()
    metrics = trainer.evaluate()
    with trainer.ema.average_parameters():
        trainer.model.compiled.refresh_half_parameters()
        expected = nn.CrossEntropyLoss()(trainer.model.eval()(x), y)
    trainer.model.compiled.refresh_half_parameters()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-6)
    for name, value in trainer.model.state_dict().items():
        assert np.array_equal(value, raw[name])  # the trained weights are back after evaluation
    trainer.save_model(str(tmp_path / "final"))
    from gputrain import checkpoint

    ema = checkpoint.load_arrays(str(tmp_path / "final" / "model_ema.safetensors"))
    for (name, _), shadow in zip(trainer.model.named_parameters(), trainer.ema.shadow):
        assert np.array_equal(ema[name], shadow)


class Recorder(gt.TrainerCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append("train_begin")

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        assert model is not None and optimizer is not None
        self.events.append(f"step{state.global_step}")
        if state.global_step == 3:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append("log")

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append("train_end")


def test_callbacks_see_events_and_can_stop(tmp_path):
    x, y = data()
    recorder = Recorder()
    trainer = gt.Trainer(model(), args(tmp_path, logging_steps=2, num_train_epochs=5), train_dataset=(x, y),
                         callbacks=[recorder])
    trainer.train()
    assert trainer.state.global_step == 3
    assert recorder.events == ["train_begin", "step1", "step2", "log", "step3", "log", "train_end"]


def test_early_stopping(tmp_path):
    x, y = data()
    scores = iter([0.5, 0.6, 0.6, 0.55, 0.9, 0.9])

    def compute_metrics(prediction):
        return {"score": next(scores)}

    trainer = gt.Trainer(model(), args(tmp_path, eval_strategy="steps", eval_steps=2, num_train_epochs=10,
                                       metric_for_best_model="score"),
                         train_dataset=(x, y), eval_dataset=(x, y), compute_metrics=compute_metrics,
                         callbacks=[gt.EarlyStoppingCallback(early_stopping_patience=2)])
    trainer.train()
    assert trainer.state.global_step == 8  # evaluations at 2, 4 (best 0.6), 6 and 8 do not improve
    assert trainer.state.best_metric == 0.6 and trainer.state.best_global_step == 4
    with pytest.raises(ValueError, match="requires metric_for_best_model"):
        gt.Trainer(model(), args(tmp_path, eval_strategy="steps", eval_steps=2), train_dataset=(x, y),
                   eval_dataset=(x, y), callbacks=[gt.EarlyStoppingCallback()]).train()
    with pytest.raises(ValueError, match="early_stopping_patience"):
        gt.EarlyStoppingCallback(0)


def test_logging_prints_dict_lines_and_jsonl_history(tmp_path, capsys, caplog):
    x, y = data()
    with caplog.at_level(logging.INFO, logger="gputrain"):
        trainer = gt.Trainer(model(), args(tmp_path, max_steps=10, logging_steps=5, auto_find_batch_size=True),
                             train_dataset=(x, y))
        trainer.train()
    printed = capsys.readouterr().out.splitlines()  # disable_tqdm=True: HF's PrinterCallback prints the logs
    assert [line.startswith("{'loss': '") for line in printed] == [True, True, False]
    assert "'train_runtime'" in printed[-1]
    startup = [r.getMessage() for r in caplog.records if "Running training" in r.getMessage()]
    assert len(startup) == 1
    for words in ("precision = fp32", "TF32", "Optimizer = AdamW", "offload fraction", "checkpointing",
                  "set_to_none", "workers", "Memory plan", "total", "optimizer_state", "loader_slots",
                  "micro-batches of at most 8 rows"):
        assert words in startup[0], words
    with open(os.path.join(tmp_path, "history.jsonl")) as f:
        history = [json.loads(line) for line in f]
    assert history == json.loads(json.dumps(trainer.state.log_history))
    assert [e["step"] for e in history if "loss" in e] == [5, 10]


def test_optimizer_groups_schedule_and_precision_follow_args(tmp_path):
    x, y = data()
    trainer = gt.Trainer(model(), args(tmp_path, weight_decay=0.1, warmup_ratio=0.5, lr_scheduler_type="cosine",
                                       max_steps=4, fp16=True, label_smoothing_factor=0.1),
                         train_dataset=(x, y))
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(p.data.ndim == 2 for p in groups[0]["params"])  # biases and LayerNorm weights: no decay
    assert trainer.lr_scheduler.get_last_lr() == [0.0, 0.0]  # warm-up from 0
    assert isinstance(trainer.scaler, gt.amp.GradScaler)
    assert trainer.loss_fn.label_smoothing == 0.1
    assert trainer.model.compiled.precision == "f16"
    sgd = gt.Trainer(model(), args(tmp_path, optim="sgd", llrd=0.5), train_dataset=(x, y))
    assert isinstance(sgd.optimizer, gt.optim.SGD)
    assert sorted({g["lr"] for g in sgd.optimizer.param_groups}) == [2.5e-3, 5e-3, 1e-2]


def test_misconfigurations_fail_at_construction(tmp_path):
    x, y = data()
    with pytest.raises(TypeError, match="train_dataset must be an"):
        gt.Trainer(model(), args(tmp_path), train_dataset=x)
    with pytest.raises(ValueError, match="same number of rows"):
        gt.Trainer(model(), args(tmp_path), train_dataset=(x, y[:5]))
    with pytest.raises(TypeError, match="args must be a gputrain.TrainingArguments"):
        gt.Trainer(model(), {"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="conflicts with loss_fn"):
        gt.Trainer(model(), args(tmp_path, label_smoothing_factor=0.1), loss_fn=nn.CrossEntropyLoss())
    m = model()
    gt.random.manual_seed(11)
    expected = gt.random.next_seed()
    gt.random.manual_seed(11)
    with pytest.raises(ValueError, match="no batch of per_device_train_batch_size"):
        gt.Trainer(m, args(tmp_path, dataloader_drop_last=True), train_dataset=(x[:5], y[:5]))
    assert gt.random.next_seed() == expected  # refused before anything changed (HF's set_seed included)
    with pytest.raises(ValueError, match="didn't pass an eval_dataset"):
        gt.Trainer(model(), args(tmp_path, eval_strategy="epoch"), train_dataset=(x, y))
    with pytest.raises(ValueError, match="requires a train_dataset"):
        gt.Trainer(model(), args(tmp_path)).train()
    with pytest.raises(ValueError, match="requires an eval_dataset"):
        gt.Trainer(model(), args(tmp_path)).evaluate()


def test_progress_bar_goes_to_stderr(tmp_path, capsys):
    pytest.importorskip("tqdm")
    x, y = data()
    trainer = gt.Trainer(model(), args(tmp_path, max_steps=4, disable_tqdm=False), train_dataset=(x, y))
    assert any(isinstance(c, gt.trainer_callback.ProgressCallback) for c in trainer.callback_handler.callbacks)
    trainer.train()
    captured = capsys.readouterr()
    assert "4/4" in captured.err  # the bar on stderr, the log lines above it on stdout (tqdm.write, as HF)
    assert captured.out.startswith("{'train_runtime': '") and len(captured.out.splitlines()) == 1
    quiet = gt.Trainer(model(), args(tmp_path, disable_tqdm=True), train_dataset=(x, y))
    assert not any(isinstance(c, gt.trainer_callback.ProgressCallback) for c in quiet.callback_handler.callbacks)


class SkipRestOfEpoch(gt.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_epoch_stop = True


def test_should_epoch_stop_skips_to_the_next_epoch(tmp_path):
    x, y = data(80)  # 10 batches of 8 per epoch
    trainer = gt.Trainer(model(), args(tmp_path, num_train_epochs=2), train_dataset=(x, y),
                         callbacks=[SkipRestOfEpoch()])
    trainer.train()
    assert trainer.state.global_step == 12  # 2 steps of epoch 0, then all 10 of epoch 1
    assert trainer.state.epoch == 2.0


def test_offload_and_checkpointing_args_reach_the_step_and_keep_the_result(tmp_path):
    x, y = data()
    plain = gt.Trainer(model(0.1), args(tmp_path, max_steps=4), train_dataset=(x, y))
    plain.train()
    tuned = gt.Trainer(model(0.1), args(tmp_path, max_steps=4, cpu_offload_fraction=0.5, gradient_checkpointing=True),
                       train_dataset=(x, y))
    assert tuned.optimizer.cpu_offload_fraction == 0.5 and tuned.model.compiled.checkpointing
    tuned.train()
    for name, value in plain.model.state_dict().items():
        assert np.array_equal(value, tuned.model.state_dict()[name]), name


def test_evaluation_during_training_does_not_change_the_training(tmp_path):
    """Evaluating (EMA swapped in, half copies refreshed, eval mode) leaves the dropout stream and
    the weights of the run exactly as without it."""
    x, y = data()
    options = dict(max_steps=8, ema_decay=0.9, bf16=True)
    quiet = gt.Trainer(model(0.2), args(tmp_path, **options), train_dataset=(x, y))
    quiet.train()
    watched = gt.Trainer(model(0.2), args(tmp_path, eval_strategy="steps", eval_steps=2, **options),
                         train_dataset=(x, y), eval_dataset=(x[:40], y[:40]))
    watched.train()
    assert len([e for e in watched.state.log_history if "eval_loss" in e]) == 4
    for name, value in quiet.model.state_dict().items():
        assert np.array_equal(value, watched.model.state_dict()[name]), name
    for a, b in zip(quiet.ema.shadow, watched.ema.shadow):
        assert np.array_equal(a, b)


def test_the_startup_block_says_when_another_precision_trains_faster_on_this_cpu(tmp_path):
    from gputrain._info import precision_note

    native = gt.info()["cpu_native_gemm"]
    assert native[0] == "fp32" and set(native) <= {"fp32", "bf16"}
    assert precision_note("fp32", native) == ""
    assert precision_note("bf16", ("fp32", "bf16")) == ""
    assert precision_note("bf16", ("fp32",)) == ("bf16 GEMMs are widened to f32 on this CPU (no AVX512_BF16 or AMX): "
                                                 "fp32 trains faster here")
    assert "bf16 (native here) trains faster" in precision_note("fp16", ("fp32", "bf16"))
    x, y = data()
    block = gt.Trainer(model(), args(tmp_path, max_steps=1, fp16=True), train_dataset=(x, y))._startup_block()
    assert ("Precision note: " + precision_note("fp16", native)) in block
    block = gt.Trainer(model(), args(tmp_path, max_steps=1), train_dataset=(x, y))._startup_block()
    assert "Precision note" not in block
