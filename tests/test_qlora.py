"""QLoRA: LoRA adapters (gputrain.peft) on a frozen 4-bit (or int8) base (QLinear, csrc/nn/qlinear.c).

The `lora` kind runs its QLinear base_layer through the qlinear kind (tile-by-tile dequantizing
GEMMs), so a QLoRA model is, to the GEMM's rounding, the float LoRA model whose base weights are the
dequantized NF4 weights: the "float twin" below (from_pretrained without quantization, each
quantized projection's weight overwritten by QLinear.dequantize()). Where the qlinear kind runs one
tile (every projection of the tiny Llama) its GEMMs have the shapes of the float base's, so the
twin's numbers agree to fp32 rounding (1e-6 relative, far below the ~1e-1 an NF4 weight moves the
logits); several tiles are checked against float64 NumPy. Adapters save as PEFT's files and load onto
the float base; DoRA and merge_and_unload on a quantized base are refused by name with nothing changed.
PEFT + bitsandbytes' own numbers (tests/fixtures/make_qlora_fixtures.py) are compared too.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import safetensors.numpy

import gputrain as gt
from gputrain import nn
from gputrain.models import from_pretrained
from gputrain.peft import LoraConfig, LoraLinear, PeftModel, get_peft_model

import _reference as ref
from _peft_helpers import (ADAPTER, BASE, DORA, HERE, LORA, assert_peft_s_loss_and_gradients,
                           assert_trainer_fine_tunes, assert_training_moves_only_the_adapter, assert_unchanged,
                           grad_keys, internal_name, lora_reference, relative_error, snapshot, training_case)
from _sim_steps import assert_sim_gives_the_cpu_bits_at_its_plan

BNB_NF4 = os.path.join(HERE, "fixtures", "hf", "llama-tiny-bnb-nf4")
QLORA = os.path.join(HERE, "fixtures", "peft", "llama-tiny-bnb-nf4-qlora")  # make_qlora_fixtures.py
INT8_QLORA = os.path.join(HERE, "fixtures", "peft", "llama-tiny-int8-qlora")  # make_int8_fixtures.py
BNB_INT8 = os.path.join(HERE, "fixtures", "hf", "llama-tiny-bnb-int8")  # make_int8_fixtures.py


@pytest.fixture(scope="module")
def batch():
    data = np.load(LORA + ".npz")
    return {k: data[k] for k in ("input_ids", "attention_mask", "labels")}


def float_twin(quantized):
    """The float model of the same folder whose quantized projections hold the dequantized weights
    (every other tensor is the quantized model's own)."""
    twin = from_pretrained(BASE)
    names = set(twin.state_dict())
    state = {k: v for k, v in quantized.state_dict().items() if k in names and v.dtype == np.float32}
    for name, module in quantized.named_modules():
        if isinstance(module, nn.QLinear):
            state[f"{name}.weight"] = module.dequantize()
    assert {k for k in names if k.endswith("_proj.weight")} <= set(state)
    twin.load_state_dict(state, strict=False)
    return twin


def step(model, batch, precision="fp32", **kwargs):
    return gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision, **kwargs)(
        batch["input_ids"], model.shift_labels(batch["labels"]), attention_mask=batch["attention_mask"])


def adapter_grads(model):
    return {n: p.grad.copy() for n, p in model.named_parameters() if p.requires_grad}


# -- the float twin ----------------------------------------------------------------------------
@pytest.mark.parametrize("folder,quantization", [(BASE, "nf4"), (BASE, "fp4"), (BASE, "int8"), (BNB_NF4, None)],
                         ids=["nf4", "fp4", "int8", "bnb-nf4-folder"])
