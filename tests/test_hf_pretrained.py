"""gputrain.models.from_pretrained / save_pretrained on Hugging Face folders, against committed
fixtures made by transformers (tests/fixtures/make_hf_fixtures.py, run by hand with torch and
transformers; not needed here): logits within 1e-5 and gradients within 1e-4 (relative, fp32) of
transformers', save then load bit-exact, and every kind of bad folder refused with an exception
naming the file, field or tensor before any model is built."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import safetensors.numpy as st

import gputrain as gt
from gputrain.models import GPT, GPT2LMHeadModel, GPTConfig, from_pretrained
from gputrain.models.hf import FAMILIES, HFConfig
from gputrain.models.hf import folder as hf_folder

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
TINY, SHARDED = os.path.join(FIXTURES, "gpt2-tiny"), os.path.join(FIXTURES, "gpt2-tiny-sharded")


def reference(folder):
    return np.load(folder + ".npz")


def relative_error(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def copy_of(folder, tmp_path):
    target = tmp_path / os.path.basename(folder)
    shutil.copytree(folder, target)
    return target


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is _DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


_DELETE = object()


@pytest.fixture
def no_build(monkeypatch):
    """Fails the test if the gpt2 family builds a model (errors must come before)."""
    family = FAMILIES["gpt2"]

    def build(spec):
        raise AssertionError("a model was built before the error")

    monkeypatch.setitem(FAMILIES, "gpt2", dataclasses.replace(family, build=build))


# -- against transformers ------------------------------------------------------------------------


@pytest.mark.parametrize("folder", [TINY, SHARDED], ids=["single", "sharded"])
def test_logits_and_loss_match_transformers(folder):
    ref = reference(folder)
    model = from_pretrained(folder)
    assert isinstance(model, GPT2LMHeadModel) and not model.training
    logits = model(ref["input_ids"])
    assert relative_error(logits, ref["logits"]) <= 1e-5
    out = gt.TrainStep(model, gt.nn.CrossEntropyLoss())(ref["input_ids"], ref["targets"])
    assert out.loss == pytest.approx(float(ref["loss"]), rel=1e-5)


def test_config_fields_away_from_their_defaults_are_read():
    config = from_pretrained(TINY).config
    assert config == GPTConfig(vocab_size=100, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.05,
                               n_inner=96, activation="gelu", layer_norm_eps=1e-3, tie_word_embeddings=False)
    assert from_pretrained(SHARDED).config.tie_word_embeddings


def test_gradients_match_transformers():
    ref = reference(TINY)
    model = from_pretrained(TINY)  # eval mode: no dropout, as the reference
    gt.TrainStep(model, gt.nn.CrossEntropyLoss())(ref["input_ids"], ref["targets"])
    conv = model._conv1d()
    names = [name for name, _ in model.named_parameters()]
    assert sorted(names) == sorted(k.removeprefix("grad/") for k in ref.files if k.startswith("grad/"))
    for name, parameter in model.named_parameters():
        grad = parameter.grad.T if name in conv else parameter.grad
        assert relative_error(grad, ref["grad/" + name]) <= 1e-4, name


def test_attention_mask_right_padding_keeps_the_real_tokens_logits():
    ref = reference(TINY)
    model = from_pretrained(TINY)
    logits = model(ref["input_ids"], attention_mask=ref["mask"])
    real = ref["mask"].astype(bool)
    assert relative_error(logits[real], ref["masked_logits"][real]) <= 1e-5
    with pytest.raises(ValueError, match="attention_mask: row 1 is not ones followed by zeros"):
        model(ref["input_ids"], attention_mask=np.flip(ref["mask"], axis=1))


def test_generate_with_the_cache_follows_the_config():
    model = from_pretrained(TINY)  # untied head, exact GELU, epsilon 1e-3
    prompt = reference(TINY)["input_ids"][:2, :5]
    cached = model.generate(prompt, 8, temperature=0)
    np.testing.assert_array_equal(cached, model.generate(prompt, 8, temperature=0, use_cache=False))


def test_dtype_sets_the_compute_precision():
    ref = reference(TINY)
    model = from_pretrained(TINY, dtype="bfloat16")
    assert model.compiled.precision == "bf16"
    assert relative_error(model(ref["input_ids"]), ref["logits"]) < 5e-2
    assert from_pretrained(TINY, dtype="auto").compiled.precision == "f32"  # the file says float32
    with pytest.raises(ValueError, match="dtype must be"):
        from_pretrained(TINY, dtype="int8")


# -- the folder format ---------------------------------------------------------------------------


@pytest.mark.parametrize("folder", [TINY, SHARDED], ids=["single", "sharded"])
def test_state_dict_is_the_files(folder):
    model = from_pretrained(folder)
    stored = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            stored.update(st.load_file(os.path.join(folder, file)))
    stored.pop("lm_head.weight", None) if model.config.tie_word_embeddings else None
    state = model.state_dict()
    assert list(state) == list(model.state_dict())
    assert sorted(state) == sorted(stored)
    for name, value in state.items():
        np.testing.assert_array_equal(value, stored[name], err_msg=name)


def test_each_tensor_is_read_once(monkeypatch):
    reads = []
    original = hf_folder.read_tensor
    monkeypatch.setattr(hf_folder, "read_tensor", lambda ref: reads.append((ref.path, ref.name)) or original(ref))
    model = from_pretrained(SHARDED)
    assert len(reads) == len(set(reads)) == len(list(model.named_parameters()))
    assert len({path for path, _ in reads}) == 8  # every shard of the fixture


@pytest.mark.parametrize("shard", [None, "30KB"], ids=["single", "sharded"])
def test_save_then_load_is_bit_exact(tmp_path, shard):
    ref = reference(TINY)
    model = from_pretrained(TINY)
    kwargs = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(tmp_path / "out", **kwargs)
    files = sorted(os.listdir(tmp_path / "out"))
    if shard is None:
        assert files == ["config.json", "model.safetensors"]
    else:
        index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
        assert files == sorted(["config.json", "model.safetensors.index.json", *shards])
        assert index["metadata"]["total_size"] == sum(v.nbytes for v in model.state_dict().values())
    again = from_pretrained(tmp_path / "out")
    assert again.config == model.config
    for (name, a), (other, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert name == other and np.array_equal(a, b), name
    np.testing.assert_array_equal(again(ref["input_ids"]), model(ref["input_ids"]))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert config["bos_token_id"] == 0  # fields that do not change the arithmetic are kept


def test_a_second_save_removes_the_first_ones_shards(tmp_path):
    model = from_pretrained(SHARDED)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    model.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    np.testing.assert_array_equal(from_pretrained(tmp_path).state_dict()["transformer.wte.weight"],
                                  model.state_dict()["transformer.wte.weight"])


def test_state_dict_round_trip_and_trainer_names():
    model = from_pretrained(TINY)
    state = model.state_dict()
    assert state["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)  # Conv1D: (in, out)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (192, 64)  # the Parameter: Linear's (out, in)
    other = GPT2LMHeadModel(model.config)
    other.load_state_dict(state)
    assert all(np.array_equal(v, other.state_dict()[k]) for k, v in state.items())
    with pytest.raises(ValueError, match=r"c_attn.weight'\]: expected shape \(64, 192\)"):
        name = "transformer.h.0.attn.c_attn.weight"
        other.load_state_dict({**state, name: state[name].T})


def test_a_trainer_run_resumes_from_its_checkpoint(tmp_path):
    """The Trainer's checkpoints hold transformers' state_dict (Conv1D weights (in, out)); resuming
    stages it through the model's own layout and continues bit-identically."""
    ids = np.random.default_rng(0).integers(0, 100, size=(8, 17))
    x, y = ids[:, :-1], ids[:, 1:]

    def trainer(folder: str) -> gt.Trainer:
        args = gt.TrainingArguments(output_dir=folder, per_device_train_batch_size=4, learning_rate=1e-3,
                                    max_steps=4, save_steps=2, logging_steps=50, disable_tqdm=True, seed=1)
        gt.random.manual_seed(5)  # the model's dropout stream (the fixture's dropout is on)
        return gt.Trainer(from_pretrained(TINY), args, train_dataset=(x, y))

    straight = trainer(str(tmp_path / "a"))
    straight.train()
    resumed = trainer(str(tmp_path / "a"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.state.global_step == 4
    after = resumed.model.state_dict()
    assert all(np.array_equal(v, after[k]) for k, v in straight.model.state_dict().items())


def test_gpt2model_names_and_old_buffers_load(tmp_path):
    folder = copy_of(TINY, tmp_path)
    weights = st.load_file(str(folder / "model.safetensors"))
    bare = {k.removeprefix("transformer."): v for k, v in weights.items()}
    bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
    st.save_file(bare, str(folder / "model.safetensors"), metadata={"format": "pt"})
    loaded = from_pretrained(folder)
    expected = from_pretrained(TINY).state_dict()
    assert all(np.array_equal(v, expected[k]) for k, v in loaded.state_dict().items())


def test_bfloat16_and_float16_weights_are_read(tmp_path):
    folder = copy_of(SHARDED, tmp_path)
    model = from_pretrained(SHARDED)
    state = model.state_dict()
    bits = {k: ((v.view(np.uint32) + 0x8000) >> 16).astype(np.uint16) for k, v in state.items()}  # round to bf16
    names = list(state)
    header = {k: {"dtype": "BF16", "shape": list(v.shape)} for k, v in bits.items()}
    offset, blobs = 0, []
    for k in names:
        header[k]["data_offsets"] = [offset, offset + bits[k].nbytes]
        offset += bits[k].nbytes
        blobs.append(bits[k].tobytes())
    for file in os.listdir(folder):
        if file.endswith((".safetensors", ".json")) and file != "config.json":
            os.unlink(folder / file)
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))
    edit_config(folder, dtype="bfloat16")
    loaded = from_pretrained(folder, dtype="auto")
    assert loaded.compiled.precision == "bf16"
    for k in names:
        np.testing.assert_array_equal(loaded.state_dict()[k], (bits[k].astype(np.uint32) << 16).view(np.float32))
        assert np.abs(loaded.state_dict()[k] - state[k]).max() <= 2**-8 * np.abs(state[k]).max()
    st.save_file({k: v.astype(np.float16) for k, v in state.items()}, str(folder / "model.safetensors"))
    np.testing.assert_array_equal(from_pretrained(folder).state_dict()["transformer.ln_f.weight"],
                                  state["transformer.ln_f.weight"].astype(np.float16).astype(np.float32))


