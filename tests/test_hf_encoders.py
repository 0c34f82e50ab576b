"""The encoder families (bert, roberta, xlm-roberta, distilbert; issue 22) against transformers: the
fixtures of tests/fixtures/make_hf_encoder_fixtures.py (tiny random checkpoints with every
math-changing config field away from its default, transformers 5.25's float32 outputs for a
right-padded batch with token types). fp32 logits at real tokens within 1e-5 and gradients within
1e-4 (relative), the loss within 1e-5; save_pretrained -> from_pretrained bit-exact; bad configs
and inputs refused by name."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import gputrain as gt
from gputrain.models import from_pretrained
from gputrain.models.hf import encoders as enc

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
NAMES = ("bert-seqcls", "bert-mlm", "bert-tokcls", "roberta-seqcls", "roberta-mlm", "roberta-tokcls",
         "xlm-roberta-seqcls", "distilbert-seqcls", "distilbert-mlm", "distilbert-tokcls")
CLASSES = {"bert-seqcls": enc.BertForSequenceClassification, "bert-mlm": enc.BertForMaskedLM,
           "bert-tokcls": enc.BertForTokenClassification, "roberta-seqcls": enc.RobertaForSequenceClassification,
           "roberta-mlm": enc.RobertaForMaskedLM, "roberta-tokcls": enc.RobertaForTokenClassification,
           "xlm-roberta-seqcls": enc.XLMRobertaForSequenceClassification,
           "distilbert-seqcls": enc.DistilBertForSequenceClassification,
           "distilbert-mlm": enc.DistilBertForMaskedLM, "distilbert-tokcls": enc.DistilBertForTokenClassification}


def folder_of(name):
    return os.path.join(FIXTURES, f"{name}-tiny")


def reference(name):
    return np.load(folder_of(name) + ".npz")


def relative_error(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def inputs(model, ref):
    types = ref["token_type_ids"] if model.config.type_vocab_size else None
    return ref["input_ids"], ref["attention_mask"], types


def real(logits, mask):
    """The outputs transformers computes meaningfully: a token classifier's and an MLM's at real
    tokens (a padded position's own output is not a real token's), a sequence classifier's all."""
    return logits[mask.astype(bool)] if logits.ndim == 3 else logits


def targets(ref):
    labels = ref["labels"]
    return labels.reshape(-1, 1).astype(np.float32) if labels.dtype.kind == "f" else labels.astype(np.int64)


@pytest.fixture(scope="module", params=NAMES)
def name(request):
    return request.param


def test_logits_match_transformers(name):
    ref = reference(name)
    model = from_pretrained(folder_of(name))
    assert type(model) is CLASSES[name] and not model.training
    ids, mask, types = inputs(model, ref)
    logits = model(ids, attention_mask=mask, token_type_ids=types)
    assert logits.shape == ref["logits"].shape
    assert relative_error(real(logits, mask), real(ref["logits"], mask)) <= 1e-5
    assert np.array_equal(model(model.pack(ids, mask, types)), logits)  # packed rows taken as they are


def _grad(model, params, name):
    """gputrain's gradient of transformers' parameter `name` (the word and token-type rows are one table)."""
    c, base = model.config, model.base_name
    table = f"{base}.embeddings.word_embeddings.weight"
    if name == f"{base}.embeddings.token_type_embeddings.weight":
        return params[table].grad[c.vocab_size:]
    if name == table:
        return params[table].grad[:c.vocab_size]
    return params[name].grad


