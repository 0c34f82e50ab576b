"""QLinear (csrc/nn/qlinear.c, gputrain.nn.QLinear) and from_pretrained(..., quantization=...).

A QLinear holds a frozen NF4/FP4 or int8 weight in bitsandbytes' layout (packed codes + float32
absmax in the buffer arena; int8: a code a byte, an absmax a row) and dequantizes it tile by tile
into the GEMM: its forward and input gradient are a Linear's holding the dequantized weight -- the
same bits where the GEMMs have the same shapes (one tile), within the GEMM's rounding otherwise
(several tiles split the backward GEMM's reduction; CI's AVX2 stage gives a row different bits by
the GEMM's row count, so tiled results are compared with tolerances). Quantize-while-loading
packs the bytes gputrain.quant and its NumPy reference pack; bitsandbytes' own 4-bit folders
(tests/fixtures/make_qlinear_fixtures.py) load without dequantizing and give transformers' logits
of the dequantized weights, and its 8-bit folder (make_int8_fixtures.py) loads its codes as stored.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import gputrain as gt
from gputrain import nn
from gputrain.models import from_pretrained
from gputrain.models.hf.quantized import read_raw
from gputrain.models.hf.safetensors_io import checkpoint_tensors, read_tensor
from gputrain.quant import quantize_4bit, reference
from gputrain.quant.codes import code_table
from gputrain.quant.int8 import int8_vectorwise_quant

import _reference as ref
from _sim_steps import assert_sim_gives_the_cpu_bits_at_its_plan

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
LLAMA = os.path.join(HF, "llama-tiny")
PROJS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")


def aligned(n: int) -> int:
    return -(-n // 64) * 64


def weights(out: int, inp: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((out, inp)) * 0.05).astype(np.float32)


def pair(out: int, inp: int, quant_type: str = "nf4", tile_rows: int = 0, bias: bool = True):
    """(QLinear with quantized weights, Linear holding the dequantized weight and the same bias)."""
    q = nn.QLinear(inp, out, bias, quant_type, 64, tile_rows).quantize_(weights(out, inp))
    linear = nn.Linear(inp, out, bias)
    state = {"weight": q.dequantize()}
    if bias:
        state["bias"] = np.linspace(-0.5, 0.5, out, dtype=np.float32)
        q.load_state_dict({"bias": state["bias"]}, strict=False)
    linear.load_state_dict(state)
    return q, linear


# -- packing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_quantize_while_loading_packs_the_bytes_of_gputrain_quant_and_the_numpy_reference(quant_type):
    model = from_pretrained(LLAMA, quantization=quant_type)
    state = model.state_dict()
    stored = checkpoint_tensors(LLAMA)
    for i in range(2):
        for proj in PROJS:
            name = f"model.layers.{i}.{proj}.weight"
            w = read_tensor(stored[name])
            packed, qstate = quantize_4bit(w, 64, quant_type)
            ref_packed, ref_absmax = reference.quantize_4bit(w, code_table(quant_type), 64)
            assert state[name].dtype == np.uint8 and state[name].shape == packed.shape
            assert np.array_equal(state[name], packed) and np.array_equal(state[name].reshape(-1), ref_packed)
            assert ref.same_bits(state[name + ".absmax"], qstate.absmax)
            assert ref.same_bits(state[name + ".absmax"], ref_absmax)
    # the embedding, the norms and the LM head stay float parameters; no weight of a block is one
    params = dict(model.named_parameters())
    assert "lm_head.weight" in params and "model.embed_tokens.weight" in params
    assert not any(n.endswith("_proj.weight") for n in params)
    assert isinstance(model.model.layers[1].mlp.down_proj, nn.QLinear)


def test_int8_while_loading_packs_the_codes_of_gputrain_quant_and_the_numpy_reference():
    """quantization="int8": LLM.int8's row-wise codes of the float16-rounded weight (bitsandbytes'
    Int8Params, bit for bit: tests/test_qlora.py holds them to its own) and one absmax a row (its
    SCB); the layer computes with code * f32(absmax * f32(1/127)), bitsandbytes' CPU training
    dequantization, which dequantize() gives."""
    model = from_pretrained(LLAMA, quantization="int8")
    state = model.state_dict()
    stored = checkpoint_tensors(LLAMA)
    for i in range(2):
        for proj in PROJS:
            name = f"model.layers.{i}.{proj}.weight"
            w = read_tensor(stored[name]).astype(np.float16)
            codes, scb = int8_vectorwise_quant(w)
            ref_codes, ref_scb = reference.int8_rowwise(w.astype(np.float32))
            assert state[name].dtype == np.int8 and state[name].shape == w.shape
            assert np.array_equal(state[name], codes) and np.array_equal(state[name], ref_codes)
            assert ref.same_bits(state[name + ".absmax"], scb) and ref.same_bits(scb, ref_scb)
            layer = model.get_submodule(f"model.layers.{i}.{proj}")
            scale = (ref_scb * np.float32(1 / 127)).astype(np.float32)
            assert ref.same_bits(layer.dequantize(), (ref_codes.astype(np.float32) * scale[:, None]).astype(np.float32))
    assert not any(n.endswith("_proj.weight") for n, _ in model.named_parameters())
    ids = np.load(os.path.join(HF, "llama-tiny-bnb.npz"))["ids"]
    got, want = model(ids), from_pretrained(LLAMA)(ids)
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()  # int8's rounding, not another model


# -- forward and input gradient --------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4", "int8"])
def test_one_tile_gives_the_bits_of_a_linear_holding_the_dequantized_weight(precision, quant_type):
    q, linear = pair(48, 96, quant_type)  # rows of 96: blocks of 64 span two rows
    x = np.random.default_rng(1).standard_normal((2, 5, 96)).astype(np.float32)
    q.compiled.precision = linear.compiled.precision = gt._vocab.c_dtype(precision)
    assert ref.same_bits(q(x), linear(x))


def input_gradient(layer, x: np.ndarray, target: np.ndarray, precision: str) -> np.ndarray:
    """d loss / d x of an MSE on layer(x), read as the weight gradient of an identity Linear in
    front (x = the identity: that GEMM multiplies by exact ones and zeros)."""
    n = x.shape[1]
    eye = nn.Linear(n, n, bias=False)
    eye.load_state_dict({"weight": np.eye(n, dtype=np.float32)})
    model = nn.Sequential(eye, layer)
    gt.TrainStep(model, nn.MSELoss(), precision=precision)(x, target)
    return eye.weight.grad.T.copy()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_input_gradient_is_a_linears_and_the_weight_has_none(precision):
    x = np.eye(96, dtype=np.float32)
    target = np.random.default_rng(2).standard_normal((96, 48)).astype(np.float32)
    q, linear = pair(48, 96)
    got, want = input_gradient(q, x, target, precision), input_gradient(linear, x, target, precision)
    assert ref.same_bits(got, want)
    assert [name for name, _ in q.named_parameters()] == ["bias"]  # the weight is no parameter
    with pytest.raises(ValueError, match="frozen"):
        q.requires_grad_(True)


def test_a_frozen_bias_gets_no_gradient_and_the_layers_below_still_train():
    """QLinear honours frozen parameters (the frozen-parameter rule): its frozen bias has no gradient
    and stays as it was, while the Linear below it gets the same gradient as with the bias trainable."""
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((32, 24)).astype(np.float32), rng.integers(0, 48, 32).astype(np.int64)
    results = []
    for freeze in (False, True):
        gt.random.manual_seed(0)
        q, _ = pair(48, 96)
        model = nn.Sequential(nn.Linear(24, 96), q)
        q.bias.requires_grad_(not freeze)
        bias = q.bias.data.copy()
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), None)
        loss = step(x, y).loss
        results.append((loss, model[0].weight.grad.copy(), q.bias.grad))
        assert ref.same_bits(q.bias.data, bias)
    (loss, below, bias_grad), (frozen_loss, frozen_below, frozen_bias_grad) = results
    assert loss == frozen_loss and ref.same_bits(below, frozen_below)
    assert bias_grad is not None and frozen_bias_grad is None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("quant_type", ["nf4", "int8"])
def test_tiles_give_the_reference_within_the_gemms_rounding(precision, quant_type):
    """tile_rows 16 (nf4: rounded to whole blocks, 16 rows of 96 = 24 blocks; int8: a block a row):
    three tiles; forward and the input gradient against float64 x @ W^T and dout @ W."""
    q, _ = pair(48, 96, quant_type, tile_rows=16, bias=False)
    w = ref.f64(q.dequantize())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 96)).astype(np.float32)
    q.compiled.precision = gt._vocab.c_dtype(precision)
    tol = 1e-5 if precision == "fp32" else 2e-2
    got = q(x).astype(np.float64)
    want = ref.f64(x) @ w.T
    if precision == "bf16":
        want = ref.f64(ref.to_dtype(x, "bf16")) @ ref.f64(ref.to_dtype(q.dequantize(), "bf16")).T
    assert np.abs(got - want).max() <= tol * np.abs(want).max()
    eye = np.eye(96, dtype=np.float32)
    target = rng.standard_normal((96, 48)).astype(np.float32)
    dx = input_gradient(q, eye, target, precision)
    dout = 2 * (eye.astype(np.float64) @ w.T - target) / target.size
    want_dx = dout @ w
    assert np.abs(dx - want_dx).max() <= tol * np.abs(want_dx).max()


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("quant_type", ["nf4", "int8"])
def test_a_sim_step_gives_the_cpu_bits_and_peaks_at_its_plan(precision, quant_type):
    def build():
        gt.random.manual_seed(5)
        q = nn.QLinear(96, 48, True, quant_type, 64, 16).quantize_(weights(48, 96))
        return nn.Sequential(nn.Linear(32, 96), q, nn.ReLU(), nn.Linear(48, 3))

    def make_step(model):
        return gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision=precision)

    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((6, 32)).astype(np.float32), rng.integers(0, 3, 6)) for _ in range(2)]
    cpu_state = assert_sim_gives_the_cpu_bits_at_its_plan(build, make_step, batches, (6, 32))
    frozen = nn.QLinear(96, 48, True, quant_type).quantize_(weights(48, 96)).weight
    assert np.array_equal(cpu_state["1.weight"], frozen)


# -- the memory plan -------------------------------------------------------------------------
def test_the_plan_holds_the_packed_weight_not_a_float_one():
    out, inp = 256, 192
    q = nn.QLinear(inp, out, bias=False).quantize_(weights(out, inp))
    step = gt.TrainStep(q, nn.MSELoss(), precision="bf16")
    plan = step.memory_plan((4, inp))
    n = out * inp
    assert plan["parameters"] == plan["gradients"] == 0
    assert plan["buffers"] == aligned(n // 2) + aligned(n // 64 * 4)  # 0.5 byte a weight + absmax
    # the tile (here the whole weight, in bf16) is workspace
    assert plan["workspace"] >= aligned(n * 2)
    tiled = gt.TrainStep(nn.QLinear(inp, out, bias=False, tile_rows=32), nn.MSELoss(), precision="bf16")
    assert tiled.memory_plan((4, inp))["workspace"] < plan["workspace"]
    int8 = gt.TrainStep(nn.QLinear(inp, out, bias=False, quant_type="int8"), nn.MSELoss(), precision="bf16")
    assert int8.memory_plan((4, inp))["buffers"] == aligned(n) + aligned(out * 4)  # a byte a weight + absmax


# -- bitsandbytes' folders -------------------------------------------------------------------
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_a_bnb_4bit_folder_loads_packed_and_gives_the_reference_logits(quant_type):
    expected = np.load(os.path.join(HF, "llama-tiny-bnb.npz"))
    folder = os.path.join(HF, f"llama-tiny-bnb-{quant_type}")
    model = from_pretrained(folder)
    stored = checkpoint_tensors(folder)
    o_proj = model.model.layers[0].self_attn.o_proj
    assert isinstance(o_proj, nn.QLinear) and o_proj.quant_type == quant_type
    name = "model.layers.0.self_attn.o_proj.weight"
    with open(stored[name].path, "rb") as f:  # the packed bytes as the file holds them
        f.seek(stored[name].start)
        raw = np.frombuffer(f.read(stored[name].nbytes), np.uint8)
    assert np.array_equal(model.state_dict()[name].reshape(-1), raw)
    # bitsandbytes' dequantization (its default backend's: FP4's code 8 as +0.0 where its CPU and CUDA
    # kernels, and gputrain, decode -0.0, gputrain/quant/codes.py; equal values, bits but that sign)
    same = ref.same_bits if quant_type == "nf4" else np.array_equal
    assert same(o_proj.dequantize(), expected[f"{quant_type}_o_proj"])
    logits = model(expected["ids"])
    want = expected[f"{quant_type}_logits"]
    assert np.abs(logits - want).max() <= 1e-5 * np.abs(want).max()
    assert from_pretrained(folder, quantization=quant_type).state_dict()[name].tobytes() == raw.tobytes()


def test_a_bnb_8bit_folder_loads_its_codes_as_they_are():
    """transformers' save of the load_in_8bit model (tests/fixtures/make_int8_fixtures.py): each
    projection's int8 weight and SCB load as stored, and they are the codes quantization="int8"
    makes from the float folder: the same model, the same logits."""
    folder = os.path.join(HF, "llama-tiny-bnb-int8")
    model = from_pretrained(folder)
    stored = checkpoint_tensors(folder)
    state = model.state_dict()
    for i in range(2):
        for proj in PROJS:
            name = f"model.layers.{i}.{proj}"
            assert isinstance(model.get_submodule(name), nn.QLinear)
            assert np.array_equal(state[name + ".weight"], read_raw(stored[name + ".weight"]))
            assert ref.same_bits(state[name + ".weight.absmax"], read_raw(stored[name + ".SCB"]))
    loaded = from_pretrained(LLAMA, quantization="int8")
    assert all(ref.same_bits(v, loaded.state_dict()[k]) for k, v in state.items())
    ids = np.load(os.path.join(HF, "llama-tiny-bnb.npz"))["ids"]
    assert ref.same_bits(model(ids), loaded(ids))
    assert ref.same_bits(from_pretrained(folder, quantization="int8").state_dict()["model.layers.0.mlp.up_proj.weight"],
                         state["model.layers.0.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match="holds weights bitsandbytes quantized to 'int8'"):
        from_pretrained(folder, quantization="nf4")


@pytest.mark.sim
@pytest.mark.parametrize("quant_type", ["nf4", "int8"])
def test_a_quantized_decoder_on_sim_gives_the_cpu_logits(quant_type):
    ids = np.load(os.path.join(HF, "llama-tiny-bnb.npz"))["ids"]
    cpu = from_pretrained(LLAMA, quantization=quant_type, dtype="bf16")
    sim = from_pretrained(LLAMA, quantization=quant_type, dtype="bf16", device="sim")
    assert ref.same_bits(cpu(ids), sim(ids))


def test_generate_runs_on_the_dequantized_weights():
    prompt = np.load(os.path.join(HF, "llama-tiny-bnb.npz"))["ids"][:1, :4]
    model = from_pretrained(os.path.join(HF, "llama-tiny-bnb-nf4"))
    tokens = model.generate(prompt, max_new_tokens=3)
    logits = model(tokens[:, :-1])
    assert np.array_equal(tokens[0, 4:], logits[0, 3:].argmax(-1))  # greedy: the model's own choices


def test_a_trainer_fine_tunes_around_the_frozen_weights_and_resumes_bit_identically(tmp_path):
    ids = np.random.default_rng(6).integers(0, 96, (4, 8))
    x = np.stack([ids, np.ones_like(ids), np.tile(np.arange(8), (4, 1))], 1).astype(np.int64)

    def run(resume=None):
        model = from_pretrained(LLAMA, quantization="nf4")
        args = gt.TrainingArguments(output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=2,
                                    learning_rate=1e-2, save_strategy="epoch", bf16=True)
        gt.Trainer(model, args, train_dataset=(x, model.shift_labels(ids))).train(resume_from_checkpoint=resume)
        return model.state_dict()

    start = from_pretrained(LLAMA, quantization="nf4").state_dict()
    trained = run()
    for name, value in trained.items():  # the norms, biases, embedding and head train; the 4-bit weights do not
        assert np.array_equal(value, start[name]) == (value.dtype == np.uint8 or name.endswith(".absmax")), name
    first = sorted(os.listdir(tmp_path))[0]
    resumed = run(str(tmp_path / first))
    assert all(ref.same_bits(trained[k], resumed[k]) for k in trained)


# -- bad input -------------------------------------------------------------------------------
def test_bad_quantization_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="quantization must be one of"):
        from_pretrained(LLAMA, quantization="nf5")
    with pytest.raises(ValueError, match="an int8 layer takes the float32 row absmax"):
        nn.QLinear(64, 8, quant_type="int8").load_quantized(np.zeros(256, np.uint8),
                                                             quantize_4bit(weights(8, 64), 64, "nf4")[1])
    with pytest.raises(ValueError, match="no 4-bit QuantState"):
        nn.QLinear(64, 8, quant_type="int8").quant_state()
    with pytest.raises(ValueError, match="blocksize must be one of"):
        from_pretrained(LLAMA, quantization="nf4", blocksize=48)
    with pytest.raises(ValueError, match="gpt2 family cannot be quantized"):
        from_pretrained(os.path.join(HF, "gpt2-tiny"), quantization="nf4")
    with pytest.raises(ValueError, match="holds weights bitsandbytes quantized to 'nf4'"):
        from_pretrained(os.path.join(HF, "llama-tiny-bnb-nf4"), quantization="fp4")
    with pytest.raises(ValueError, match="quantization must be one of"):
        nn.QLinear(64, 8, quant_type="int4")


@pytest.mark.parametrize("source, key, change, message", [
    ("llama-tiny-bnb-fp4", "model.layers.1.mlp.up_proj.weight.absmax", None,
     r"model.layers.1.mlp.up_proj.weight.*'absmax' is missing"),
    ("llama-tiny-bnb-int8", "model.layers.1.mlp.up_proj.SCB", None,
     r"model.layers.1.mlp.up_proj.weight: its SCB \(the row absmax\) is missing"),
    ("llama-tiny-bnb-int8", "model.layers.0.self_attn.k_proj.SCB", np.zeros(3, np.float32),
     r"k_proj.weight: its SCB \(the row absmax\) is F32 of shape \(3,\), expected F32 of shape \(48,\)"),
    ("llama-tiny-bnb-int8", "model.layers.0.self_attn.v_proj.weight_format", np.array(1, np.uint8),
     "weight_format is not 0"),
], ids=["4bit-absmax", "int8-scb", "int8-scb-shape", "int8-format"])
def test_a_bnb_folder_missing_a_piece_is_refused_before_a_model_exists(tmp_path, source, key, change, message):
    folder = tmp_path / "bad"
    shutil.copytree(os.path.join(HF, source), folder)
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(folder / "model.safetensors"))
    if change is None:
        del tensors[key]
    else:
        tensors[key] = change
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        from_pretrained(folder)


def test_a_quantized_weight_refuses_merges_and_bad_writes_and_is_left_as_it_was():
    q = nn.QLinear(96, 48).quantize_(weights(48, 96))
    before = {k: v.copy() for k, v in q.state_dict().items()}
    with pytest.raises(ValueError, match="cannot merge into a quantized"):
        q.merge_(np.zeros((48, 96), np.float32))
    with pytest.raises(ValueError, match="expected shape"):
        q.quantize_(weights(48, 64))
    with pytest.raises(ValueError, match="uint8"):
        q.load_state_dict({"weight": np.zeros((2304, 1), np.int8), "weight.absmax": np.ones(72, np.float32)},
                          strict=False)
    with pytest.raises(ValueError, match="NaN"):
        q.load_state_dict({"weight": np.zeros((2304, 1), np.uint8), "weight.absmax": np.full(72, np.nan, np.float32)},
                          strict=False)
    assert all(ref.same_bits(v, before[k]) for k, v in q.state_dict().items())
    model = from_pretrained(LLAMA, quantization="nf4")
    with pytest.raises(ValueError, match="quantized"):
        model.save_pretrained("/nonexistent-never-written")
