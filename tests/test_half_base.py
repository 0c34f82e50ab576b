"""A frozen base in half precision alone (issue 23 item 2): QLinear(quant_type="bf16" | "f16").

A bf16/f16 model's LoRA bases keep their weight in that precision only (2 bytes a weight, no float32
master and no half copy of it). In its own compute dtype the layer's GEMMs read the stored weight
itself, so it computes the bits of a Linear whose float32 master holds the same values (the half
copy that Linear's GEMMs read is those values); in another dtype it casts tiles. get_peft_model on
a bf16 model gives the logits, loss and adapter gradients of the float32-master path bit for bit,
on the CPU and on sim, and its plan is smaller by exactly the master and its copy.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain as gt
from gputrain import nn
from gputrain.models import from_pretrained
from gputrain.peft import LoraConfig, LoraLinear, PeftModel, get_peft_model

import _reference as ref
from _peft_helpers import BASE, LORA
from _sim_steps import assert_sim_gives_the_cpu_bits_at_its_plan


def aligned(n: int) -> int:
    return -(-n // 64) * 64


def rounded(x: np.ndarray, half: str) -> np.ndarray:
    """x rounded to nearest even in `half` ('bf16' or 'f16'), as float32."""
    return ref.to_dtype(x, half).astype(np.float32)


def half_exact(out: int, inp: int, half: str, seed: int = 0) -> np.ndarray:
    """float32 weights that `half` holds exactly (so a float32 master and a half weight agree)."""
    w = (np.random.default_rng(seed).standard_normal((out, inp)) * 0.05).astype(np.float32)
    return rounded(w, half)


def pair(out: int, inp: int, half: str, tile_rows: int = 0, bias: bool = True):
    """(QLinear holding a half weight, Linear holding its values as float32 masters, same bias)."""
    w = half_exact(out, inp, half)
    q = nn.QLinear(inp, out, bias, half, tile_rows=tile_rows).quantize_(w)
    linear = nn.Linear(inp, out, bias)
    state = {"weight": w}
    if bias:
        state["bias"] = np.linspace(-0.5, 0.5, out, dtype=np.float32)
        q.load_state_dict({"bias": state["bias"]}, strict=False)
    linear.load_state_dict(state)
    return q, linear


def input_gradient(layer, x: np.ndarray, target: np.ndarray, precision: str) -> np.ndarray:
    """d loss / d x of an MSE on layer(x), read as the weight gradient of an identity Linear in front."""
    n = x.shape[1]
    eye = nn.Linear(n, n, bias=False)
    eye.load_state_dict({"weight": np.eye(n, dtype=np.float32)})
    gt.TrainStep(nn.Sequential(eye, layer), nn.MSELoss(), precision=precision)(x, target)
    return eye.weight.grad.T.copy()


# -- the layer -------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("half", ["bf16", "f16"])
def test_a_half_weight_gives_the_bits_of_a_linear_holding_its_values(precision, half):
    """Read as it is in its own dtype; cast whole (one tile) in another."""
    q, linear = pair(48, 96, half)
    x = np.random.default_rng(1).standard_normal((2, 5, 96)).astype(np.float32)
    q.compiled.precision = linear.compiled.precision = gt._vocab.c_dtype(precision)
    assert ref.same_bits(q(x), linear(x))
    eye = np.eye(96, dtype=np.float32)
    target = np.random.default_rng(2).standard_normal((96, 48)).astype(np.float32)
    assert ref.same_bits(input_gradient(q, eye, target, precision), input_gradient(linear, eye, target, precision))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cast_tiles_give_the_reference_within_the_gemms_rounding(precision):
    """A bf16 weight in another compute dtype, 16 rows a tile: three tiles."""
    q, _ = pair(48, 96, "bf16", tile_rows=16, bias=False)
    w = ref.f64(q.dequantize())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 96)).astype(np.float32)
    q.compiled.precision = gt._vocab.c_dtype(precision)
    tol = 1e-5 if precision == "fp32" else 5e-3
    want = ref.f64(x) @ w.T
    assert np.abs(q(x) - want).max() <= tol * np.abs(want).max()
    eye = np.eye(96, dtype=np.float32)
    target = rng.standard_normal((96, 48)).astype(np.float32)
    want_dx = 2 * (eye.astype(np.float64) @ w.T - target) / target.size @ w
    assert np.abs(input_gradient(q, eye, target, precision) - want_dx).max() <= tol * np.abs(want_dx).max()


def test_the_weight_is_stored_rounded_to_nearest_even_and_read_back_exactly():
    w = (np.random.default_rng(5).standard_normal((12, 20)) * 3).astype(np.float32)
    for half, numpy_half in (("bf16", None), ("f16", np.float16)):
        q = nn.QLinear(20, 12, False, half).quantize_(w)
        stored = q.state_dict()["weight"]
        assert stored.shape == (12, 20) and list(q.state_dict()) == ["weight"]
        assert ref.same_bits(q.dequantize(), rounded(w, half))
        if numpy_half is not None:
            assert stored.dtype == numpy_half and ref.same_bits(stored, w.astype(np.float16))
        assert q.num_blocks == 0 and q.is_half and "blocksize" not in repr(q)


def test_the_plan_holds_two_bytes_a_weight_and_no_tile_in_its_own_dtype():
    out, inp = 256, 192
    q = nn.QLinear(inp, out, bias=False, quant_type="bf16").quantize_(half_exact(out, inp, "bf16"))
    plan = gt.TrainStep(q, nn.MSELoss(), precision="bf16").memory_plan((4, inp))
    assert plan["parameters"] == plan["gradients"] == plan["half_parameters"] == 0
    assert plan["buffers"] == aligned(out * inp * 2)
    linear = nn.Linear(inp, out, bias=False)
    linear.weight.requires_grad = False
    reference = gt.TrainStep(linear, nn.MSELoss(), precision="bf16").memory_plan((4, inp))
    assert plan["workspace"] == reference["workspace"]  # the GEMMs read the stored weight: no tile
    cast = gt.TrainStep(nn.QLinear(inp, out, False, "bf16"), nn.MSELoss(), precision="fp32").memory_plan((4, inp))
    assert cast["workspace"] >= aligned(out * inp * 4)  # a float32 tile of the weight


def test_a_half_weight_refuses_training_codes_and_bad_values_and_is_left_as_it_was():
    q = nn.QLinear(96, 48, True, "f16").quantize_(half_exact(48, 96, "f16"))
    before = {k: v.copy() for k, v in q.state_dict().items()}
    with pytest.raises(ValueError, match="frozen"):
        q.requires_grad_(True)
    with pytest.raises(ValueError, match="no quantized codes"):
        q.load_quantized(np.zeros((48, 96), np.uint8), np.ones(48, np.float32))
    with pytest.raises(ValueError, match="no QuantState"):
        q.quant_state()
    with pytest.raises(ValueError, match="beyond float16's range"):
        q.quantize_(np.full((48, 96), 1e6, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        q.load_state_dict({"weight": np.full((48, 96), np.nan, np.float32)}, strict=False)
    with pytest.raises(ValueError, match="shape"):
        q.load_state_dict({"weight": np.zeros((96, 48), np.float32)}, strict=False)
    with pytest.raises(ValueError, match="blocksize must be 0 for a half weight"):
        gt._C.Model([("qlinear", 8, 4, False, "bf16", 64, 0, False)], 0)
    assert all(ref.same_bits(v, before[k]) for k, v in q.state_dict().items())


# -- LoRA on a bf16 model ----------------------------------------------------------------------
def adapted(precision: str, seed: int = 7, use_dora: bool = False, folder: str = BASE):
    """The fixture Llama (or the model in `folder`) with its weights rounded to bf16, and a LoRA (or
    DoRA) adapter with B non-zero, built in `precision`: in bf16 the bases are half weights; in fp32
    float32 masters."""
    model = from_pretrained(folder, dtype=precision)
    model.load_state_dict({k: rounded(v, "bf16") for k, v in model.state_dict().items()})
    gt.random.manual_seed(seed)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_dora=use_dora))
    rng = np.random.default_rng(seed)
    for _, lora in peft.lora_layers():
        b = lora.lora_B.default.weight
        b.data = (rng.standard_normal(b.data.shape) * 0.02).astype(np.float32)
    return peft


def batch():
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 96, (2, 9))
    return ids, np.where(rng.random((2, 9)) < 0.2, -100, rng.integers(0, 96, (2, 9)))


def train(peft, steps: int = 2, loss_chunk_rows: int = 0):
    peft.train()
    opt = gt.optim.AdamW(peft.parameters(), lr=1e-2)
    step = gt.TrainStep(peft, gt.nn.CrossEntropyLoss(), opt, precision="bf16", loss_chunk_rows=loss_chunk_rows)
    ids, labels = batch()
    losses = [step(ids, peft.shift_labels(labels)).loss for _ in range(steps)]
    return losses, {n: p.data.copy() for n, p in peft.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("use_dora", [False, True])
def test_a_bf16_model_s_bases_are_half_weights_with_the_fp32_master_path_s_bits(use_dora):
    """Also the untied LM head, which the adapter leaves frozen: it is a half weight too."""
    half, master = adapted("bf16", use_dora=use_dora), adapted("fp32", use_dora=use_dora)
    bases = [lora.base_layer for _, lora in half.lora_layers()]
    assert bases and all(isinstance(b, nn.QLinear) and b.quant_type == "bf16" for b in bases)
    assert all(type(lora.base_layer) is nn.Linear for _, lora in master.lora_layers())
    master.compiled.precision = "bf16"
    ids, _ = batch()
    half.eval(), master.eval()
    assert ref.same_bits(half(ids), master(ids))
    (half_losses, half_params), (master_losses, master_params) = train(half), train(master)
    assert half_losses == master_losses
    assert half_params.keys() == master_params.keys()
    assert all(ref.same_bits(half_params[n], master_params[n]) for n in half_params)
    # PEFT's keys and values: the base's weight reads back as bf16 values, the adapter saves the same
    key = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert ref.same_bits(np.asarray(half.state_dict()[key]).astype(np.float32), master.state_dict()[key])
    assert half.adapter_files() == master.adapter_files()


def test_a_chunked_loss_runs_the_half_head_block_by_block_with_the_master_path_s_bits():
    half, master = adapted("bf16"), adapted("fp32")
    assert isinstance(half.base_model.model.lm_head, nn.QLinear)
    master.compiled.precision = "bf16"
    (half_losses, half_params), (master_losses, master_params) = (train(half, loss_chunk_rows=5),
                                                                   train(master, loss_chunk_rows=5))
    assert half_losses == master_losses
    assert all(ref.same_bits(half_params[n], master_params[n]) for n in half_params)
    whole_losses, _ = train(adapted("bf16"))
    assert half_losses[0] == whole_losses[0]  # the loss keeps its bits for any chunk size


def test_a_narrower_adapter_leaves_the_other_projections_half_and_modules_to_save_float():
    model = from_pretrained(BASE, dtype="bf16")
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]))
    layer = peft.base_model.model.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, nn.QLinear) and isinstance(layer.mlp.down_proj, nn.QLinear)
    assert isinstance(layer.self_attn.q_proj.base_layer, nn.QLinear)
    head = peft.base_model.model.lm_head
    assert type(head) is nn.Linear and head.weight.requires_grad  # trained in place, float32 master


def test_the_plan_drops_the_bases_master_and_half_copy_exactly():
    half, master = adapted("bf16"), adapted("fp32")
    master.compiled.precision = "bf16"
    shape = (2, 3, 9)  # ids, attention mask and position ids
    got = gt.TrainStep(half, gt.nn.CrossEntropyLoss(), precision="bf16").memory_plan(shape)
    want = gt.TrainStep(master, gt.nn.CrossEntropyLoss(), precision="bf16").memory_plan(shape)
    halves = [m for m in half.modules() if isinstance(m, nn.QLinear)]  # the bases and the untied head
    assert len(halves) == len(list(half.lora_layers())) + 1
    assert isinstance(half.base_model.model.lm_head, nn.QLinear)
    table = half.base_model.model.model.embed_tokens  # untied: held in bf16 alone too
    assert isinstance(table, nn.HalfTokenEmbedding)
    weights = sum(b.in_features * b.out_features for b in halves)
    rows = table.num_embeddings * table.embedding_dim
    assert want["gradients"] == got["gradients"]
    assert want["parameters"] - got["parameters"] == 4 * (weights + rows)
    assert want["half_parameters"] - got["half_parameters"] == 2 * weights  # a lookup table has no half copy
    assert got["buffers"] - want["buffers"] == (sum(aligned(2 * b.in_features * b.out_features) for b in halves)
                                                + aligned(2 * rows))


@pytest.mark.sim
@pytest.mark.parametrize("loss_chunk_rows", [0, 5])
def test_a_sim_step_gives_the_cpu_bits_and_peaks_at_its_plan(loss_chunk_rows):
    def build():
        return adapted("bf16")

    def make_step(model):
        model.train()
        return gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision="bf16", loss_chunk_rows=loss_chunk_rows)

    ids, labels = batch()
    labels = np.concatenate([labels[:, 1:], np.full((2, 1), -100)], axis=1)
    assert_sim_gives_the_cpu_bits_at_its_plan(build, make_step, [(ids, labels)] * 2, (2, 3, 9))


def test_merge_and_unload_gives_float32_linears_of_the_half_weight_plus_the_delta():
    half = adapted("bf16")
    want = {name: lora.base_weight() + lora.delta_weight() for name, lora in half.lora_layers()}
    bias = {name: lora.base_layer.has_bias for name, lora in half.lora_layers()}
    model = half.merge_and_unload()
    for name, weight in want.items():
        linear = model.get_submodule(name)
        assert type(linear) is nn.Linear and linear.has_bias == bias[name]
        assert ref.same_bits(linear.weight.data, weight)


def test_an_fp32_model_keeps_float32_masters_and_dora_on_a_half_base_refuses_another_precision():
    master = get_peft_model(from_pretrained(BASE), LoraConfig(r=4, target_modules=["q_proj"]))
    assert all(type(lora.base_layer) is nn.Linear for _, lora in master.lora_layers())
    dora = get_peft_model(from_pretrained(BASE, dtype="bf16"), LoraConfig(r=4, target_modules=["q_proj"],
                                                                          use_dora=True))
    ids, _ = batch()
    dora(ids)
    with pytest.raises(ValueError, match="DoRA on a bf16 base_layer computes in bf16"):
        dora.compiled.precision = "f32"
        dora(ids)


def test_an_adapter_loads_onto_a_bf16_model_and_from_pretrained_can_store_bf16_bases():
    loaded = PeftModel.from_pretrained(from_pretrained(BASE, dtype="bf16"), LORA)
    assert all(isinstance(lora.base_layer, nn.QLinear) for _, lora in loaded.lora_layers())
    stored = from_pretrained(BASE, dtype="bf16", quantization="bf16")
    projection = stored.get_submodule("model.layers.1.mlp.down_proj")
    assert isinstance(projection, nn.QLinear) and projection.quant_type == "bf16"
    ids, _ = batch()  # the bf16 bases hold what a bf16 model's half copy holds
    assert ref.same_bits(stored(ids), from_pretrained(BASE, dtype="bf16")(ids))
    assert isinstance(get_peft_model(stored, LoraConfig(r=4, target_modules=["down_proj"])).get_submodule(
        "base_model.model.model.layers.1.mlp.down_proj"), LoraLinear)


def test_generate_runs_on_a_model_with_half_weights():
    stored = from_pretrained(BASE, quantization="bf16")
    ids, _ = batch()
    plain = from_pretrained(BASE)
    plain.load_state_dict({k: rounded(v, "bf16") if k.endswith("_proj.weight") else v
                           for k, v in plain.state_dict().items()})
    assert np.array_equal(stored.generate(ids[:1, :4], 5), plain.generate(ids[:1, :4], 5))


def test_a_model_with_half_weights_saves_a_float_folder_of_its_values(tmp_path):
    stored = from_pretrained(BASE, quantization="bf16")
    stored.save_pretrained(tmp_path / "saved")
    again = from_pretrained(tmp_path / "saved")
    want = from_pretrained(BASE).state_dict()
    got = again.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        expected = rounded(value, "bf16") if key.endswith("_proj.weight") else value
        assert ref.same_bits(got[key], expected), key
    with pytest.raises(ValueError, match="quantized"):  # 4-bit codes are not saved as floats
        from_pretrained(BASE, quantization="nf4").save_pretrained(tmp_path / "nf4")


# -- the token table -------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("half", ["bf16", "f16"])
def test_a_half_table_looks_up_the_bits_of_a_float32_table_holding_its_values(precision, half):
    table = nn.TokenEmbedding(40, 6, 2, attention_mask=True)
    table.load_state_dict({"weight": rounded(table.weight.data * 3, half)})
    stored = nn.HalfTokenEmbedding.from_token_embedding(table, half)
    rng = np.random.default_rng(6)
    ids = np.stack([rng.integers(0, 40, (3, 5)), rng.integers(0, 2, (3, 5)), np.ones((3, 5), np.int64)], axis=1)
    stored.compiled.precision = table.compiled.precision = gt._vocab.c_dtype(precision)
    want = table(ids)
    for level in ref.simd_levels():  # the lookup's kernel at each SIMD level
        with ref.simd_level(level):
            assert ref.same_bits(stored(ids), want), level
    assert [n for n, _ in stored.named_parameters()] == [] and list(stored.state_dict()) == ["weight"]
    assert ref.same_bits(stored.table(), table.weight.data)


def test_a_half_table_used_twice_is_one_table_named_as_a_reuse():
    stored = nn.HalfTokenEmbedding.from_token_embedding(nn.TokenEmbedding(12, 4), "bf16")
    model = nn.Sequential(nn.Parallel(stored, stored))
    assert model._spec_list()[0][1][1] == ("tied", 0)
    ids = np.arange(6, dtype=np.int64).reshape(1, 1, 6)
    looked_up = stored.table()[ids[0, 0]]
    assert ref.same_bits(model(ids)[0], np.concatenate([looked_up, looked_up], axis=-1))


def test_a_half_table_refuses_training_and_a_4_bit_one_tying():
    stored = nn.HalfTokenEmbedding(16, 4, stored_dtype="bf16")
    with pytest.raises(ValueError, match="frozen"):
        stored.requires_grad_(True)
    with pytest.raises(ValueError, match="a TiedLinear reads a float32 table or a half one"):
        nn.TiedLinear(nn.QTokenEmbedding(16, 64, quant_type="nf4", blocksize=64))
    with pytest.raises(ValueError, match="cannot read a TokenEmbedding table held in 4 bits"):
        gt._C.Model([("tokens", 16, 4, 0, False, False, -1, "nf4", 4), ("tied_linear", 0)], 0)
    with pytest.raises(ValueError, match="stored_dtype"):
        nn.HalfTokenEmbedding(16, 4, stored_dtype="f32")


GEMMA = os.path.join(os.path.dirname(BASE), "gemma-tiny")  # tie_word_embeddings: the head reads the table


def adapted_tied(precision: str, seed: int = 7):
    """The tied fixture Gemma, adapted as `adapted` adapts the Llama."""
    return adapted(precision, seed, folder=GEMMA)


@pytest.mark.parametrize("loss_chunk_rows", [0, 5])
def test_a_tied_table_is_held_in_bf16_and_read_by_the_head_with_the_fp32_master_path_s_bits(loss_chunk_rows):
    half, master = adapted_tied("bf16"), adapted_tied("fp32")
    table = half.base_model.model.model.embed_tokens
    assert isinstance(table, nn.HalfTokenEmbedding) and half.base_model.model.lm_head.embedding is table
    assert type(master.base_model.model.model.embed_tokens) is nn.TokenEmbedding
    master.compiled.precision = "bf16"
    ids, _ = batch()
    half.eval(), master.eval()
    assert ref.same_bits(half(ids), master(ids))
    (half_losses, half_params), (master_losses, master_params) = (train(half, loss_chunk_rows=loss_chunk_rows),
                                                                   train(master, loss_chunk_rows=loss_chunk_rows))
    assert half_losses == master_losses
    assert half_params.keys() == master_params.keys()
    assert all(ref.same_bits(half_params[n], master_params[n]) for n in half_params)


def test_a_tied_half_table_s_plan_holds_it_once_in_two_bytes_and_another_precision_is_refused():
    half, master = adapted_tied("bf16"), adapted_tied("fp32")
    master.compiled.precision = "bf16"
    shape = (2, 3, 9)
    got = gt.TrainStep(half, gt.nn.CrossEntropyLoss(), precision="bf16").memory_plan(shape)
    want = gt.TrainStep(master, gt.nn.CrossEntropyLoss(), precision="bf16").memory_plan(shape)
    table = half.base_model.model.model.embed_tokens
    rows = table.num_embeddings * table.embedding_dim
    bases = sum(lora.base_layer.in_features * lora.base_layer.out_features for _, lora in half.lora_layers())
    assert want["parameters"] - got["parameters"] == 4 * (bases + rows)
    assert want["half_parameters"] - got["half_parameters"] == 2 * (bases + rows)  # the head read the copy
    with pytest.raises(ValueError, match=r"reads the bf16 table of the TokenEmbedding it is tied to as stored: "
                                         r"the model must compute in bf16, not f32"):
        gt.TrainStep(half, gt.nn.CrossEntropyLoss(), precision="fp32").memory_plan(shape)


@pytest.mark.sim
def test_a_tied_half_table_trains_on_sim_with_the_cpu_bits_at_its_plan():
    def make_step(model):
        model.train()
        return gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision="bf16", loss_chunk_rows=5)

    ids, labels = batch()
    labels = np.concatenate([labels[:, 1:], np.full((2, 1), -100)], axis=1)
    assert_sim_gives_the_cpu_bits_at_its_plan(lambda: adapted_tied("bf16"), make_step, [(ids, labels)] * 2,
                                              (2, 3, 9))


def test_a_model_with_a_tied_half_table_generates_and_saves_its_values(tmp_path):
    model = adapted_tied("bf16").merge_and_unload()
    assert isinstance(model.model.embed_tokens, nn.HalfTokenEmbedding)
    ids, _ = batch()
    assert model.generate(ids[:1, :4], max_new_tokens=3).shape == (1, 7)
    model.save_pretrained(str(tmp_path))
    again = from_pretrained(str(tmp_path))
    assert ref.same_bits(again.model.embed_tokens.weight.data, model.model.embed_tokens.table())


def test_an_encoder_s_table_is_held_in_bf16_with_the_fp32_master_path_s_bits():
    folder = os.path.join(os.path.dirname(BASE), "bert-seqcls-tiny")

    def build(precision):
        model = from_pretrained(folder, dtype=precision)
        model.load_state_dict({k: rounded(v, "bf16") for k, v in model.state_dict().items()})
        gt.random.manual_seed(3)
        return get_peft_model(model, LoraConfig(r=4, target_modules=["query", "value"]))

    half, master = build("bf16"), build("fp32")
    master.compiled.precision = "bf16"
    assert any(isinstance(m, nn.HalfTokenEmbedding) for m in half.modules())
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 90, (2, 7))
    half.eval(), master.eval()
    assert ref.same_bits(half(ids), master(ids))
    got, want = half.state_dict(), master.state_dict()
    assert got.keys() == want.keys()
    assert all(ref.same_bits(np.asarray(got[k]).astype(np.float32), want[k]) for k in want)
