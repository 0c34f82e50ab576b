"""The deberta-v2 family (DeBERTa-v2/v3; issue 22) against transformers: the fixtures of
tests/fixtures/make_hf_encoder_fixtures.py (tiny random checkpoints, transformers 5.25's float32
outputs for a right-padded batch): log buckets shorter than the rows (linear, log and clamped
distances), no buckets (clamped linear distances), shared and own position projections,
p2c|c2p, c2p only and p2c only, absolute positions or none, token types or none, embedding_size
!= hidden_size. fp32 logits at real tokens within 1e-5 and gradients within 1e-4 (relative);
bf16 within transformers' own bf16 error; save_pretrained -> from_pretrained bit-exact; sim
bit-identical to the CPU; bad configs refused by field."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import gputrain as gt
from gputrain.models import from_pretrained
from gputrain.models.hf import deberta

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
CLASSES = {"deberta-v2-seqcls": deberta.DebertaV2ForSequenceClassification,
           "deberta-v2-tokcls": deberta.DebertaV2ForTokenClassification,
           "deberta-v2-mlm": deberta.DebertaV2ForMaskedLM,
           "deberta-v2-regression": deberta.DebertaV2ForSequenceClassification}
NAMES = tuple(CLASSES)


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
    """Per-token logits at real tokens (padded positions' own outputs are not transformers'), a
    sequence classifier's all."""
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


def _grad(model, params, name):
    c = model.config
    table = "deberta.embeddings.word_embeddings.weight"
    if name == "deberta.embeddings.token_type_embeddings.weight":
        return params[table].grad[c.vocab_size:]
    if name == table:
        return params[table].grad[:c.vocab_size]
    return params[name].grad


def test_loss_and_gradients_match_transformers(name):
    ref = reference(name)
    model = from_pretrained(folder_of(name))
    ids, mask, types = inputs(model, ref)
    out = gt.TrainStep(model, model.loss_fn())(model.pack(ids, mask, types), targets(ref))
    assert out.loss == pytest.approx(float(ref["loss"]), rel=1e-5)
    params = dict(model.named_parameters())
    saved = [k.removeprefix("grad/") for k in ref.files if k.startswith("grad/")]
    assert len(saved) == len(deberta._tensors((model.config, {}, type(model))))  # every parameter
    for key in saved:
        grad, expected = _grad(model, params, key), ref["grad/" + key]
        if key.endswith("pos_key_proj.bias") or (key.endswith(".key_proj.bias") and not model.config.p2c):
            # q_i . b is the same for every key of query i (the c2p term's bias, and the key bias
            # without a p2c term): softmax ignores it, the gradient is exactly 0 in exact
            # arithmetic and both sides are rounding noise, small against the query bias's gradient
            query = ref["grad/" + key.replace("pos_key_proj", "query_proj").replace(".key_proj", ".query_proj")]
            assert np.linalg.norm(grad - expected) <= 1e-4 * np.linalg.norm(query), key
            continue
        assert relative_error(grad, expected) <= 1e-4, key


def test_save_pretrained_round_trip_is_bit_exact(name, tmp_path):
    import safetensors.numpy

    ref = reference(name)
    model = from_pretrained(folder_of(name))
    model.save_pretrained(tmp_path)
    original = safetensors.numpy.load_file(os.path.join(folder_of(name), "model.safetensors"))
    written = safetensors.numpy.load_file(os.path.join(tmp_path, "model.safetensors"))
    assert set(written) == set(original)
    for key, value in original.items():
        assert np.array_equal(written[key], value), key
    assert json.load(open(os.path.join(tmp_path, "config.json")))["architectures"] == [type(model).__name__]
    again = from_pretrained(tmp_path)
    assert np.array_equal(again(*inputs(model, ref)), model(*inputs(model, ref)))


def test_bf16_is_close(name):
    """gputrain's bf16 against transformers' fp32, no worse than transformers' own bf16 (1.25x for
    a sequence classifier's few logits, as tests/test_hf_encoders.py allows)."""
    ref = reference(name)
    model = from_pretrained(folder_of(name), dtype="bfloat16")
    ids, mask, types = inputs(model, ref)
    logits = model(ids, mask, types)
    error = relative_error(real(logits, mask), real(ref["logits"], mask))
    assert error <= float(ref["bf16_error"]) * (1.0 if logits.ndim == 3 else 1.25), error