def test_logits_loss_and_adapter_gradients_are_the_float_twin_s(folder, quantization, batch):
    """PEFT's adapter on the quantized base (4-bit or int8 quantized while loading, or bitsandbytes'
    own double-quantized 4-bit folder) against the same adapter on the float twin: fp32 rounding
    apart."""
    qbase = from_pretrained(folder, quantization=quantization)
    twin = PeftModel.from_pretrained(float_twin(qbase), LORA, is_trainable=True)
    model = PeftModel.from_pretrained(qbase, LORA, is_trainable=True)
    lora = model.get_submodule("base_model.model.model.layers.0.self_attn.o_proj")
    assert isinstance(lora, LoraLinear) and isinstance(lora.base_layer, nn.QLinear)
    mask = batch["attention_mask"].astype(bool)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    want = twin(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert relative_error(logits[mask], want[mask]) <= 1e-6
    float_lora = PeftModel.from_pretrained(from_pretrained(BASE), LORA)(batch["input_ids"],
                                                                         attention_mask=batch["attention_mask"])
    assert relative_error(logits[mask], float_lora[mask]) > 1e-3  # the rounding shows: the quantized base is used
    loss, twin_loss = step(model, batch).loss, step(twin, batch).loss
    assert loss == pytest.approx(twin_loss, rel=1e-6)
    grads, twin_grads = adapter_grads(model), adapter_grads(twin)
    assert set(grads) == set(twin_grads) and len(grads) == 28  # A and B of 14 projections, nothing else
    assert all(".lora_A." in n or ".lora_B." in n for n in grads)
    for name, grad in grads.items():
        assert relative_error(grad, twin_grads[name]) <= 1e-5, name


def test_bf16_is_the_float_twin_s_in_bf16(batch):
    """bf16: the qlinear kind dequantizes into a bf16 tile, the twin rounds its weight to bf16: the
    same values, the same GEMMs (one tile)."""
    qbase = from_pretrained(BASE, quantization="nf4")
    twin = PeftModel.from_pretrained(float_twin(qbase), LORA, is_trainable=True)
    model = PeftModel.from_pretrained(qbase, LORA, is_trainable=True)
    loss, twin_loss = step(model, batch, "bf16").loss, step(twin, batch, "bf16").loss
    assert loss == pytest.approx(twin_loss, rel=1e-3)
    fp32 = PeftModel.from_pretrained(from_pretrained(BASE, quantization="nf4"), LORA, is_trainable=True)
    assert loss == pytest.approx(step(fp32, batch).loss, rel=2e-2)
    grads, twin_grads = adapter_grads(model), adapter_grads(twin)
    for name, grad in grads.items():
        assert relative_error(grad, twin_grads[name]) <= 2e-2, name


# -- the kind alone, several tiles, against float64 NumPy ----------------------------------------
def small_qlora(p, tile_rows):
    """Linear(4, 96) -> LoRA(r=3, s=0.75) on QLinear(96, 48, nf4, bias): blocks of 64 span rows of 96;
    tile_rows 16: three tiles."""
    gt.random.manual_seed(11)
    w = (np.random.default_rng(0).standard_normal((48, 96)) * 0.05).astype(np.float32)
    q = nn.QLinear(96, 48, True, "nf4", 64, tile_rows).quantize_(w)
    q.load_state_dict({"bias": np.linspace(-0.5, 0.5, 48, dtype=np.float32)}, strict=False)
    lora = LoraLinear(q, r=3, lora_alpha=2.25, lora_dropout=p, init_lora_weights=False)
    return nn.Sequential(nn.Linear(4, 96), lora), lora


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("tile_rows", [0, 16])
def test_kind_on_a_quantized_base_matches_numpy(p, tile_rows, precision):
    """Forward, the adapter's gradients and the input gradient (through the Linear below) of an MSE,
    in training, against float64 with W = dequant(codes); dropout's mask from a probe Dropout with
    the same model seed and layer id (training_case, as tests/test_peft.py). fp32: 1e-5 (the GEMMs'
    f32 rounding, tiles summed in a different order); bf16: 3e-2 (inputs and tiles rounded to 8 bits)."""
    model, lora = small_qlora(p, tile_rows)
    model._compile("cpu", seed=99, precision=gt._vocab.c_dtype(precision))
    x, target, hidden, mask = training_case(model, p)
    w = lora.base_layer.dequantize().astype(np.float64)
    b = lora.base_layer.bias.data.astype(np.float64)
    a, bb = (lora.lora_A.default.weight.data.astype(np.float64), lora.lora_B.default.weight.data.astype(np.float64))
    y, *_ = lora_reference(hidden, w, b, a, bb, 0.75, np.zeros((7, 48)), mask)
    tol = 1e-5 if precision == "fp32" else 3e-2
    assert relative_error(model(x), y) <= tol
    gt.TrainStep(model, nn.MSELoss(), precision=precision)(x, target.astype(np.float32))
    dy = 2.0 * (y - target) / y.size
    _, dB, dA, dx = lora_reference(hidden, w, b, a, bb, 0.75, dy, mask)
    assert relative_error(lora.lora_B.default.weight.grad, dB) <= tol
    assert relative_error(lora.lora_A.default.weight.grad, dA) <= tol
    assert relative_error(model[0].weight.grad, dx.T @ x) <= tol
    assert lora.base_layer.bias.grad is None  # frozen with the base


@pytest.mark.sim
def test_a_sim_step_gives_the_cpu_bits_and_peaks_at_its_plan():
    """The sim device runs the CPU ops on its own streams and memory: a QLoRA step (three tiles,
    dropout) gives the CPU's bits and peaks exactly at the memory plan (the base's tile and the
    adapter's buffers are planned)."""
    def build():
        model, _ = small_qlora(0.25, 16)
        model._compile("cpu", seed=7)
        return model

    def make_step(model):
        params = [p for p in model.parameters() if p.requires_grad]
        return gt.TrainStep(model, nn.MSELoss(), gt.optim.AdamW(params, lr=1e-2), precision="bf16")

    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 48)).astype(np.float32))
               for _ in range(2)]
    assert_sim_gives_the_cpu_bits_at_its_plan(build, make_step, batches, (6, 4))