# -- bad folders ---------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "llama2000"}, "field 'model_type' = 'llama2000' is not supported"),
    ({"model_type": ["gpt2"]}, "field 'model_type' must be a string"),
    ({"activation_function": ["gelu"]}, "field 'activation_function' = \\['gelu'\\] is not supported"),
    ({"model_type": _DELETE, "architectures": ["BertModel"]}, "names no class gputrain builds"),
    ({"architectures": ["GPT2ForSequenceClassification"]}, "not GPT2ForSequenceClassification"),
    ({"scale_attn_by_inverse_layer_idx": True}, "field 'scale_attn_by_inverse_layer_idx' = True is not supported"),
    ({"reorder_and_upcast_attn": True}, "field 'reorder_and_upcast_attn'"),
    ({"scale_attn_weights": False}, "field 'scale_attn_weights'"),
    ({"add_cross_attention": True}, "field 'add_cross_attention'"),
    ({"activation_function": "quick_gelu"}, "field 'activation_function' = 'quick_gelu' is not supported"),
    ({"attn_pdrop": 0.2}, "'resid_pdrop', 'embd_pdrop', 'attn_pdrop'.*differ"),
    ({"n_head": 5}, "field 'n_embd' = 64 is not divisible by field 'n_head' = 5"),
    ({"n_layer": 0}, "field 'n_layer' must be an integer >= 1"),
    ({"layer_norm_epsilon": 0}, "field 'layer_norm_epsilon' must be a number"),
    ({"rotary_dim": 16}, "field 'rotary_dim' is not known to gputrain's gpt2 family"),
    ({"dtype": "float32", "torch_dtype": "bfloat16"}, "field 'dtype' disagrees with 'torch_dtype'"),
    ({"dtype": "int4"}, "field 'dtype' = 'int4'"),
    ({"n_positions": 16}, "tensor 'transformer.wpe.weight' has shape \\(32, 64\\), config.json implies \\(16, 64\\)"),
])
def test_unsupported_config_is_refused_by_name(tmp_path, no_build, changes, message):
    folder = copy_of(TINY, tmp_path)
    edit_config(folder, **changes)
    with pytest.raises(ValueError, match=message):
        from_pretrained(folder)