def test_loss_and_gradients_match_transformers(name):
    ref = reference(name)
    model = from_pretrained(folder_of(name))
    if model.config.problem_type == "multi_label_classification":
        with pytest.raises(ValueError, match="multi_label_classification"):
            model.loss_fn()  # BCEWithLogitsLoss: no gputrain loss yet (the logits are checked above)
        return
    ids, mask, types = inputs(model, ref)
    out = gt.TrainStep(model, model.loss_fn())(model.pack(ids, mask, types), targets(ref))
    assert out.loss == pytest.approx(float(ref["loss"]), rel=1e-5)
    params = dict(model.named_parameters())
    saved = [k.removeprefix("grad/") for k in ref.files if k.startswith("grad/")]
    assert len(saved) == len(enc._tensors((model.config, {}, type(model))))  # every parameter of the checkpoint
    for key in saved:
        grad, expected = _grad(model, params, key), ref["grad/" + key]
        if key.endswith(("key.bias", "k_lin.bias")):
            # exactly 0 in exact arithmetic (softmax ignores a shift of every score of a query):
            # both sides are rounding noise, small against the query bias's gradient
            query = ref["grad/" + key.replace("key.bias", "query.bias").replace("k_lin.bias", "q_lin.bias")]
            assert np.linalg.norm(grad - expected) <= 1e-4 * np.linalg.norm(query), key
            continue
        assert relative_error(grad, expected) <= 1e-4, key


def test_save_pretrained_round_trip_is_bit_exact(name, tmp_path):
    ref = reference(name)
    model = from_pretrained(folder_of(name))
    model.save_pretrained(tmp_path)
    import safetensors.numpy

    original = safetensors.numpy.load_file(os.path.join(folder_of(name), "model.safetensors"))
    written = safetensors.numpy.load_file(os.path.join(tmp_path, "model.safetensors"))
    assert set(written) == set(original)  # transformers' names, tied tensors left out as transformers does
    for key, value in original.items():
        assert np.array_equal(written[key], value), key
    config = json.load(open(os.path.join(tmp_path, "config.json")))
    assert config["architectures"] == [type(model).__name__]
    again = from_pretrained(tmp_path)
    ids, mask, types = inputs(model, ref)
    assert np.array_equal(again(ids, mask, types), model(ids, mask, types))


def test_built_from_a_config_mapping_trains():
    values = json.load(open(os.path.join(folder_of("bert-seqcls"), "config.json")))
    gt.random.manual_seed(0)
    model = enc.BertForSequenceClassification(values)
    ref = reference("bert-seqcls")
    ids, mask, types = inputs(model, ref)
    step = gt.TrainStep(model, model.loss_fn(), gt.optim.AdamW(model.parameters(), lr=1e-3))
    losses = [step(model.pack(ids, mask, types), targets(ref)).loss for _ in range(25)]
    assert losses[-1] < 0.5 * losses[0]


def test_padding_never_reaches_the_real_tokens():
    ref = reference("roberta-tokcls")
    model = from_pretrained(folder_of("roberta-tokcls"))
    ids, mask, types = inputs(model, ref)
    logits = model(ids, mask, types)
    longer = np.concatenate([ids, np.full((3, 4), model.config.pad_token_id)], axis=1)
    wider = np.concatenate([mask, np.zeros((3, 4), np.int64)], axis=1)
    more_types = np.concatenate([types, np.zeros((3, 4), np.int64)], axis=1)
    assert relative_error(model(longer, wider, more_types)[:, :12][mask.astype(bool)],
                          logits[mask.astype(bool)]) <= 1e-6


def _write(tmp_path, name, **changes):
    folder = tmp_path / "model"
    shutil.copytree(folder_of(name), folder)
    path = folder / "config.json"
    values = json.load(open(path))
    for key, value in changes.items():
        if value is _DROP:
            values.pop(key, None)
        else:
            values[key] = value
    json.dump(values, open(path, "w"))
    return folder


_DROP = object()


