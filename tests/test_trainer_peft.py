"""Trainer(model=get_peft_model(...)), as transformers' Trainer with a PEFT model: checkpoints and
save_model hold PEFT's adapter files (not the frozen base) and the trainable parameters' optimizer
state; a resume onto a freshly built base + get_peft_model continues bit-identically (LoRA, DoRA,
8-bit AdamW); load_best_model_at_end reloads the best adapter; auto_find_batch_size plans with the
adapter's memory; a checkpoint of another adapter (or none) is refused by name, with nothing changed.
On the tiny Llama fixture: every run is a few steps of 16 rows of 10 tokens."""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import logging
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("safetensors")

import safetensors.numpy  # noqa: E402

import gputrain as gt  # noqa: E402
from gputrain import memory_plan as mp  # noqa: E402
from gputrain.models import from_pretrained  # noqa: E402
from gputrain.peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "fixtures", "hf", "llama-tiny")
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors"}


def data(rows=16, tokens=10):
    ids = np.stack([(np.arange(tokens) * (i % 5 + 1) + i % 7) % 90 + 3 for i in range(rows)]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}


def adapted(seed=0, dtype=None, **config):
    """A freshly built base with an adapter (the same seed: the same dropout stream and initial adapter);
    dtype "bf16": its frozen Linear weights in bf16 alone."""
    gt.random.manual_seed(seed)
    options = dict(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
    options.update(config)
    return get_peft_model(from_pretrained(BASE, dtype=dtype), LoraConfig(**options))


def trainer(model, output_dir, eval_dataset=None, compute_metrics=None, **overrides):
    options = dict(output_dir=str(output_dir), max_steps=6, per_device_train_batch_size=4,
                   gradient_accumulation_steps=2, learning_rate=1e-2, warmup_steps=2, lr_scheduler_type="cosine",
                   save_strategy="steps", save_steps=3, logging_steps=1, report_to="none", disable_tqdm=True,
                   seed=7)
    options.update(overrides)
    return gt.Trainer(model=model, args=gt.TrainingArguments(**options), train_dataset=data(),
                      eval_dataset=eval_dataset, compute_metrics=compute_metrics)


def losses(t):
    return [(h["step"], h["loss"]) for h in t.state.log_history if "loss" in h]


def optimizer_state(t):
    return {(i, k): np.asarray(v).copy() for i, s in t.optimizer.state_dict()["state"].items() for k, v in s.items()}


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


@pytest.mark.native_only  # a Trainer run end to end: its kernels run under qemu in the quicker tests
def test_a_checkpoint_holds_peft_s_adapter_files_and_the_adapter_s_optimizer_state(tmp_path):
    model = adapted()
    t = trainer(model, tmp_path / "peft", max_steps=3)
    t.train()
    folder = tmp_path / "peft" / "checkpoint-3"
    names = set(os.listdir(folder))
    assert ADAPTER_FILES <= names and "model.safetensors" not in names
    files = model.adapter_files()  # what save_pretrained writes, to the byte
    for name in ADAPTER_FILES:
        assert (folder / name).read_bytes() == files[name], name
    manifest = json.loads((folder / "manifest.json").read_text())["files"]
    assert ADAPTER_FILES <= set(manifest)  # hashed like every other file of the checkpoint
    stored = safetensors.numpy.load_file(str(folder / "adapter_model.safetensors"))
    assert len(stored) == 8 and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in stored)
    assert not np.array_equal(stored["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"], 0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = safetensors.numpy.load_file(str(folder / "optimizer.safetensors"))
    assert {key.partition(".")[0] for key in optimizer} == {str(i) for i in range(len(trainable))}
    assert sum(v.size for v in optimizer.values()) == 2 * sum(p.numel() for p in trainable)  # exp_avg, exp_avg_sq
    # PEFT's loader reads it: the trained adapter on a fresh base
    loaded = PeftModel.from_pretrained(from_pretrained(BASE), str(folder))
    for key, value in loaded.state_dict().items():
        assert np.array_equal(value, model.state_dict()[key]), key

    # the same run fine-tuning the whole model: its checkpoint holds every weight and its moments
    gt.random.manual_seed(0)
    full = trainer(from_pretrained(BASE), tmp_path / "full", max_steps=3)
    full.train()
    full_bytes, peft_bytes = folder_bytes(tmp_path / "full" / "checkpoint-3"), folder_bytes(folder)
    assert peft_bytes * 10 < full_bytes, (peft_bytes, full_bytes)

    t.save_model(str(tmp_path / "saved"))
    assert set(os.listdir(tmp_path / "saved")) == ADAPTER_FILES | {"training_args.json"}
    assert (tmp_path / "saved" / "adapter_model.safetensors").read_bytes() == files["adapter_model.safetensors"]


def test_a_parameter_trained_outside_the_adapter_is_refused_by_name(tmp_path):
    model = adapted()
    model.base_model.model.model.norm.weight.requires_grad = True  # would be lost: not in PEFT's files
    t = trainer(model, tmp_path, max_steps=1, save_steps=1)
    with pytest.raises(ValueError, match=r"'base_model\.model\.model\.norm\.weight' is trained but is not part"):
        t.train()
    assert not os.path.exists(tmp_path / "checkpoint-1")


TRAINER_OPTIONS = ("optim", "ema_decay", "bf16")
RESUMES = {"lora": {}, "dora": {"use_dora": True}, "bf16_base": {"dtype": "bf16", "bf16": True, "use_dora": True},
           "adamw_8bit": {"modules_to_save": ["lm_head"], "optim": "adamw_8bit"},  # lm_head: 6,144 >= min_8bit_size
           "ema": {"ema_decay": 0.9}}


@pytest.mark.native_only  # a Trainer run end to end: its kernels run under qemu in the quicker tests
@pytest.mark.parametrize("config", RESUMES.values(), ids=list(RESUMES))
def test_a_resume_onto_a_fresh_base_is_bit_identical_to_an_uninterrupted_run(tmp_path, config):
    config = dict(config)
    optim = {key: config.pop(key) for key in TRAINER_OPTIONS if key in config}
    whole = trainer(adapted(**config), tmp_path / "whole", **optim)
    whole.train()
    if "dtype" in config:  # the frozen projections hold their weights in bf16 alone
        assert sum(isinstance(m, gt.nn.QLinear) for m in whole.model.modules()) == 15  # 2 x 7 and the head
    if "optim" in optim:
        assert any(k == "state1" and v.dtype == np.uint8 for (_, k), v in optimizer_state(whole).items())
    fresh = adapted(**config)
    base = {k: v for k, v in fresh.state_dict().items() if ".lora_" not in k and "lm_head" not in k}
    resumed = trainer(fresh, tmp_path / "resumed", **optim)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    assert resumed.state.global_step == 6
    assert losses(resumed) == losses(whole) and len(losses(whole)) == 6  # steps 1-3 from the checkpoint's history
    a, b = whole.model.adapter_state_dict(), resumed.model.adapter_state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    a, b = optimizer_state(whole), optimizer_state(resumed)
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert resumed.model.compiled.step == whole.model.compiled.step  # the dropout stream
    if "ema_decay" in optim:
        a, b = whole.ema.state_dict()["shadow"], resumed.ema.state_dict()["shadow"]
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    for key, value in base.items():  # the frozen base is the fresh one's
        assert np.array_equal(resumed.model.state_dict()[key], value), key


@pytest.mark.native_only  # a Trainer run end to end: its kernels run under qemu in the quicker tests
def test_load_best_model_at_end_reloads_the_best_adapter(tmp_path):
    order = itertools.count()
    model = adapted()
    t = trainer(model, tmp_path, eval_dataset=data(8), eval_strategy="steps", eval_steps=2, save_steps=2,
                compute_metrics=lambda prediction: {"order": float(next(order))},  # the first evaluation is best
                load_best_model_at_end=True, metric_for_best_model="order", greater_is_better=False)
    t.train()
    assert t.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    best = safetensors.numpy.load_file(str(tmp_path / "checkpoint-2" / "adapter_model.safetensors"))
    last = safetensors.numpy.load_file(str(tmp_path / "checkpoint-6" / "adapter_model.safetensors"))
    now = model.adapter_state_dict()
    assert best.keys() == now.keys()
    for key in best:
        assert np.array_equal(now[key], best[key]), key
    assert any(not np.array_equal(best[key], last[key]) for key in best)


def rewrite_manifest(folder):
    """The manifest of the files as they are now: only the field checks can find the change."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (folder / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def check_refused(t, folder, match):
    """The resume raises CheckpointError matching `match` and changes neither the model nor the trainer."""
    weights, state, step = t.model.state_dict(), optimizer_state(t), t.state.global_step
    with pytest.raises(gt.CheckpointError, match=match):
        t.train(resume_from_checkpoint=str(folder))
    after = t.model.state_dict()
    assert weights.keys() == after.keys() and all(np.array_equal(weights[k], after[k]) for k in weights)
    assert optimizer_state(t).keys() == state.keys() and t.state.global_step == step


@pytest.mark.native_only  # a Trainer run end to end: its kernels run under qemu in the quicker tests
def test_a_checkpoint_of_another_adapter_or_none_is_refused_by_name_with_nothing_changed(tmp_path):
    trainer(adapted(), tmp_path / "peft", max_steps=3).train()
    folder = tmp_path / "peft" / "checkpoint-3"
    check_refused(trainer(from_pretrained(BASE), tmp_path / "plain"), folder,
                  r"adapter_model\.safetensors: the checkpoint holds a PEFT adapter and no base weights")
    check_refused(trainer(adapted(r=8), tmp_path / "r8"), folder,
                  r"adapter_config\.json: r: is 4 in the checkpoint, but the model's adapter has 8")
    check_refused(trainer(adapted(target_modules=["q_proj", "k_proj"]), tmp_path / "qk"), folder,
                  r"adapter_config\.json: target_modules: is \['q_proj', 'v_proj'\]")
    check_refused(trainer(adapted(use_dora=True), tmp_path / "dora"), folder, r"adapter_config\.json: use_dora")
    edited = tmp_path / "alpha_pattern"  # PEFT's per-module scaling, which gputrain does not implement
    shutil.copytree(folder, edited)
    config = json.loads((edited / "adapter_config.json").read_text())
    (edited / "adapter_config.json").write_text(json.dumps({**config, "alpha_pattern": {"q_proj": 32}}))
    rewrite_manifest(edited)
    check_refused(trainer(adapted(), tmp_path / "ap"), edited,
                  r"adapter_config\.json: alpha_pattern: is \{'q_proj': 32\} in the checkpoint, but the model's "
                  r"adapter has \{\}")
    gt.random.manual_seed(0)
    trainer(from_pretrained(BASE), tmp_path / "full", max_steps=3).train()
    check_refused(trainer(adapted(), tmp_path / "onto-peft"), tmp_path / "full" / "checkpoint-3",
                  r"model\.safetensors: the checkpoint holds a whole model and no PEFT adapter")


Q = "base_model.model.model.layers.0.self_attn.q_proj"
# (what is done to adapter_model.safetensors, the error's field and message)
TAMPERED = {
    "missing": (lambda a: a.pop(f"{Q}.lora_A.weight"), rf"{Q}\.lora_A\.weight: missing"),
    "unexpected": (lambda a: a.update({f"{Q}.lora_C.weight": a[f"{Q}.lora_A.weight"]}),
                   rf"{Q}\.lora_C\.weight: is not a tensor of the model's adapter"),
    "shape": (lambda a: a.update({f"{Q}.lora_A.weight": a[f"{Q}.lora_A.weight"][:2]}),
              rf"{Q}\.lora_A\.weight: has shape \(2, 64\)"),
    "float16": (lambda a: a.update({f"{Q}.lora_B.weight": a[f"{Q}.lora_B.weight"].astype(np.float16)}),
                rf"{Q}\.lora_B\.weight: stored as F16, expected F32"),
    "nan": (lambda a: a[f"{Q}.lora_B.weight"].__setitem__((0, 0), np.nan),
            rf"{Q}\.lora_B\.weight: holds NaN or infinite values"),
}


@pytest.mark.parametrize("change", TAMPERED.values(), ids=list(TAMPERED))
def test_adapter_tensors_that_are_not_the_model_s_are_refused_by_name_with_nothing_changed(tmp_path, change):
    trainer(adapted(), tmp_path / "peft", max_steps=3).train()
    folder = tmp_path / "peft" / "checkpoint-3"
    arrays = dict(safetensors.numpy.load_file(str(folder / "adapter_model.safetensors")))
    change[0](arrays)
    (folder / "adapter_model.safetensors").write_bytes(safetensors.numpy.save(arrays))
    rewrite_manifest(folder)
    t = trainer(adapted(), tmp_path / "resumed")
    check_refused(t, folder, r"adapter_model\.safetensors: " + change[1])
    with pytest.raises(gt.CheckpointError, match=change[1]):  # load_best_model_at_end's reader
        t._load_weights(str(folder))


@pytest.fixture
def memory_limit():
    yield lambda limit: gt.set_memory_limit(limit, "cpu")
    gt.set_memory_limit(None, "cpu")


def plan_of(t, micro_rows):
    """The PEFT model's memory_plan built from its parts, independently of the Trainer's own planning."""
    shape = (micro_rows, *t.train_dataloader._arrays[0].shape[1:])
    return mp.plan_training(t.model, shape, optimizer=mp.OptimizerSpec.of(t.optimizer, t.model),
                            loader=mp.LoaderSpec.of(t.train_dataloader))


def test_auto_find_batch_size_plans_with_the_adapter_s_memory(tmp_path, caplog, memory_limit):
    reference = trainer(adapted(), tmp_path / "ref", max_steps=2, save_strategy="no", per_device_train_batch_size=2,
                        gradient_accumulation_steps=4)
    needed = reference.memory_plan().total("cpu")
    assert reference.memory_plan() == plan_of(reference, 2)
    regions = reference.memory_plan()["cpu"]
    trainable = sum(p.numel() for p in reference.model.parameters() if p.requires_grad)
    assert regions["gradients"] < regions["parameters"] // 10  # the frozen base has no gradient
    assert regions["optimizer_state"] < 2 * 4 * trainable + 4096  # the adapter's two moments (+ alignment)
    gt.random.manual_seed(0)
    full = trainer(from_pretrained(BASE), tmp_path / "full", max_steps=2, save_strategy="no",
                   per_device_train_batch_size=2, gradient_accumulation_steps=4).memory_plan()
    assert full.total("cpu") > needed  # the limit below does not fit the whole model's run
    gc.collect()  # the whole model's Trainer is gone
    baseline = gt.memory_stats("cpu")["reserved_bytes"]  # before the model: its arenas are in the plan
    model = adapted()
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        fitted = trainer(model, tmp_path / "fit", max_steps=2, save_strategy="no", per_device_train_batch_size=8,
                         gradient_accumulation_steps=1, auto_find_batch_size=True, memory_limit=baseline + needed)
        fitted.train()
    assert fitted._micro_cap == 2 and "micro-batches of 2 rows instead of 8" in caplog.text
    assert fitted.memory_plan() == plan_of(fitted, 2) and fitted.memory_plan().total("cpu") == needed
    memory_limit(None)
    reference.train()
    assert losses(fitted) == losses(reference)  # the same micro-batches of the same rows: the same bits


def test_a_sim_run_peaks_at_the_adapter_s_plan(tmp_path):
    model = adapted().to("sim")
    gc.collect()
    gc.disable()
    try:
        gt.reset_peak_memory_stats("sim:0")
        t = trainer(model, tmp_path, max_steps=1, save_strategy="no", device="sim")
        plan = t.memory_plan()
        t.train()
        peak = gt.memory_stats("sim:0")["peak_reserved_bytes"]
    finally:
        gc.enable()
    assert t.state.global_step == 1
    assert plan == plan_of(t, 4)
    assert peak == plan.total("sim:0"), str(plan)
    assert plan["sim:0"]["gradients"] < plan["sim:0"]["parameters"] // 10
