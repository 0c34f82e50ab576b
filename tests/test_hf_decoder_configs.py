"""Issue 21's Llama-like decoder fixtures (tests/fixtures/make_hf_fixtures.py) and their config
tables (gputrain.models.hf.decoders): every committed config parses, both spellings give the same
dataclass, refused and unknown fields are named, every family loads, and a NumPy
reference forward (tests/_llama_reference.py) reproduces transformers' committed outputs."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from gputrain.models.hf.config import HFConfig
from gputrain.models.hf.decoders import DecoderConfig, load_decoder_config, parse_decoder_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _llama_reference as ref  # noqa: E402

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral", "gemma": "gemma",
            "gemma3": "gemma3_text"}


def folder(name: str, kind: str = "-tiny") -> str:
    return os.path.join(HF, name + kind)


def config_dict(name: str, kind: str = "-tiny") -> dict:
    with open(os.path.join(folder(name, kind), "config.json")) as f:
        return json.load(f)


def parse(values: dict) -> DecoderConfig:
    return parse_decoder_config(HFConfig(copy.deepcopy(values), "config.json"))


@pytest.mark.parametrize("name", FAMILIES)
def test_both_spellings_parse_to_the_same_dataclass(name):
    new, old = config_dict(name), config_dict(name, "-tiny-legacy")
    assert "rope_parameters" in new and "dtype" in new and "rope_theta" in old and "torch_dtype" in old
    assert parse(new) == parse(old) == load_decoder_config(folder(name))
    assert parse(new).family == FAMILIES[name] and parse(new).dtype == "fp32"


def test_seqcls_configs_parse():
    for name in ("llama", "qwen2"):
        cfg = load_decoder_config(folder(name, "-seqcls-tiny"))
        assert (cfg.num_labels, cfg.pad_token_id, cfg.problem_type) == (3, 0, "single_label_classification")


def test_fixture_configs_are_away_from_the_defaults():
    c = {name: load_decoder_config(folder(name)) for name in FAMILIES}
    assert all(x.num_kv_heads < x.num_heads and x.hidden_size == 64 for x in c.values())
    assert c["llama"].head_dim == 24 and c["llama"].qkv_bias and c["llama"].o_bias and c["llama"].mlp_bias
    assert c["llama"].ropes[0].rope_type == "llama3" and not c["llama"].tie_word_embeddings
    inv = c["llama"].ropes[0].inv_freq()
    plain = 1.0 / 5000.0 ** (np.arange(0, 24, 2) / 24)
    assert np.isclose(inv[0], plain[0]) and np.isclose(inv[-1], plain[-1] / 8)  # all three llama3 bands
    assert plain[1] / 8 < inv[1] < plain[1] and plain[2] / 8 < inv[2] < plain[2] and np.isclose(inv[3], plain[3] / 8)
    assert c["qwen2"].qkv_bias and not c["qwen2"].o_bias and c["qwen2"].windows == (None, 5)
    assert c["qwen2"].ropes[0].rope_type == "yarn" and c["qwen2"].ropes[0].attention_factor > 1
    assert c["qwen3"].qk_norm and c["qwen3"].head_dim == 24 and c["qwen3"].ropes[0].theta == 1000.0
    assert c["mistral"].num_kv_heads == 1 and c["mistral"].windows == (5, 5)
    assert c["mistral"].ropes[0].rope_type == "linear" and c["mistral"].tie_word_embeddings
    assert c["gemma"].norm_plus_one and c["gemma"].embed_scale == 8.0 and c["gemma"].activation == "gelu_tanh"
    g3 = c["gemma3"]
    assert g3.windows == (5, None) and [r.theta for r in g3.ropes] == [100.0, 10000.0]
    assert [r.rope_type for r in g3.ropes] == ["default", "linear"] and g3.attention_scale == 20 ** -0.5
    assert (g3.attn_logit_softcapping, g3.final_logit_softcapping) == (None, 3.0) and g3.sandwich_norms
    assert g3.qkv_bias and g3.o_bias


# (family, field, value, text the error must contain)
REFUSED = [
    ("llama", "hidden_act", "gelu", "'hidden_act'"),
    ("llama", "attention_dropout", 0.1, "'attention_dropout'"),
    ("llama", "num_key_value_heads", 3, "'num_key_value_heads'"),
    ("llama", "rope_parameters", {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}, "'dynamic'"),
    ("llama", "rope_parameters", {"rope_type": "longrope", "rope_theta": 1e4}, "'longrope'"),
    ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
     "partial_rotary_factor"),
    ("llama", "rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "foo": 1}, "'foo'"),
    ("llama", "rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0},
     "low_freq_factor"),
    ("llama", "rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 4.0,
                                  "high_freq_factor": 1.0}, "high_freq_factor > low_freq_factor"),
    ("qwen2", "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                                  "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ("llama", "partial_rotary_factor", 0.5, "'partial_rotary_factor'"),
    ("llama", "mlp_bias", "yes", "'mlp_bias'"),
    ("llama", "rms_norm_eps", -1.0, "'rms_norm_eps'"),
    ("llama", "dtype", "int8", "'dtype'"),
    ("llama", "problem_type", "ranking", "'problem_type'"),
    ("qwen2", "layer_types", ["full_attention"], "'layer_types'"),
    ("qwen2", "use_sliding_window", False, "'layer_types'"),
    ("qwen2", "head_dim", 24, "'head_dim'"),
    ("qwen3", "attention_dropout", 0.5, "'attention_dropout'"),
    ("mistral", "layer_types", ["full_attention", "full_attention"], "'layer_types'"),
    ("mistral", "attention_bias", True, "'attention_bias'"),
    ("gemma", "hidden_act", "silu", "'hidden_act'"),
    ("gemma", "use_bidirectional_attention", True, "'use_bidirectional_attention'"),
    ("gemma3", "use_bidirectional_attention", True, "'use_bidirectional_attention'"),
    ("gemma3", "hidden_activation", "silu", "'hidden_activation'"),
    ("gemma3", "attn_logit_softcapping", 50.0, "'attn_logit_softcapping'"),
    ("gemma3", "final_logit_softcapping", -1.0, "'final_logit_softcapping'"),
    ("gemma3", "query_pre_attn_scalar", 0, "'query_pre_attn_scalar'"),
    ("gemma3", "rope_parameters", {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}, "'factor'"),
    ("gemma3", "rope_parameters", {"global": {"rope_type": "default", "rope_theta": 1e4}}, "'rope_parameters'"),
]


REFUSED += [
    ("llama", "head_dim", 25, "'head_dim'"),
    ("llama", "tie_word_embeddings", "yes", "'tie_word_embeddings'"),
    ("llama", "pad_token_id", -1, "'pad_token_id'"),
    ("llama", "vocab_size", 0, "'vocab_size'"),
    ("mistral", "sliding_window", 0, "'sliding_window'"),
    ("qwen3", "max_window_layers", -1, "'max_window_layers'"),
    ("gemma", "hidden_activation", "gelu_pytorch_tanh", "'hidden_activation'"),
    ("gemma3", "sliding_window_pattern", 0, "'sliding_window_pattern'"),
    ("llama-legacy", "rope_scaling", {"type": "dynamic", "factor": 2.0}, "'dynamic'"),
    ("llama-legacy", "rope_scaling", "llama3", "'rope_scaling'"),
    ("llama-legacy", "torch_dtype", "float64", "'dtype'"),
    ("gemma3-legacy", "rope_scaling", {"rope_type": "longrope", "factor": 2.0}, "'longrope'"),
    ("gemma3-legacy", "rope_local_base_freq", -5.0, "'rope_theta'"),
]


@pytest.mark.parametrize("name,field,value,text", REFUSED)
def test_unsupported_values_are_refused_by_name(name, field, value, text):
    family, _, legacy = name.partition("-")  # "<family>-legacy": the older spelling's config
    values = config_dict(family, "-tiny-legacy" if legacy else "-tiny")
    values[field] = value
    before = copy.deepcopy(values)
    with pytest.raises(ValueError, match=text.replace("(", r"\(")):
        parse_decoder_config(HFConfig(values, "config.json"))
    assert values == before  # refusing changes nothing


def test_parsing_does_not_change_the_values():
    for name in FAMILIES:
        for kind in ("-tiny", "-tiny-legacy"):
            values = config_dict(name, kind)
            before = copy.deepcopy(values)
            parse_decoder_config(HFConfig(values, "config.json"))
            assert values == before


@pytest.mark.parametrize("name", FAMILIES)
def test_unknown_fields_are_refused_by_name(name):
    values = config_dict(name)
    values["rope_magic"] = 1
    with pytest.raises(ValueError, match="'rope_magic' is not known"):
        parse(values)


def test_spellings_that_disagree_are_refused():
    values = config_dict("llama")
    values["rope_theta"] = 1234.0
    with pytest.raises(ValueError, match="rope_parameters"):
        parse(values)
    values = config_dict("gemma3")
    values["rope_local_base_freq"] = 5.0
    with pytest.raises(ValueError, match="sliding_attention.rope_theta"):
        parse(values)


def test_every_family_is_registered_with_from_pretrained():
    import gputrain.models as models
    for name in FAMILIES:
        model = models.from_pretrained(folder(name))
        assert type(model).__name__.endswith("ForCausalLM") and model.config.family == model.family


def test_fixtures_stay_small():
    total = 0
    for name in FAMILIES:
        for kind in ("-tiny", "-tiny-legacy", "-seqcls-tiny"):
            path = folder(name, kind)
            if os.path.isdir(path):
                total += sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
            if os.path.isfile(path + ".npz"):
                total += os.path.getsize(path + ".npz")
    assert total <= 4 * 2 ** 20, total


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("name", FAMILIES)
def test_numpy_reference_reproduces_transformers(name):
    cfg, w = ref.load(folder(name))
    expected = np.load(folder(name) + ".npz")
    for side in ("right", "left"):
        ids, mask = expected[f"{side}/input_ids"], expected[f"{side}/attention_mask"]
        logits = ref.causal_lm_logits(cfg, w, ids, mask)
        assert relative(logits, expected[f"{side}/logits"]) < 1e-5, side
        loss = ref.causal_lm_loss(logits, expected[f"{side}/labels"])
        assert abs(loss - float(expected[f"{side}/loss"])) < 1e-5 * abs(loss), side
    packed = ref.causal_lm_logits(cfg, w, expected["packed/input_ids"], positions=expected["packed/position_ids"])
    assert relative(packed, expected["packed/logits"]) < 1e-5
    assert np.array_equal(ref.greedy(cfg, w, expected["generate/prompt"], 8), expected["generate/output"])


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_numpy_reference_reproduces_sequence_classification(name):
    cfg, w = ref.load(folder(name, "-seqcls-tiny"))
    expected = np.load(folder(name, "-seqcls-tiny") + ".npz")
    for side in ("right", "left"):
        logits = ref.sequence_classification(cfg, w, expected[f"{side}/input_ids"], expected[f"{side}/attention_mask"])
        assert relative(logits, expected[f"{side}/logits"]) < 1e-5, side
        loss = ref.cross_entropy(logits, expected[f"{side}/labels"])
        assert abs(loss - float(expected[f"{side}/loss"])) < 1e-5 * abs(loss), side


def test_reference_outputs_hold_the_promised_arrays():
    for name in FAMILIES:
        data = np.load(folder(name) + ".npz")
        grads = [k for k in data.files if "/grad/" in k]
        assert any(k.startswith("right/grad/model.layers.0.") for k in grads)
        assert "right/grad/model.embed_tokens.weight" in grads and "right/grad/model.norm.weight" in grads
        assert all(k.startswith("right/") or ".self_attn." in k for k in grads)
        assert data["generate/output"].shape == (1, 14) and data["packed/position_ids"][0, 9] == 0
    assert dataclasses.is_dataclass(DecoderConfig)


# (family, batch side, parameter): the committed gradients against central differences of the
# NumPy reference's loss along a random direction (float64, so the check is to ~1e-7)
GRADIENT_CHECKS = [(name, side, param) for name in FAMILIES for side, param in (
    ("right", "model.layers.0.self_attn.q_proj.weight"), ("right", "model.embed_tokens.weight"),
    ("right", "model.layers.0.mlp.down_proj.weight"), ("right", "model.norm.weight"),
    ("left", "model.layers.0.self_attn.k_proj.weight"))]


@pytest.mark.parametrize("name,side,param", GRADIENT_CHECKS)
def test_committed_gradients_match_the_reference_loss(name, side, param):
    cfg, w = ref.load(folder(name))
    expected = np.load(folder(name) + ".npz")
    ids, mask, labels = (expected[f"{side}/{k}"] for k in ("input_ids", "attention_mask", "labels"))
    grad = expected[f"{side}/grad/{param}"].astype(np.float64)
    direction = np.random.default_rng(0).standard_normal(grad.shape)
    original, step = w[param], 1e-4
    losses = []
    for sign in (1.0, -1.0):
        w[param] = original + sign * step * direction
        losses.append(ref.causal_lm_loss(ref.causal_lm_logits(cfg, w, ids, mask), labels))
    w[param] = original
    numeric = (losses[0] - losses[1]) / (2 * step)
    analytic = float(np.sum(grad * direction))
    # sum(grad * direction) has the size of |grad| (direction: standard normal entries); the float32
    # gradients, summed over their entries, are good to ~1e-6 of that
    assert abs(numeric - analytic) <= 1e-5 * np.linalg.norm(grad) + 1e-5 * abs(analytic), (numeric, analytic)