@pytest.mark.parametrize("name, field, value", [
    ("bert-seqcls", "position_embedding_type", "relative_key"),
    ("bert-seqcls", "hidden_act", "quick_gelu"),
    ("bert-seqcls", "is_decoder", True),
    ("bert-seqcls", "add_cross_attention", True),
    ("bert-seqcls", "layer_norm_eps", 0.0),
    ("bert-seqcls", "hidden_dropout_prob", 1.0),
    ("bert-seqcls", "problem_type", "ranking"),
    ("bert-seqcls", "num_labels", 4),
    ("bert-seqcls", "some_new_field", 1),
    ("roberta-seqcls", "pad_token_id", None),
    ("roberta-seqcls", "pad_token_id", 19),
    ("distilbert-seqcls", "sinusoidal_pos_embds", True),
    ("distilbert-seqcls", "pad_token_id", 99),
    ("distilbert-seqcls", "activation", "gelu_fast"),
])
def test_bad_configs_are_refused_by_field(tmp_path, name, field, value):
    folder = _write(tmp_path, name, **{field: value})
    with pytest.raises(ValueError, match=f"'?{field}'?"):
        from_pretrained(folder)


def test_heads_and_sizes_are_checked(tmp_path):
    with pytest.raises(ValueError, match="num_attention_heads"):
        from_pretrained(_write(tmp_path, "bert-tokcls", num_attention_heads=5))
    with pytest.raises(ValueError, match="architectures"):
        from_pretrained(_write(tmp_path / "a", "bert-tokcls", architectures=["BertForNextSentencePrediction"]))
    with pytest.raises(ValueError, match=r"classifier\.(weight|bias)"):  # num_labels (from id2label) against the tensor
        from_pretrained(_write(tmp_path / "b", "bert-tokcls", id2label={str(i): str(i) for i in range(7)}))


def test_bad_inputs_are_refused_by_name():
    ref = reference("roberta-seqcls")
    model = from_pretrained(folder_of("roberta-seqcls"))
    ids, mask, types = inputs(model, ref)
    inside = ids.copy()
    inside[0, 3] = model.config.pad_token_id  # a pad id among the real tokens: other positions in transformers
    with pytest.raises(ValueError, match="input_ids: row 0 holds pad_token_id"):
        model(inside, mask, types)
    with pytest.raises(ValueError, match="token_type_ids must be in"):
        model(ids, mask, types + 2)
    with pytest.raises(ValueError, match="input_ids must be in"):
        model(ids + 99, mask, types)
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, mask[:, ::-1], types)  # left padding
    distil = from_pretrained(folder_of("distilbert-seqcls"))
    with pytest.raises(ValueError, match="token_type_ids: a distilbert model has no token types"):
        distil(ids, mask, types)
    too_long = np.full((1, 20 - 2 + 1), 5)  # RoBERTa's 20 positions start at pad_token_id + 1 = 2
    with pytest.raises(ValueError, match="positions"):
        model(too_long)
    assert model(too_long[:, :-1]).shape == (1, 3)


def test_names_are_transformers():
    model = from_pretrained(folder_of("bert-mlm"))
    names = dict(model.named_modules())
    assert "bert.encoder.layer.1.attention.self.query" in names and "cls.predictions.transform.dense" in names
    assert model.get_submodule("bert.encoder.layer.0.attention.output.LayerNorm") is not None
    params = dict(model.named_parameters())
    assert params["bert.embeddings.word_embeddings.weight"].shape == (99 + 3, 48)  # word + token-type rows
    assert "cls.predictions.bias" in params and "cls.predictions.decoder.weight" not in params  # tied