@pytest.mark.sim
@pytest.mark.parametrize("name, precision, checkpointing", [("deberta-v2-mlm", "fp32", False),
                                                            ("deberta-v2-seqcls", "bf16", True)])
def test_training_on_sim_gives_the_cpu_bits(name, precision, checkpointing):
    """Two steps of three micro-batches each (the accumulating path), dropout on (attention
    probabilities and the relative table): sim gives the CPU's bits."""
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


def test_built_from_a_config_mapping_trains():
    values = json.load(open(os.path.join(folder_of("deberta-v2-seqcls"), "config.json")))
    gt.random.manual_seed(0)
    model = deberta.DebertaV2ForSequenceClassification(values)
    state = model.state_dict()
    assert not state["deberta.embeddings.word_embeddings.weight"][0].any()  # pad row, transformers' init
    ref = reference("deberta-v2-seqcls")
    ids, mask, types = inputs(model, ref)
    step = gt.TrainStep(model, model.loss_fn(), gt.optim.AdamW(model.parameters(), lr=3e-3))
    losses = [step(model.pack(ids, mask, types), targets(ref)).loss for _ in range(25)]
    assert losses[-1] < 0.5 * losses[0]


def test_padding_never_reaches_the_real_tokens():
    ref = reference("deberta-v2-tokcls")
    model = from_pretrained(folder_of("deberta-v2-tokcls"))
    ids, mask, types = inputs(model, ref)
    logits = model(ids, mask, types)
    longer = np.concatenate([ids, np.zeros((3, 4), np.int64)], axis=1)
    wider = np.concatenate([mask, np.zeros((3, 4), np.int64)], axis=1)
    more_types = np.concatenate([types, np.zeros((3, 4), np.int64)], axis=1)
    assert relative_error(model(longer, wider, more_types)[:, :12][mask.astype(bool)],
                          logits[mask.astype(bool)]) <= 1e-6


def test_names_are_transformers():
    model = from_pretrained(folder_of("deberta-v2-mlm"))
    params = dict(model.named_parameters())
    assert params["deberta.embeddings.word_embeddings.weight"].shape == (99 + 3, 24)  # word + token-type rows
    assert params["deberta.encoder.rel_embeddings.weight"].shape == (2 * 5, 32)
    assert "deberta.encoder.layer.1.attention.self.pos_query_proj.weight" in params
    assert "cls.predictions.bias" in params and "cls.predictions.decoder.weight" not in params  # tied
    shared = from_pretrained(folder_of("deberta-v2-seqcls"))
    assert not any("pos_key_proj" in k for k in shared.state_dict())  # share_att_key


def test_a_head_over_a_pretraining_checkpoint(tmp_path):
    """DeBERTa-v3's use: an MLM checkpoint's encoder (plus the pretraining heads transformers
    ignores) under a new classifier, and a bare DebertaV2Model's names."""
    import safetensors.numpy

    folder = tmp_path / "mlm"
    shutil.copytree(folder_of("deberta-v2-mlm"), folder)
    path = str(folder / "model.safetensors")
    tensors = safetensors.numpy.load_file(path)
    tensors["mask_predictions.classifier.weight"] = np.ones((1, 32), np.float32)
    safetensors.numpy.save_file(tensors, path)
    mlm = from_pretrained(folder)
    gt.random.manual_seed(3)
    model = deberta.DebertaV2ForSequenceClassification.from_pretrained(folder, num_labels=4)
    assert model.config.num_labels == 4
    state, encoder = model.state_dict(), mlm.state_dict()
    shared = [k for k in state if k.startswith("deberta.")]
    assert shared and all(np.array_equal(state[k], encoder[k]) for k in shared)
    ref = reference("deberta-v2-mlm")
    logits = model(*inputs(model, ref))
    assert logits.shape == (3, 4) and np.isfinite(logits).all()
    model.save_pretrained(tmp_path / "new")
    assert np.array_equal(from_pretrained(tmp_path / "new")(*inputs(model, ref)), logits)
    bare = tmp_path / "bare"  # DebertaV2Model's names (no "deberta." prefix), no architectures
    bare.mkdir()
    safetensors.numpy.save_file({k.removeprefix("deberta."): v for k, v in tensors.items()
                                 if k.startswith("deberta.")}, str(bare / "model.safetensors"))
    values = json.load(open(folder / "config.json"))
    values.pop("architectures")
    json.dump(values, open(bare / "config.json", "w"))
    head = deberta.DebertaV2ForTokenClassification.from_pretrained(bare, num_labels=2)
    assert all(np.array_equal(head.state_dict()[k], encoder[k]) for k in shared)


