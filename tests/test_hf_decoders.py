"""The Llama-like decoder families against transformers: the fixtures of
tests/fixtures/make_hf_fixtures.py (tiny random checkpoints with every math-changing config field
away from its default, and transformers 5.25's float32 outputs for right-padded, left-padded and
packed batches). fp32 logits within 1e-5 and gradients within 1e-4 (relative), the loss within
1e-5; bf16 within a bound that transformers' own bf16 meets against its fp32."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import gputrain as gt
from gputrain.models import from_pretrained
from gputrain.models.hf import decoder_models as dm

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma3")
CLASSES = {"llama": dm.LlamaForCausalLM, "qwen2": dm.Qwen2ForCausalLM, "qwen3": dm.Qwen3ForCausalLM,
           "mistral": dm.MistralForCausalLM, "gemma": dm.GemmaForCausalLM, "gemma3": dm.Gemma3ForCausalLM}


def folder_of(family, kind="tiny"):
    return os.path.join(FIXTURES, f"{family}-{kind}")


def reference(family, kind="tiny"):
    return np.load(folder_of(family, kind) + ".npz")


def relative_error(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def real_positions(mask):
    """The logits positions transformers computes meaningfully: real tokens."""
    return mask.astype(bool)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.mark.parametrize("side", ["right", "left"])
def test_logits_and_loss_match_transformers(family, side):
    ref = reference(family)
    model = from_pretrained(folder_of(family))
    assert isinstance(model, CLASSES[family]) and not model.training
    ids, mask = ref[f"{side}/input_ids"], ref[f"{side}/attention_mask"]
    logits = model(ids, attention_mask=mask)
    keep = real_positions(mask)
    assert relative_error(logits[keep], ref[f"{side}/logits"][keep]) <= 1e-5
    targets = model.shift_labels(ref[f"{side}/labels"])
    out = gt.TrainStep(model, gt.nn.CrossEntropyLoss())(ids, targets, attention_mask=mask)
    assert out.loss == pytest.approx(float(ref[f"{side}/loss"]), rel=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_gradients_match_transformers(family, side):
    ref = reference(family)
    model = from_pretrained(folder_of(family))
    ids, mask = ref[f"{side}/input_ids"], ref[f"{side}/attention_mask"]
    gt.TrainStep(model, gt.nn.CrossEntropyLoss())(ids, model.shift_labels(ref[f"{side}/labels"]), attention_mask=mask)
    params = dict(model.named_parameters())
    saved = [k for k in ref.files if k.startswith(f"{side}/grad/")]
    assert saved
    for key in saved:
        name = key.removeprefix(f"{side}/grad/")
        assert relative_error(params[name].grad, ref[key]) <= 1e-4, name


def test_packed_documents_never_attend_across(family):
    ref = reference(family)
    model = from_pretrained(folder_of(family))
    logits = model(ref["packed/input_ids"], position_ids=ref["packed/position_ids"])
    assert relative_error(logits, ref["packed/logits"]) <= 1e-5
    assert relative_error(logits, ref["packed/doc_logits"]) <= 1e-5


def test_legacy_config_spelling_builds_the_same_model(family, tmp_path):
    legacy = tmp_path / "legacy"
    shutil.copytree(folder_of(family, "tiny-legacy"), legacy)
    shutil.copy(os.path.join(folder_of(family), "model.safetensors"), legacy)
    assert from_pretrained(legacy).config == from_pretrained(folder_of(family)).config


def test_save_then_load_is_bit_exact(family, tmp_path):
    model = from_pretrained(folder_of(family))
    model.save_pretrained(tmp_path / "a", max_shard_size="20KB")
    again = from_pretrained(tmp_path / "a")
    assert type(again) is type(model) and again.config == model.config
    for (name, a), (other, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert name == other and np.array_equal(a, b), name
    ref = reference(family)
    np.testing.assert_array_equal(again(ref["right/input_ids"]), model(ref["right/input_ids"]))
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["architectures"] == [type(model).__name__] and saved["dtype"] == "float32"


def test_generate_greedy_matches_transformers(family):
    ref = reference(family)
    model = from_pretrained(folder_of(family))
    np.testing.assert_array_equal(model.generate(ref["generate/prompt"], 8), ref["generate/output"])


def test_bf16_is_close(family):
    ref = reference(family)
    model = from_pretrained(folder_of(family), dtype="bfloat16")
    ids, mask = ref["right/input_ids"], ref["right/attention_mask"]
    keep = real_positions(mask)
    error = relative_error(model(ids, attention_mask=mask)[keep], ref["right/logits"][keep])
    assert error <= float(ref["right/bf16_error"])  # transformers' own bf16 against its fp32


def test_module_names_are_transformers(family):
    model = from_pretrained(folder_of(family))
    names = dict(model.named_modules())
    assert isinstance(names["model.layers.0.self_attn.q_proj"], gt.nn.Linear)
    assert model.get_submodule("model.layers.1.mlp.down_proj") is model.model.layers[1].mlp.down_proj


@pytest.mark.parametrize("family_name", ["llama", "qwen2"])
def test_sequence_classification_matches_transformers(family_name):
    ref = reference(family_name, "seqcls-tiny")
    model = from_pretrained(folder_of(family_name, "seqcls-tiny"))
    assert isinstance(model, dm.DecoderForSequenceClassification)
    for side in ("right", "left"):
        logits = model(ref[f"{side}/input_ids"], attention_mask=ref[f"{side}/attention_mask"])
        assert relative_error(logits, ref[f"{side}/logits"]) <= 1e-5, side
        out = gt.TrainStep(model, gt.nn.CrossEntropyLoss())(
            ref[f"{side}/input_ids"], ref[f"{side}/labels"], attention_mask=ref[f"{side}/attention_mask"])
        assert out.loss == pytest.approx(float(ref[f"{side}/loss"]), rel=1e-5), side


def test_a_small_llama_builds_from_a_config_mapping_and_trains(tmp_path):
    config = {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    model = dm.LlamaForCausalLM(config)
    ids = np.random.default_rng(0).integers(0, 50, (4, 12))
    optimizer = gt.optim.AdamW(model.parameters(), lr=1e-2)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer)
    losses = [step(ids, model.shift_labels(ids)).loss for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    model.save_pretrained(tmp_path / "small")
    again = from_pretrained(tmp_path / "small")
    np.testing.assert_array_equal(again(ids), model.eval()(ids))


def test_bad_inputs_name_the_argument():
    model = from_pretrained(folder_of("llama"))
    ids = reference("llama")["right/input_ids"]
    with pytest.raises(IndexError, match=r"out of range \[0, 96\)"):
        model(ids + 1000)
    with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1"):
        model(ids, attention_mask=np.full(ids.shape, 2))
    with pytest.raises(ValueError, match="position_ids must have the shape"):
        model(ids, position_ids=np.zeros((1, 2), np.int64))
    with pytest.raises(ValueError, match="model_type 'qwen2' is not"):
        dm.LlamaForCausalLM({"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
                             "num_hidden_layers": 1, "num_attention_heads": 2})


def test_the_trainer_takes_packed_rows_and_shifts_the_labels(tmp_path):
    config = {"model_type": "qwen3", "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "head_dim": 8,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    rng = np.random.default_rng(1)
    documents = [rng.integers(0, 40, n) for n in (5, 9, 3, 12, 7, 6, 4, 10)]
    packed = gt.data.pack_sequences(documents, 16)
    gt.random.manual_seed(3)
    model = dm.Qwen3ForCausalLM(config)
    first = {k: v[:4] for k, v in packed.items()}
    expected = gt.TrainStep(model, gt.nn.CrossEntropyLoss())(
        first["input_ids"], model.shift_labels(first["labels"]), attention_mask=first["attention_mask"],
        position_ids=first["position_ids"]).loss
    model.zero_grad()
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1,
                                learning_rate=0.0, save_strategy="no", disable_tqdm=True, report_to="none")
    trainer = gt.Trainer(model=model, args=args, train_dataset=packed)
    result = trainer.train()
    assert result.training_loss == pytest.approx(expected, rel=1e-6)
    # each document alone gives the same per-token losses: no position sees another document
    alone = [model(d[None])[0, :-1] for d in documents[:2]]
    together = model(first["input_ids"][:1], position_ids=first["position_ids"][:1])[0]
    np.testing.assert_allclose(together[:4], alone[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(together[5:13], alone[1], rtol=1e-5, atol=1e-6)


def test_a_classifier_over_a_causal_lm_checkpoint():
    causal = from_pretrained(folder_of("llama"))
    model = dm.LlamaForSequenceClassification.from_pretrained(folder_of("llama"), num_labels=3)
    assert model.config.num_labels == 3 and model.score.weight.shape == (3, 64)
    own = model.state_dict()
    for name, value in causal.state_dict().items():
        if name.startswith("model."):
            assert np.array_equal(own[name], value), name
    ids = reference("llama")["right/input_ids"]
    assert model(ids).shape == (3, 3)
    # a classifier checkpoint keeps its score
    ref = reference("llama", "seqcls-tiny")
    again = dm.LlamaForSequenceClassification.from_pretrained(folder_of("llama", "seqcls-tiny"))
    np.testing.assert_array_equal(again(ref["right/input_ids"], attention_mask=ref["right/attention_mask"]),
                                  from_pretrained(folder_of("llama", "seqcls-tiny"))(
                                      ref["right/input_ids"], attention_mask=ref["right/attention_mask"]))
    with pytest.raises(ValueError, match="loads 'qwen2' checkpoints"):
        dm.Qwen2ForSequenceClassification.from_pretrained(folder_of("llama"))
    with pytest.raises(ValueError, match="num_labels must be"):
        dm.LlamaForSequenceClassification.from_pretrained(folder_of("llama"), num_labels=0)