@pytest.mark.sim
@pytest.mark.parametrize("precision, checkpointing", [("fp32", False), ("bf16", True)])
@pytest.mark.parametrize("name", ["bert-mlm", "roberta-mlm"])
def test_mlm_trains_on_sim_with_the_cpu_bits(name, precision, checkpointing):
    """The tied decoder over the word rows of the token table, its bias and RoBERTa's offset
    positions: sim gives the CPU's bits, two micro-batches (the accumulating path) included."""
    ref = reference(name)

    def trained(device):
        gt.random.manual_seed(0)
        model = from_pretrained(folder_of(name))
        model.train()
        if device != "cpu":
            model = model.to(device)
        step = gt.TrainStep(model, model.loss_fn(), gt.optim.AdamW(model.parameters(), lr=1e-3),
                            precision=precision, gradient_checkpointing=checkpointing, micro_batches=3)
        ids, mask, types = inputs(model, ref)
        losses = [step(model.pack(ids, mask, types), targets(ref)).loss for _ in range(2)]
        return losses, model.state_dict()

    (cpu_losses, cpu_state), (sim_losses, sim_state) = trained("cpu"), trained("sim")
    assert cpu_losses == sim_losses and np.isfinite(cpu_losses).all()
    assert all(np.array_equal(cpu_state[k], sim_state[k]) for k in cpu_state)


