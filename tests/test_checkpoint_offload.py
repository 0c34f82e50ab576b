"""Gradient checkpointing with the units' kept outputs offloaded to pinned host memory
(gradient_checkpointing="offload", nn/plan.c and nn/container.c): the same bits as checkpointing on
the device (decoder layers, GPT-2's residual blocks, dropout, accumulation, a frozen prefix, LoRA),
a plan whose device part stops growing with the layers while its pinned part grows by one layer
input a layer, a sim run that peaks at that plan in both pools, and clear refusals."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import _reference as ref
import gputrain as gt
from gputrain import nn
from gputrain.memory_plan import plan_training
from gputrain.models import GPT
from test_memory_plan import measured

with open(os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama-tiny", "config.json")) as f:
    LLAMA = json.load(f)
ROWS, SEQ = 4, 12


def llama(layers: int = 5):
    gt.random.manual_seed(3)
    return gt.models.LlamaForCausalLM(dict(LLAMA, num_hidden_layers=layers))


def tokens(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, LLAMA["vocab_size"], (ROWS, SEQ)), rng.integers(0, LLAMA["vocab_size"], (ROWS, SEQ))


def train(model, checkpointing, device="cpu", precision="bf16", steps=3, micro_batches=2):
    """Losses of `steps` AdamW steps, then the parameters and the last gradients."""
    model = model.to(device)
    x, y = tokens()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-2),
                        precision=precision, gradient_checkpointing=checkpointing, micro_batches=micro_batches)
    losses = [step(x, y).loss for _ in range(steps)]
    assert model.compiled.checkpointing == checkpointing
    return losses, model.compiled.read_parameters(), model.compiled.read_gradients()


def assert_same_run(a, b):
    assert a[0] == b[0]
    assert ref.same_bits(a[1], b[1]) and ref.same_bits(a[2], b[2])


@pytest.mark.parametrize("device", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_offloaded_decoder_layers_train_with_the_same_bits(device, precision):
    # 6 layers: 5 offloaded units share two slots, 3 of them copied back in backward
    kept, offloaded = (train(llama(6), mode, device, precision) for mode in (True, "offload"))
    assert_same_run(kept, offloaded)


def residual_stack(units: int = 5):
    gt.random.manual_seed(0)
    blocks = [nn.Residual(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU(), nn.Dropout(0.2)) for _ in range(units)]
    return nn.Sequential(nn.Linear(8, 16), *blocks, nn.Linear(16, 3))


def test_offloaded_residual_units_with_dropout_give_the_same_bits():
    """Residual units side by side: each one's sum goes to its slot and the host, and the dropout
    keys of the recomputed blocks are replayed from the inputs copied back."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 3, 6)
    runs = []
    for mode in (True, "offload"):
        model = residual_stack()
        out = gt.TrainStep(model, nn.CrossEntropyLoss(), gradient_checkpointing=mode, micro_batches=3)(x, y)
        runs.append((out.loss, model.compiled.read_gradients()))
    assert runs[0][0] == runs[1][0] and ref.same_bits(runs[0][1], runs[1][1])
    assert residual_stack().compiled.plan(x.shape, checkpointing="offload")["checkpoint_offload"] == 4 * 6 * 16 * 4  # 4 f32 sums


def test_runs_shorter_than_four_units_keep_their_outputs():
    """Two slots would not hold fewer outputs: GPT-2's blocks (two Residuals each) and a run of three
    units plan as with checkpointing on the device."""
    gpt = GPT(vocab_size=23, block_size=12, n_layer=3, n_head=2, n_embd=16)
    for model, shape in ((gpt, (3, 10)), (residual_stack(3), (6, 8))):
        plan = model.compiled.plan(shape, checkpointing="offload")
        assert plan == model.compiled.plan(shape, checkpointing=True) | {"checkpoint_offload": 0}


def test_a_frozen_prefix_skips_its_copies_and_keeps_the_bits():
    """Layers before the first that trains run no backward: their inputs are not copied back."""
    runs = []
    for mode in (True, "offload"):
        model = llama(6)
        for name, p in model.named_parameters():
            if name.startswith(("model.embed_tokens", "model.layers.0.", "model.layers.1.", "model.layers.2.")):
                p.requires_grad = False
        runs.append(train(model, mode))
    assert_same_run(*runs)