def _write(tmp_path, name, **changes):
    folder = tmp_path / "model"
    shutil.copytree(folder_of(name), folder)
    path = folder / "config.json"
    values = json.load(open(path))
    values.update(changes)
    json.dump(values, open(path, "w"))
    return folder


@pytest.mark.parametrize("field, value", [
    ("relative_attention", False),
    ("pos_att_type", ["p2p"]),
    ("pos_att_type", []),
    ("conv_kernel_size", 3),
    ("legacy", False),
    ("norm_rel_ebd", "batch_norm"),
    ("position_buckets", 1),
    ("attention_head_size", 4),
    ("pooler_hidden_size", 16),
    ("hidden_act", "quick_gelu"),
    ("pooler_hidden_act", "mish"),
    ("cls_dropout", 1.0),
    ("some_new_field", 1),
])
def test_bad_configs_are_refused_by_field(tmp_path, field, value):
    with pytest.raises(ValueError, match=f"'?{field}'?"):
        from_pretrained(_write(tmp_path, "deberta-v2-seqcls", **{field: value}))


def test_an_untied_mlm_decoder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        from_pretrained(_write(tmp_path, "deberta-v2-mlm", tie_word_embeddings=False))


def test_the_kind_refuses_bad_arguments():
    spec = [("disentangled_attention", 8, 2, 0.0, 4, 4, 8, True, False, [("parallel", [("linear", 8, 8, True)])])]
    for index, value, field in ((1, 3, "divisible"), (7, False, "c2p or p2c"), (5, 1, "buckets")):
        bad = list(spec[0])
        bad[index] = value
        if index == 7:
            bad[8] = False
        with pytest.raises(ValueError, match=field):
            gt._C.Model([tuple(bad)], 0)


def test_gradient_checkpointing_gives_the_same_gradients():
    """The relative table, its norm and the tied projections inside a recomputed block."""
    ref = reference("deberta-v2-mlm")

    def grads(checkpointing):
        model = from_pretrained(folder_of("deberta-v2-mlm"))
        step = gt.TrainStep(model, model.loss_fn(), gradient_checkpointing=checkpointing)
        loss = step(model.pack(*inputs(model, ref)), targets(ref)).loss
        return loss, {k: p.grad.copy() for k, p in model.named_parameters()}

    (loss, plain), (again, recomputed) = grads(False), grads(True)
    assert loss == again and all(np.array_equal(plain[k], recomputed[k]) for k in plain)


def test_copies_and_pickles_keep_the_model():
    import copy
    import pickle

    ref = reference("deberta-v2-tokcls")
    model = from_pretrained(folder_of("deberta-v2-tokcls"))
    logits = model(*inputs(model, ref))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert np.array_equal(clone(*inputs(model, ref)), logits)
        assert list(clone.state_dict()) == list(model.state_dict())


@pytest.mark.sim
def test_a_sim_trainer_run_peaks_at_its_plan(tmp_path):
    """The kind's buffers (statistics, the relative positions' input, table and gradient) are in
    the plan: the device pool's peak is the Trainer's plan (tests/test_memory_plan.py's check)."""
    import gc

    ref = reference("deberta-v2-mlm")
    model = from_pretrained(folder_of("deberta-v2-mlm")).to("sim")
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


def test_any_thread_count_gives_the_same_bits():
    ref = reference("deberta-v2-seqcls")
    previous = gt.get_num_threads()

    def run(threads):
        gt.set_num_threads(threads)
        model = from_pretrained(folder_of("deberta-v2-seqcls"))
        out = gt.TrainStep(model, model.loss_fn())(model.pack(*inputs(model, ref)), targets(ref))
        return out.loss, {k: p.grad.copy() for k, p in model.named_parameters()}

    try:
        (one, grads_one), (three, grads_three) = run(1), run(3)
    finally:
        gt.set_num_threads(previous)
    assert one == three and all(np.array_equal(grads_one[k], grads_three[k]) for k in grads_one)