def test_position_offset_and_bias_layers_against_numpy():
    gt.random.manual_seed(1)
    position, bias = gt.nn.PositionEmbedding(9, 4, offset=3), gt.nn.Bias(4)
    model = gt.nn.Sequential(position, bias)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((9, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    model.load_state_dict({"0.weight": table, "1.bias": b})
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    y = rng.standard_normal((2, 5, 4)).astype(np.float32)
    expected = x + table[3:8] + b
    assert np.allclose(model(x), expected, rtol=1e-6, atol=1e-6)
    for micro_batches in (1, 2):  # the second accumulates into the gradients
        gt.TrainStep(model, gt.nn.MSELoss(), micro_batches=micro_batches)(x, y)
        dout = 2 * (expected - y) / expected.size
        dtable = np.zeros_like(table)
        dtable[3:8] = dout.sum(axis=0)
        assert np.allclose(position.weight.grad, dtable, rtol=1e-5, atol=1e-7)  # rows 0..2 and 8: zeros
        assert np.allclose(bias.bias.grad, dout.sum(axis=(0, 1)), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="offset"):
        gt.nn.PositionEmbedding(9, 4, offset=9)
    with pytest.raises(ValueError, match="positions"):
        model(np.zeros((1, 7, 4), np.float32))  # rows 3..9 do not exist


@pytest.mark.parametrize("source, cls", [("bert-mlm", enc.BertForSequenceClassification),
                                         ("roberta-mlm", enc.RobertaForTokenClassification),
                                         ("distilbert-mlm", enc.DistilBertForSequenceClassification)])
def test_a_head_over_a_pretraining_checkpoint(source, cls, tmp_path):
    """The users' start: an MLM checkpoint's encoder under a new classifier (AutoModelFor...(num_labels=))."""
    mlm = from_pretrained(folder_of(source))
    gt.random.manual_seed(3)
    model = cls.from_pretrained(folder_of(source), num_labels=4)
    assert type(model) is cls and model.config.num_labels == 4 and not model.training
    state, encoder = model.state_dict(), mlm.state_dict()
    shared = [k for k in state if k.startswith(model.base_name + ".") and ".pooler." not in k]
    assert shared and all(np.array_equal(state[k], encoder[k]) for k in shared)
    head = [k for k in state if k not in encoder]
    assert head and all(not state[k].any() for k in head if k.endswith("bias"))
    ref = reference(source)
    logits = model(*inputs(model, ref))
    assert logits.shape[-1] == 4 and np.isfinite(logits).all()
    model.save_pretrained(tmp_path)  # a folder of the new head, read back exactly
    again = from_pretrained(tmp_path)
    assert type(again) is cls and np.array_equal(again(*inputs(model, ref)), logits)
    with pytest.raises(ValueError, match="model_type"):
        enc.RobertaForMaskedLM.from_pretrained(folder_of("bert-mlm"))
    with pytest.raises(ValueError, match="num_labels"):
        cls.from_pretrained(folder_of(source), num_labels=0)


def test_other_heads_tensors_and_old_names_are_read_as_transformers_does(tmp_path):
    """bert-base-uncased's files: the NSP head and the pooler beside the MLM head (skipped by a
    BertForMaskedLM, as transformers does), LayerNorm gamma/beta of TF-converted files."""
    import safetensors.numpy

    folder = tmp_path / "bert"
    shutil.copytree(folder_of("bert-mlm"), folder)
    path = str(folder / "model.safetensors")
    tensors = safetensors.numpy.load_file(path)
    tensors["cls.seq_relationship.weight"] = np.ones((2, 48), np.float32)
    tensors["bert.pooler.dense.weight"] = np.ones((48, 48), np.float32)
    tensors["bert.embeddings.LayerNorm.gamma"] = tensors.pop("bert.embeddings.LayerNorm.weight")
    safetensors.numpy.save_file(tensors, path)
    ref = reference("bert-mlm")
    model = from_pretrained(folder)
    assert np.array_equal(model(*inputs(model, ref)), from_pretrained(folder_of("bert-mlm"))(*inputs(model, ref)))


@pytest.mark.sim
def test_a_sim_trainer_run_of_an_mlm_peaks_at_its_plan(tmp_path):
    """tests/test_memory_plan.py's sim check with the encoder's kinds (tied decoder over the token
    table, bias, offset positions): the device pool's peak is the Trainer's plan."""
    import gc

    ref = reference("roberta-mlm")
    model = from_pretrained(folder_of("roberta-mlm")).to("sim")
    x = np.repeat(model.pack(*inputs(model, ref)), 2, axis=0)
    y = np.repeat(targets(ref), 2, axis=0)
    gc.collect()
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=6, learning_rate=1e-3,
                                save_strategy="no", logging_steps=50, disable_tqdm=True, seed=3, device="sim",
                                max_steps=1, bf16=True)
    gt.reset_peak_memory_stats("sim:0")
    trainer = gt.Trainer(model, args, train_dataset=(x, y))
    plan = trainer.memory_plan()
    trainer.train()
    assert trainer.state.global_step == 1
    assert gt.memory_stats("sim:0")["peak_reserved_bytes"] == plan.total("sim:0"), str(plan)


@pytest.mark.parametrize("name", ["bert-mlm", "roberta-mlm", "distilbert-mlm"])
def test_copies_and_pickles_keep_the_model(name):
    import copy
    import pickle

    ref = reference(name)
    model = from_pretrained(folder_of(name))
    logits = model(*inputs(model, ref))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert np.array_equal(clone(*inputs(model, ref)), logits)
        assert list(clone.state_dict()) == list(model.state_dict())


def test_a_new_model_starts_at_transformers_init():
    gt.random.manual_seed(0)
    model = enc.BertForMaskedLM(json.load(open(os.path.join(folder_of("bert-mlm"), "config.json"))))
    state = model.state_dict()
    words = state["bert.embeddings.word_embeddings.weight"]
    assert not words[model.config.pad_token_id].any() and 0.015 < words[1:].std() < 0.025
    assert not state["cls.predictions.bias"].any() and (state["bert.embeddings.LayerNorm.weight"] == 1).all()


def test_bf16_is_close(name):
    """gputrain's bf16 (fp32 accumulation, fp32 LayerNorm/softmax statistics) against transformers'
    fp32, no worse than transformers' own bf16 (weights and activations in bfloat16) is. Per-token
    heads (hundreds of logits) meet transformers' error itself; a sequence classifier's 3 or 9
    logits are too few for the comparison to be that sharp (measured: 1.15x and 1.22x of
    transformers' on bert-seqcls and distilbert-seqcls), so they get 1.25x."""
    ref = reference(name)
    model = from_pretrained(folder_of(name), dtype="bfloat16")
    ids, mask, types = inputs(model, ref)
    logits = model(ids, mask, types)
    error = relative_error(real(logits, mask), real(ref["logits"], mask))
    assert error <= float(ref["bf16_error"]) * (1.0 if logits.ndim == 3 else 1.25), error