def test_lora_adapters_on_offloaded_layers_give_the_same_bits():
    runs = []
    for mode in (True, "offload"):
        config = gt.peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear")
        runs.append(train(gt.peft.get_peft_model(llama(5), config), mode, steps=2))
    assert_same_run(*runs)


def test_the_device_keeps_three_layer_inputs_and_pinned_memory_the_rest():
    def aligned(n: int) -> int:
        return -(-n // 64) * 64

    layer_input = aligned(ROWS * SEQ * LLAMA["hidden_size"] * 2)  # (rows, seq, hidden) bf16
    for layers in (4, 6, 9):
        plans = {mode: plan_training(llama(layers), (ROWS, 3, SEQ), precision="bf16", checkpointing=mode)
                 for mode in (True, "offload")}
        kept, offloaded = plans[True], plans["offload"]
        assert offloaded["pinned"]["checkpoint_offload"] == (layers - 1) * layer_input
        assert "pinned" not in kept
        # two slots and the last layer's own buffer instead of one buffer a layer
        assert kept["cpu"]["activations"] - offloaded["cpu"]["activations"] == (layers - 3) * layer_input
        for name in ("recompute", "backward_scratch", "parameters", "gradients"):
            assert kept["cpu"][name] == offloaded["cpu"][name], name
        assert offloaded.settings["gradient_checkpointing"] == "offload"
        assert "activation arena with gradient_checkpointing=False" in offloaded.alternatives


def test_units_not_side_by_side_keep_their_outputs():
    """A unit whose next sibling is no unit is not offloaded (its reader may need it at any time)."""
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Residual(nn.Linear(8, 8)), nn.Linear(8, 8),
                          nn.Residual(nn.Linear(8, 8)), nn.Linear(8, 2))
    plan = model.compiled.plan((4, 8), checkpointing="offload")
    assert plan["checkpoint_offload"] == 0
    assert plan == model.compiled.plan((4, 8), checkpointing=True) | {"checkpoint_offload": 0}


@pytest.mark.sim
def test_a_sim_run_with_offloaded_checkpoints_peaks_at_its_plan_in_both_pools(tmp_path):
    from test_memory_plan import args

    ids, y = (np.concatenate([a, a]) for a in tokens())  # the 8 rows of a batch
    ones = np.ones_like(ids)
    x = nn.sequence.pack_decoder_inputs(ids, ones, np.cumsum(ones, axis=1) - 1)
    model = llama(5).to("sim")
    with measured() as growth:
        gt.reset_peak_memory_stats("sim:0")
        trainer = gt.Trainer(model, args(tmp_path, device="sim", bf16=True, gradient_checkpointing="offload"),
                             train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
        device_peak = gt.memory_stats("sim:0")["peak_reserved_bytes"]
    assert plan["pinned"]["checkpoint_offload"] > 0
    assert device_peak == plan.total("sim:0"), str(plan)
    assert growth["pinned"] == plan.total("pinned"), str(plan)


def test_evaluation_after_offloaded_training_reads_the_same_outputs():
    x, _ = tokens()
    outputs = []
    for mode in (True, "offload"):
        model = llama(4)
        train(model, mode, steps=1)
        model.eval()
        outputs.append(model(x))
    assert ref.same_bits(outputs[0], outputs[1])


def test_an_unknown_checkpointing_mode_is_refused_by_name_and_changes_nothing():
    model = llama(2)
    with pytest.raises(ValueError, match="gradient_checkpointing must be True, False or 'offload', got 'host'"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), gradient_checkpointing="host")
    assert model.compiled.checkpointing is False
    with pytest.raises(ValueError, match="checkpointing must be True, False or \"offload\", got 'Offload'"):
        model.compiled.checkpointing = "Offload"
    with pytest.raises(ValueError, match="checkpointing must be True, False or \"offload\", got 1"):
        model.compiled.plan((2, 3, 4), checkpointing=1)
    assert model.compiled.checkpointing is False
    with pytest.raises(TypeError, match="gradient_checkpointing must be a bool or 'offload', got 'yes'"):
        gt.TrainingArguments(output_dir="unused", gradient_checkpointing="yes")
    assert gt.TrainingArguments(output_dir="unused", gradient_checkpointing="offload").gradient_checkpointing == "offload"