def test_checkpointing_gives_the_same_gradients(batch):
    model = PeftModel.from_pretrained(from_pretrained(BASE, quantization="nf4"), LORA, is_trainable=True)
    step(model, batch)
    grads = adapter_grads(model)
    again = PeftModel.from_pretrained(from_pretrained(BASE, quantization="nf4"), LORA, is_trainable=True)
    step(again, batch, gradient_checkpointing=True)
    assert all(np.array_equal(g, grads[n]) for n, g in adapter_grads(again).items())


# -- training ----------------------------------------------------------------------------------
def test_print_trainable_parameters_is_peft_s_text(capsys):
    """PEFT counts a bitsandbytes 4-bit weight at its full size: the float base's count."""
    model = get_peft_model(from_pretrained(BNB_NF4), LoraConfig(r=2, target_modules=["q_proj"],
                                                                modules_to_save=["lm_head"]))
    model.print_trainable_parameters()
    # PEFT 0.21.2 on transformers + bitsandbytes 0.50's 4-bit folder printed this for the same config
    assert capsys.readouterr().out == "trainable params: 6,784 || all params: 81,728 || trainable%: 8.3007\n"
    model = get_peft_model(from_pretrained(BASE, quantization="fp4"), LoraConfig(r=4, lora_alpha=8,
                                                                                  target_modules="all-linear"))
    assert model.get_nb_trainable_parameters() == (7424, 82368)  # PEFT's numbers on the bnb folder


def test_training_moves_only_the_adapter(batch):
    gt.random.manual_seed(3)
    model = get_peft_model(from_pretrained(BASE, quantization="nf4"),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear"))
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if any(part in n for part in ADAPTER)}
    assert_training_moves_only_the_adapter(model, batch)
    assert any(v.dtype == np.uint8 for v in model.state_dict().values())  # the packed codes are in the state
    for name, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad, name


