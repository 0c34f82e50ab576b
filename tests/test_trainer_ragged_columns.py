"""The Trainer reads gt.data.tokenize's output as it is (a mapping with ragged columns, padded per
batch by the DataLoader), and an encoder with a token-type table comes back from the Trainer's own
checkpoints (load_best_model_at_end), whose model.safetensors holds transformers' two embedding
tensors."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

import gputrain as gt
from gputrain.models.hf.encoders import BertForSequenceClassification

CONFIG = {"model_type": "bert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32, "num_labels": 3,
          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": 0}


def ragged_pairs(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 20, n)
    ids = rng.integers(5, 40, int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    types = (np.arange(int(lengths.sum())) - np.repeat(offsets[:-1], lengths) >= np.repeat(lengths // 2, lengths))
    return {"input_ids": gt.data.RaggedArray(ids, offsets, pad_value=0, pad_to_multiple_of=8),
            "attention_mask": gt.data.RaggedArray(np.ones_like(ids), offsets, pad_to_multiple_of=8),
            "token_type_ids": gt.data.RaggedArray(types.astype(np.int64), offsets, pad_to_multiple_of=8),
            "labels": rng.integers(0, 3, n)}


def padded(columns: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    width = int(np.diff(columns["input_ids"].offsets).max())
    out = []
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        ragged = columns[name]
        rows = np.zeros((len(ragged), width), np.int64)
        for i in range(len(ragged)):
            row = ragged.values[ragged.offsets[i]:ragged.offsets[i + 1]]
            rows[i, :len(row)] = row
        out.append(rows)
    return tuple(out)


def test_ragged_columns_train_evaluate_and_predict(tmp_path):
    gt.random.manual_seed(0)
    model = BertForSequenceClassification(CONFIG)
    train, test = ragged_pairs(40, 0), ragged_pairs(13, 1)
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=5,
                                num_train_epochs=1, save_strategy="no", disable_tqdm=True, report_to="none",
                                learning_rate=1e-2)
    trainer = gt.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test)
    assert trainer.train().global_step == 5
    output = trainer.predict(test)
    ids, mask, types = padded(test)
    expected = model.eval()(ids, attention_mask=mask, token_type_ids=types)
    np.testing.assert_allclose(output.predictions, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(output.label_ids, test["labels"])


def test_ragged_columns_of_different_lengths_are_refused(tmp_path):
    columns = ragged_pairs(10, 0)
    columns["labels"] = columns["labels"][:9]
    args = gt.TrainingArguments(output_dir=str(tmp_path), report_to="none", disable_tqdm=True)
    with pytest.raises(ValueError, match="train_dataset: the columns have different numbers of rows"):
        gt.Trainer(model=BertForSequenceClassification(CONFIG), args=args, train_dataset=columns)


def test_an_encoder_loads_its_best_checkpoint(tmp_path):
    gt.random.manual_seed(0)
    model = BertForSequenceClassification(CONFIG)
    train, test = ragged_pairs(32, 0), ragged_pairs(16, 1)
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=2,
                                eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
                                metric_for_best_model="loss", greater_is_better=False, learning_rate=1e-2,
                                disable_tqdm=True, report_to="none")
    trainer = gt.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test)
    trainer.train()
    best = trainer.state.best_model_checkpoint
    stored = load_file(f"{best}/model.safetensors")
    assert "bert.embeddings.token_type_embeddings.weight" in stored
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, stored[name], err_msg=name)
