"""Checkpoints and exact resume: a run stopped at a step, or killed with SIGKILL at a random step
(in a subprocess), and resumed ends bit-identical to an uninterrupted run -- weights, optimizer
state, EMA, scheduler and the dropout stream -- with dropout, accumulation and a short last group."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")

import gputrain as gt  # noqa: E402
from gputrain import checkpoint as ckpt  # noqa: E402

# The run, shared by this process and the subprocesses (exec'd in both).
SETUP = r"""
import numpy as np
import gputrain as gt

def make_trainer(output_dir, precision="bf16", callbacks=(), ready_loader=False, **overrides):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((203, 12)).astype(np.float32)   # 203 rows: a short last group
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + 2 * (x[:, 2] > 0.5)
    gt.random.manual_seed(3)
    model = gt.nn.Sequential(gt.nn.Linear(12, 32), gt.nn.GELU(), gt.nn.Dropout(0.2), gt.nn.LayerNorm(32),
                             gt.nn.Linear(32, 4))
    options = dict(output_dir=output_dir, num_train_epochs=3, per_device_train_batch_size=16,
                   gradient_accumulation_steps=2, learning_rate=1e-2, weight_decay=0.01, warmup_steps=3,
                   lr_scheduler_type="cosine", save_strategy="steps", save_steps=1, logging_steps=4,
                   eval_strategy="steps", eval_steps=5, ema_decay=0.9, disable_tqdm=True,
                   fp16=precision == "fp16", bf16=precision == "bf16", seed=7)
    options.update(overrides)
    args = gt.TrainingArguments(**options)
    train = gt.DataLoader((x, y), batch_size=16, shuffle=True, seed=7) if ready_loader else (x, y)
    return gt.Trainer(model, args, train_dataset=train, eval_dataset=(x[:50], y[:50]),
                      compute_metrics=gt.metrics.classification_metrics("macro"), callbacks=list(callbacks))


def snapshot(trainer):
    opt = trainer.optimizer.state_dict()["state"]
    return {"model": trainer.model.state_dict(),
            "optimizer": {(i, k): np.asarray(v) for i, s in opt.items() for k, v in s.items()},
            "ema": trainer.ema.shadow, "lr": trainer.lr_scheduler.get_last_lr(),
            "dropout_step": trainer.model.compiled.step, "global_step": trainer.state.global_step,
            "log": [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
                    for e in trainer.state.log_history]}


def assert_identical(a, b):
    assert a["global_step"] == b["global_step"]
    assert a["dropout_step"] == b["dropout_step"]
    assert a["lr"] == b["lr"]
    for name in a["model"]:
        assert np.array_equal(a["model"][name], b["model"][name]), name
    assert a["optimizer"].keys() == b["optimizer"].keys()
    for key in a["optimizer"]:
        assert np.array_equal(a["optimizer"][key], b["optimizer"][key]), key
    for x, y in zip(a["ema"], b["ema"]):
        assert np.array_equal(x, y)
"""
namespace: dict = {}
exec(SETUP, namespace)
make_trainer, snapshot, assert_identical = namespace["make_trainer"], namespace["snapshot"], namespace["assert_identical"]


class StopAt(gt.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    trainer = make_trainer(str(tmp_path_factory.mktemp("reference")), save_strategy="no")
    trainer.train()
    return snapshot(trainer)


def test_uninterrupted_run_is_deterministic(reference, tmp_path):
    trainer = make_trainer(str(tmp_path), save_strategy="no")
    trainer.train()
    assert_identical(snapshot(trainer), reference)
    assert trainer.state.global_step == 21  # 203 rows / 32 = 7 steps per epoch (the 7th: 11 rows)


@pytest.mark.parametrize("resumed_options", [{}, {"dataloader_num_workers": 2, "dataloader_prefetch_factor": 3},
                                             {"ready_loader": True}])
def test_stop_and_resume_is_bit_identical(reference, tmp_path, resumed_options):
    """Also when the resumed run loads with worker threads, or from a DataLoader it is given
    (whose batches it groups into steps itself): the same rows, the same weights."""
    first = make_trainer(str(tmp_path), callbacks=[StopAt(9)], ready_loader=resumed_options.get("ready_loader", False))
    first.train()
    assert first.state.global_step == 9
    resumed = make_trainer(str(tmp_path), **resumed_options)
    resumed.train(resume_from_checkpoint=True)
    result = snapshot(resumed)
    assert_identical(result, reference)
    # the logged training losses after the resume are those of the uninterrupted run
    losses = [e["loss"] for e in result["log"] if "loss" in e and e["step"] > 9]
    expected = [e["loss"] for e in reference["log"] if "loss" in e and e["step"] > 9]
    assert losses == expected
    with open(os.path.join(str(tmp_path), "history.jsonl")) as f:  # no entry twice after the resume
        assert [json.loads(line) for line in f] == json.loads(json.dumps(resumed.state.log_history))


def rehash(directory, name):
    """The manifest's entry of an edited file, rewritten to the file's new bytes."""
    manifest_path = os.path.join(directory, ckpt.MANIFEST_NAME)
    with open(manifest_path) as f:
        manifest = json.load(f)
    with open(os.path.join(directory, name), "rb") as f:
        data = f.read()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


def test_resume_without_the_dropout_position_diverges(reference, tmp_path):
    """The regression the exact resume guards against: the dropout stream's position matters."""
    make_trainer(str(tmp_path), callbacks=[StopAt(9)]).train()
    state_path = os.path.join(str(tmp_path), "checkpoint-9", "gputrain_state.json")
    with open(state_path) as f:
        state = json.load(f)
    state["model_step"] = 0
    with open(state_path, "w") as f:
        json.dump(state, f)
    rehash(os.path.join(str(tmp_path), "checkpoint-9"), "gputrain_state.json")  # else the manifest refuses it
    resumed = make_trainer(str(tmp_path))
    resumed.train(resume_from_checkpoint=os.path.join(str(tmp_path), "checkpoint-9"))
    assert not np.array_equal(resumed.model.state_dict()["0.weight"], reference["model"]["0.weight"])