@pytest.mark.native_only  # a Trainer run end to end: its kernels run under qemu in the quicker tests
def test_trainer_fine_tunes_a_bf16_qlora_adapter(tmp_path):
    gt.random.manual_seed(0)
    model = get_peft_model(from_pretrained(BASE, quantization="nf4", dtype="bf16"),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    assert_trainer_fine_tunes(model, tmp_path, ADAPTER, bf16=True)


# -- files -------------------------------------------------------------------------------------
def test_a_saved_qlora_adapter_is_peft_s_files_and_loads_onto_the_float_base(tmp_path, batch):
    gt.random.manual_seed(5)
    qbase = from_pretrained(BASE, quantization="nf4")
    twin = float_twin(qbase)
    model = get_peft_model(qbase, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"],
                                             init_lora_weights=False))
    gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                                            lr=0.5))(batch["input_ids"],
                                                                     model.shift_labels(batch["labels"]),
                                                                     attention_mask=batch["attention_mask"])
    model.save_pretrained(tmp_path)
    saved = safetensors.numpy.load_file(str(tmp_path / "adapter_model.safetensors"))
    assert len(saved) == 8 and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in saved)
    state = model.state_dict()
    for key, value in saved.items():
        assert value.dtype == np.float32 and np.array_equal(value, state[internal_name(key)]), key
    mask = batch["attention_mask"].astype(bool)
    ours = model.eval()(batch["input_ids"], attention_mask=batch["attention_mask"])
    on_twin = PeftModel.from_pretrained(twin, tmp_path)(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert relative_error(ours[mask], on_twin[mask]) <= 1e-6
    on_float = PeftModel.from_pretrained(from_pretrained(BASE), tmp_path)
    assert all(np.array_equal(on_float.state_dict()[k], v) for k, v in state.items() if ".lora_" in k)
    again = PeftModel.from_pretrained(from_pretrained(BASE, quantization="nf4"), tmp_path)
    assert np.array_equal(again(batch["input_ids"], attention_mask=batch["attention_mask"]), ours)


def test_peft_and_bitsandbytes_numbers(batch):
    """PEFT's LoRA on bitsandbytes' Linear4bit (the nf4 folder, double-quantized absmax), float32 on
    the CPU: logits within 1e-5 and adapter gradients within 1e-4 (relative), as tests/test_peft.py
    holds float LoRA to PEFT -- the same weights, summed in another order by another GEMM."""
    data = np.load(QLORA + ".npz")
    model = PeftModel.from_pretrained(from_pretrained(BNB_NF4), QLORA, is_trainable=True)
    mask = data["attention_mask"].astype(bool)
    logits = model(data["input_ids"], attention_mask=data["attention_mask"])
    assert relative_error(logits[mask], data["logits"][mask]) <= 1e-5
    assert grad_keys(data)
    assert_peft_s_loss_and_gradients(model, data)


@pytest.mark.parametrize("folder,quantization", [(BASE, "int8"), (BNB_INT8, None)], ids=["int8", "bnb-int8-folder"])
def test_peft_and_bitsandbytes_int8_numbers(folder, quantization):
    """PEFT's LoRA on bitsandbytes' Linear8bitLt (transformers' load_in_8bit of the float folder),
    float32 on the CPU in training mode: from_pretrained(quantization="int8") makes bitsandbytes'
    codes and row absmax bit for bit (and its saved 8-bit folder loads them as stored), and the
    adapter gives PEFT's logits (1e-5), loss and gradients (1e-4) -- bitsandbytes' CPU training
    path dequantizes as the qlinear kind does."""
    data = np.load(INT8_QLORA + ".npz")
    base = from_pretrained(folder, quantization=quantization)
    state = base.state_dict()
    weights = [k.removeprefix("cb/") for k in data.files if k.startswith("cb/")]
    assert len(weights) == 14
    for name in weights:
        assert np.array_equal(state[name], data[f"cb/{name}"]), name
        assert ref.same_bits(state[name + ".absmax"], data[f"scb/{name}"]), name
    model = PeftModel.from_pretrained(base, INT8_QLORA, is_trainable=True)
    mask = data["attention_mask"].astype(bool)
    logits = model(data["input_ids"], attention_mask=data["attention_mask"])
    assert relative_error(logits[mask], data["logits"][mask]) <= 1e-5
    assert grad_keys(data)
    assert_peft_s_loss_and_gradients(model, data)


# -- refused by name, nothing changed --------------------------------------------------------------
def test_dora_on_a_quantized_base_is_refused_by_name(tmp_path):
    model = from_pretrained(BASE, quantization="nf4")
    before = snapshot(model)
    with pytest.raises(NotImplementedError, match="use_dora: 'model.layers.0.self_attn.q_proj' is a QLinear"):
        get_peft_model(model, LoraConfig(r=2, target_modules="all-linear", use_dora=True))
    assert_unchanged(model, before)
    with pytest.raises(NotImplementedError, match="use_dora: '.*' is a QLinear"):
        PeftModel.from_pretrained(model, DORA)
    assert_unchanged(model, before)
    with pytest.raises(NotImplementedError, match="use_dora: 'base_layer' is a QLinear"):
        LoraLinear(nn.QLinear(8, 4), r=2, lora_alpha=2, use_dora=True)
    lora = LoraLinear(nn.Linear(8, 4), r=2, lora_alpha=2, use_dora=True)
    lora.base_layer = nn.QLinear(8, 4).requires_grad_(False)  # past the Python check: the C kind refuses too
    with pytest.raises(ValueError, match="LoraLinear: use_dora on a QLinear \\(quantized\\) base_layer is not "
                                         "implemented"):
        nn.Sequential(lora)
    assert all(p.requires_grad for p in model.parameters())
    model(np.array([[1, 2, 3]]))  # still runs as it was


def test_merge_onto_a_quantized_base_is_refused_by_name(batch):
    model = PeftModel.from_pretrained(from_pretrained(BASE, quantization="nf4"), LORA)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    before = snapshot(model)
    with pytest.raises(ValueError, match="merge_and_unload: 'model.layers.0.self_attn.q_proj' has a QLinear"):
        model.merge_and_unload()
    assert_unchanged(model, before)
    assert np.array_equal(model(batch["input_ids"], attention_mask=batch["attention_mask"]), logits)


def test_a_trainable_base_bias_is_refused_by_name(batch):
    model = get_peft_model(from_pretrained(BASE, quantization="nf4"), LoraConfig(r=2, target_modules=["v_proj"]))
    name = "base_model.model.model.layers.0.self_attn.v_proj.base_layer.bias"
    dict(model.named_parameters())[name].requires_grad = True
    with pytest.raises(ValueError, match=name.replace(".", "\\.") + ": the base layer of a LoRA Linear is frozen"):
        gt.TrainStep(model, nn.CrossEntropyLoss())