def test_old_torch_dtype_spelling_is_read(tmp_path):
    folder = copy_of(TINY, tmp_path)
    edit_config(folder, dtype=_DELETE, torch_dtype="bfloat16")
    assert from_pretrained(folder, dtype="auto").compiled.precision == "bf16"


def test_missing_config_json(tmp_path, no_build):
    folder = copy_of(TINY, tmp_path)
    os.unlink(folder / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(folder)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        from_pretrained(tmp_path / "nowhere")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        from_pretrained(folder)


def test_pickled_weights_are_refused_unopened(tmp_path, no_build):
    folder = copy_of(TINY, tmp_path)
    os.unlink(folder / "model.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 not read")
    with pytest.raises(ValueError, match=r"pickled file\(s\) \(pytorch_model.bin\).*never unpickles"):
        from_pretrained(folder)
    os.unlink(folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="no model.safetensors and no model.safetensors.index.json"):
        from_pretrained(folder)


def _rewrite(folder, change):
    path = str(folder / "model.safetensors")
    weights = st.load_file(path)
    change(weights)
    st.save_file(weights, path, metadata={"format": "pt"})


@pytest.mark.parametrize("change, message", [
    (lambda w: w.update({"transformer.h.1.mlp.c_fc.weight": w["transformer.h.1.mlp.c_fc.weight"].T.copy()}),
     r"tensor 'transformer.h.1.mlp.c_fc.weight' has shape \(96, 64\), config.json implies \(64, 96\)"),
    (lambda w: w.update({"transformer.ln_f.bias": w["transformer.ln_f.bias"].astype(np.int32)}),
     "tensor 'transformer.ln_f.bias' has dtype I32"),
    (lambda w: w.pop("transformer.h.0.ln_2.weight"), "tensor 'transformer.h.0.ln_2.weight' is missing"),
    (lambda w: w.update({"transformer.h.2.ln_1.weight": np.ones(64, np.float32)}),
     "unexpected tensor 'transformer.h.2.ln_1.weight'"),
])
def test_bad_tensors_are_refused_by_name_before_building(tmp_path, no_build, change, message):
    folder = copy_of(TINY, tmp_path)
    _rewrite(folder, change)
    with pytest.raises(ValueError, match=message):
        from_pretrained(folder)


def test_non_finite_values_are_refused(tmp_path):
    folder = copy_of(TINY, tmp_path)
    _rewrite(folder, lambda w: w.update({"transformer.h.0.ln_1.bias": np.full(64, np.inf, np.float32)}))
    with pytest.raises(ValueError, match="tensor 'transformer.h.0.ln_1.bias' holds NaN or infinite values"):
        from_pretrained(folder)  # the model being filled is dropped: nothing half-loaded comes back


def test_truncated_file_is_refused_before_building(tmp_path, no_build):
    folder = copy_of(TINY, tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated"):
        from_pretrained(folder)
    path.write_bytes(data[:5])
    with pytest.raises(ValueError, match="model.safetensors: truncated"):
        from_pretrained(folder)


def _index(folder):
    return json.loads((folder / "model.safetensors.index.json").read_text())


def test_bad_shards_and_index_are_refused_by_name(tmp_path, no_build):
    folder = copy_of(SHARDED, tmp_path)
    index = _index(folder)
    shards = sorted(set(index["weight_map"].values()))
    last = folder / shards[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-4])
    with pytest.raises(ValueError, match=f"{shards[-1]}: truncated"):
        from_pretrained(folder)
    os.unlink(last)
    with pytest.raises(FileNotFoundError, match=f"{shards[-1]}: missing"):
        from_pretrained(folder)
    last.write_bytes(data)

    name, shard = next(iter(index["weight_map"].items()))
    dropped = {**index, "weight_map": {k: v for k, v in index["weight_map"].items() if k != name}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(dropped))
    with pytest.raises(ValueError, match=f"index.json: no entry for tensor '{name}' of {shard}"):
        from_pretrained(folder)
    other = next(s for s in shards if s != shard)
    moved = {**index, "weight_map": {**index["weight_map"], name: other}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(moved))
    with pytest.raises(ValueError, match=f"maps tensor '{name}' to {other}, which does not hold it"):
        from_pretrained(folder)
    escaping = {**index, "weight_map": {**index["weight_map"], name: "../elsewhere.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(escaping))
    with pytest.raises(ValueError, match="is not a .safetensors file name of this folder"):
        from_pretrained(folder)


# -- the state-dict door and the config reader -------------------------------------------------


def test_from_hf_state_dict_requires_n_head():
    weights = from_pretrained(TINY).to_hf_state_dict()
    with pytest.raises(ValueError, match="n_head: required"):
        GPT.from_hf_state_dict(weights)
    model = GPT.from_hf_state_dict(weights, n_head=4)
    assert model.config.n_inner == 96 and not model.config.tie_word_embeddings


def test_save_pretrained_refuses_what_it_cannot_describe(tmp_path):
    with pytest.raises(TypeError, match="has no Hugging Face family"):
        gt.models.save_pretrained(GPT(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=8), tmp_path)
    model = GPT2LMHeadModel(GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=8, bias=False))
    with pytest.raises(ValueError, match="bias=False"):
        model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="max_shard_size"):
        from_pretrained(TINY).save_pretrained(tmp_path, max_shard_size="lots")
    assert os.listdir(tmp_path) == []


def test_rope_parameters_read_in_both_spellings():
    new = HFConfig({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "c.json")
    old = HFConfig({"rope_theta": 5e5, "rope_scaling": {"type": "llama3", "factor": 8.0}}, "c.json")
    assert new.rope_parameters() == old.rope_parameters() == {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    assert HFConfig({"rope_theta": 1e4}, "c.json").rope_parameters() == {"rope_type": "default", "rope_theta": 1e4}
    assert HFConfig({}, "c.json").rope_parameters() is None
    both = HFConfig({"rope_parameters": {"rope_theta": 1e6}, "rope_theta": 1e4}, "c.json")
    with pytest.raises(ValueError, match="rope_parameters.*disagrees"):
        both.rope_parameters()


def test_copies_pickles_and_the_sim_device_keep_the_names():
    import copy
    import pickle

    ref = reference(TINY)
    model = from_pretrained(TINY)
    state = model.state_dict()
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert list(clone.state_dict()) == list(state)
        assert all(np.array_equal(v, state[k]) for k, v in clone.state_dict().items())
        np.testing.assert_array_equal(clone(ref["input_ids"]), model(ref["input_ids"]))
    on_sim = from_pretrained(TINY, device="sim")
    assert on_sim._compiled.device.startswith("sim")
    assert all(np.array_equal(v, state[k]) for k, v in on_sim.state_dict().items())
    assert relative_error(on_sim(ref["input_ids"]), ref["logits"]) <= 1e-5
    on_sim.load_state_dict({**state, "transformer.ln_f.bias": state["transformer.ln_f.bias"] + 1})
    np.testing.assert_array_equal(on_sim.state_dict()["transformer.h.1.mlp.c_fc.weight"],
                                  state["transformer.h.1.mlp.c_fc.weight"])
    np.testing.assert_array_equal(on_sim.state_dict()["transformer.ln_f.bias"], state["transformer.ln_f.bias"] + 1)


@pytest.mark.parametrize("changes", [
    # the fields of the Hub's gpt2 config.json (transformers 4 era): n_ctx, task_specific_params, no dtype
    {"n_ctx": 1024, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
     "dtype": _DELETE, "pad_token_id": _DELETE, "use_cache": _DELETE, "transformers_version": _DELETE},
    {"model_type": _DELETE},  # architectures alone picks the family
    {"architectures": ["GPT2Model"], "_name_or_path": "gpt2", "id2label": {"0": "LABEL_0"}, "torch_dtype": "float32",
     "dtype": _DELETE},
])
def test_configs_as_transformers_wrote_them_over_the_years_load(tmp_path, changes):
    folder = copy_of(TINY, tmp_path)
    edit_config(folder, **changes)
    ref = reference(TINY)
    assert relative_error(from_pretrained(folder)(ref["input_ids"]), ref["logits"]) <= 1e-5