CHILD = SETUP + r"""
import os, signal, sys
from gputrain import checkpoint as ckpt

output_dir, kill_step, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class Kill(gt.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == kill_step and mode == "step":
            os.kill(os.getpid(), signal.SIGKILL)

if mode == "saving":  # killed in the middle of writing checkpoint-<kill_step>
    write = ckpt.save_optimizer
    def save_optimizer(directory, optimizer):
        if directory.endswith(f"-{kill_step}"):
            os.kill(os.getpid(), signal.SIGKILL)
        write(directory, optimizer)
    ckpt.save_optimizer = save_optimizer

make_trainer(output_dir, callbacks=[Kill()]).train()
"""


RESUME_AND_COMPARE = SETUP + r"""
import sys
resumed = make_trainer(sys.argv[1])
resumed.train(resume_from_checkpoint=True)
straight = make_trainer(sys.argv[2], save_strategy="no")
straight.train()
assert_identical(snapshot(resumed), snapshot(straight))
print("identical")
"""


@pytest.mark.parametrize("mode", ["step", "saving"])
def test_sigkill_at_a_random_step_then_resume_is_bit_identical(tmp_path, mode):
    kill_step = int(np.random.default_rng().integers(2, 20))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(kill_step), mode], env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    last = ckpt.get_last_checkpoint(str(tmp_path))
    assert last is not None and last.endswith(f"checkpoint-{kill_step - 1}"), (kill_step, os.listdir(tmp_path))
    # The resume and the uninterrupted run also run in a child: a child may run on another CPU
    # model than this process (under qemu-user, exec'd children run on the host CPU), and runs on
    # different CPUs may differ in their last bits.
    check = subprocess.run([sys.executable, "-c", RESUME_AND_COMPARE, str(tmp_path), str(tmp_path / "straight")],
                           env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and check.stdout.strip().splitlines()[-1] == "identical", check.stderr  # after the log lines
    assert not any(name.startswith(".tmp-") for name in os.listdir(tmp_path))


def test_fp16_scaler_state_resumes_exactly(tmp_path):
    straight = make_trainer(str(tmp_path / "a"), precision="fp16", save_strategy="no", max_steps=8)
    straight.train()
    make_trainer(str(tmp_path / "b"), precision="fp16", max_steps=8, callbacks=[StopAt(5)]).train()
    resumed = make_trainer(str(tmp_path / "b"), precision="fp16", max_steps=8)
    resumed.train(resume_from_checkpoint=True)
    assert_identical(snapshot(resumed), snapshot(straight))
    assert resumed.scaler.state_dict() == straight.scaler.state_dict()


def test_checkpoint_files_and_save_total_limit(tmp_path):
    trainer = make_trainer(str(tmp_path), max_steps=6, save_total_limit=2, eval_strategy="no")
    trainer.train()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-5", "checkpoint-6", "history.jsonl"]
    files = sorted(os.listdir(tmp_path / "checkpoint-6"))
    assert files == ["ema.json", "gputrain_state.json", "manifest.json", "model.safetensors",
                     "model_ema.safetensors", "optimizer.json", "optimizer.safetensors", "scheduler.json",
                     "trainer_state.json", "training_args.json"]
    weights = ckpt.load_arrays(str(tmp_path / "checkpoint-6" / "model.safetensors"))
    for name, value in trainer.model.state_dict().items():
        assert np.array_equal(weights[name], value)
    state = gt.TrainerState.from_json_string((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert state.global_step == 6
    args = gt.TrainingArguments.from_json_file(tmp_path / "checkpoint-6" / "training_args.json")
    assert args == trainer.args


def test_best_checkpoint_survives_pruning_and_is_loaded_at_the_end(tmp_path):
    trainer = make_trainer(str(tmp_path), max_steps=12, save_steps=3, eval_steps=3, save_total_limit=1,
                           load_best_model_at_end=True, metric_for_best_model="loss")
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    best = min(evals, key=lambda e: e["eval_loss"])
    assert trainer.state.best_metric == best["eval_loss"]
    assert trainer.state.best_model_checkpoint == str(tmp_path / f"checkpoint-{best['step']}")
    kept = sorted(name for name in os.listdir(tmp_path) if name.startswith("checkpoint-"))
    assert f"checkpoint-{best['step']}" in kept and len(kept) <= 2
    saved = ckpt.load_arrays(os.path.join(trainer.state.best_model_checkpoint, "model.safetensors"))
    for name, value in trainer.model.state_dict().items():
        assert np.array_equal(saved[name], value)


def test_resume_true_without_checkpoint_raises(tmp_path):
    trainer = make_trainer(str(tmp_path))
    with pytest.raises(ValueError, match="No valid checkpoint found"):
        trainer.train(resume_from_checkpoint=True)
