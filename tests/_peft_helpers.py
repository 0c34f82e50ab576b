"""What tests/test_peft.py (LoRA and DoRA against PEFT) and tests/test_qlora.py (LoRA on a 4-bit base)
share: the fixture folders, PEFT's file keys, the float64 LoRA reference and its dropout mask, the
checks against PEFT's loss and gradients and of what training moves, and the check that a refused
input left the model as it was."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain as gt

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "fixtures", "hf", "llama-tiny")
LORA = os.path.join(HERE, "fixtures", "peft", "llama-tiny-lora")  # PEFT's adapter: B non-zero, all projections
DORA = os.path.join(HERE, "fixtures", "peft", "llama-tiny-dora")
ADAPTER = (".lora_A.", ".lora_B.")  # what the names of a LoRA adapter's parameters hold


def relative_error(actual, expected):
    return float(np.linalg.norm(np.asarray(actual, np.float64) - expected) / np.linalg.norm(expected))


def internal_name(key):
    """PEFT's file key -> the parameter's name in the model (PEFT's state_dict: adapter 'default')."""
    if key.endswith(".lora_magnitude_vector"):
        return key + ".default.weight"
    return key.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")


def grad_keys(ref):
    """The file keys of the adapter tensors whose gradients a fixture holds (its grad/<key> entries)."""
    return [k.removeprefix("grad/") for k in ref.files if k.startswith("grad/")]


def assert_peft_s_loss_and_gradients(model, ref):
    """One cross-entropy step of `model` on the fixture's batch gives PEFT's loss (1e-5) and the
    gradient of every adapter tensor the fixture holds (1e-4, relative)."""
    out = gt.TrainStep(model, gt.nn.CrossEntropyLoss())(ref["input_ids"], model.shift_labels(ref["labels"]),
                                                        attention_mask=ref["attention_mask"])
    assert out.loss == pytest.approx(float(ref["loss"]), rel=1e-5)
    params = dict(model.named_parameters())
    for key in grad_keys(ref):
        assert relative_error(params[internal_name(key)].grad, ref[f"grad/{key}"]) <= 1e-4, key


def lora_reference(x, w, b, a, bb, scaling, dy, mask=None):
    """y = x W^T + b + s (mask x) A^T B^T and dB, dA, dx for upstream dy (float64)."""
    xd = x if mask is None else x * mask
    h = xd @ a.T
    y = x @ w.T + b + scaling * h @ bb.T
    dh = scaling * dy @ bb
    dx = dy @ w + (dh @ a if mask is None else (dh @ a) * mask)
    return y, scaling * dy.T @ h, dh.T @ xd, dx


def training_case(model, p):
    """Puts `model`, Sequential(Linear(4, n), LoraLinear(..., lora_dropout=p)) compiled with seed 99, in
    training and gives the numbers of a check against lora_reference: x (7, 4) float32, an MSE target
    (7, out) float64, the adapter's input (float64) and its dropout mask (0 or 1 / (1 - p); None for p = 0).
    The adapter's dropout is the model's Philox dropout of its input: a Dropout layer with the same model
    seed and layer id (the first dropout layer of both models) drops the same inputs, which gives the mask."""
    probe = gt.nn.Sequential(gt.nn.Linear(4, model[0].out_features), gt.nn.Dropout(p))
    probe._compile("cpu", seed=99)
    probe[0].load_state_dict(model[0].state_dict())
    model.train(), probe.train()
    x = np.random.default_rng(1).normal(size=(7, 4)).astype(np.float32)
    target = np.random.default_rng(2).normal(size=(7, model[1].base_layer.out_features))
    hidden = x.astype(np.float64) @ model[0].weight.data.T.astype(np.float64) + model[0].bias.data
    mask = np.where(probe(x) == 0, 0.0, 1.0 / (1.0 - p)) if p else None
    return x, target, hidden, mask


def assert_only_moved(before, after, moving):
    """Of the state dict `before`, exactly the tensors whose names hold one of `moving` differ in `after`."""
    for name, value in before.items():
        moved = not np.array_equal(after[name], value)
        assert moved == any(part in name for part in moving), name


def assert_training_moves_only_the_adapter(model, batch):
    """Eight AdamW steps (lr 1e-2) of `model` in training on `batch`: the loss falls by more than a tenth
    and only the adapter's A and B move."""
    model.train()
    before = model.state_dict()
    opt = gt.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), opt)
    labels = model.shift_labels(batch["labels"])
    losses = [step(batch["input_ids"], labels, attention_mask=batch["attention_mask"]).loss for _ in range(8)]
    assert losses[-1] < 0.9 * losses[0]
    assert_only_moved(before, model.state_dict(), ADAPTER)


def assert_trainer_fine_tunes(model, output_dir, moving, **arguments):
    """A Trainer on `model`, 12 steps of batch 8 over 32 short patterned sequences (lr 1e-2, a loss
    logged every 4 steps, more TrainingArguments in `arguments`): the logged loss falls and only the
    parameters whose names hold one of `moving` change."""
    ids = np.stack([(np.arange(10) * (i % 5 + 1) + i % 7) % 90 + 3 for i in range(32)]).astype(np.int64)
    data = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}
    before = model.state_dict()
    args = gt.TrainingArguments(output_dir=str(output_dir), max_steps=12, per_device_train_batch_size=8,
                                learning_rate=1e-2, save_strategy="no", report_to="none", disable_tqdm=True,
                                logging_steps=4, **arguments)
    trainer = gt.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert_only_moved(before, model.state_dict(), moving)


def snapshot(model):
    return [(n, type(m).__name__) for n, m in model.named_modules()], model.state_dict()


def assert_unchanged(model, before):
    names, state = snapshot(model)
    assert names == before[0]
    assert all(np.array_equal(state[k], v) for k, v in before[1].items())


def adapted_with_acting_b(model, seed):
    """`model` with a LoRA adapter (r 4, alpha 8, all linear layers, seed `seed`) whose B is 0.01
    everywhere, so that the adapter's path changes the output from the first step."""
    gt.random.manual_seed(seed)
    peft = gt.peft.get_peft_model(model, gt.peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for _, lora in peft.lora_layers():
        b = lora.lora_B.default.weight
        b.data = np.full(b.data.shape, 0.01, np.float32)
    return peft
