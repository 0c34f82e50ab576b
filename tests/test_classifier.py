"""gputrain.models.TransformerClassifier and its encoders: the [CLS] a [SEP] b [SEP] layout with
longest-first truncation, state_dict names, training to well above chance on a task where the
padding holds the very token the label is about (so an ignored mask would mislead it), through
TrainStep and through the Trainer with Hugging Face style column mappings."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt

CLS, SEP, PAD = 1, 2, 0


def test_encode_pairs_layout_and_truncation():
    enc = gt.models.encode_pairs([[5, 6, 7], [8, 9, 10, 11, 12, 13]], [[20], [21, 22, 23]], 9, CLS, SEP, PAD)
    np.testing.assert_array_equal(enc["input_ids"], [[1, 5, 6, 7, 2, 20, 2, 0, 0],
                                                     [1, 8, 9, 10, 2, 21, 22, 23, 2]])
    np.testing.assert_array_equal(enc["token_type_ids"], [[0, 0, 0, 0, 0, 1, 1, 0, 0],
                                                          [0, 0, 0, 0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(enc["attention_mask"], [[1, 1, 1, 1, 1, 1, 1, 0, 0], [1] * 9])
    single = gt.models.encode_single([[5, 6, 7, 8]], 5, CLS, SEP, PAD)
    np.testing.assert_array_equal(single["input_ids"], [[1, 5, 6, 7, 2]])
    with pytest.raises(ValueError, match="second: expected 2 sequences"):
        gt.models.encode_pairs([[5], [6]], [[7]], 9, CLS, SEP)
    with pytest.raises(ValueError, match=r"first\[0\]: token ids must be >= 0"):
        gt.models.encode_pairs([[-1]], [[7]], 9, CLS, SEP)
    with pytest.raises(ValueError, match="max_len must be >= 5"):
        gt.models.encode_pairs([[5]], [[7]], 4, CLS, SEP)


def test_state_dict_names():
    model = gt.models.TransformerClassifier(30, 3, max_len=8, d_model=16, num_layers=1, num_heads=2)
    shapes = {name: value.shape for name, value in model.state_dict().items()}
    assert shapes["embeddings.weight"] == (32, 16)
    assert shapes["positions.weight"] == (8, 16)
    assert shapes["blocks.0.0.block.1.in_proj.weight"] == (48, 16)
    assert shapes["blocks.0.1.block.1.weight"] == (64, 16)
    assert shapes["norm.weight"] == (16,)
    assert shapes["head.weight"] == (3, 16)
    with pytest.raises(ValueError, match="input_ids: sequences of 9 tokens are longer than max_len=8"):
        model(np.ones((1, 9), np.int64))
    with pytest.raises(ValueError, match="pooling must be 'cls' or 'mean'"):
        gt.models.TransformerClassifier(30, 3, pooling="max")


def contains_task(n, seed, max_len=12, target=7):
    """Label 1 when `target` occurs among a sequence's real tokens; the padding is `target`."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    sequences = []
    for label in labels:
        words = [w for w in rng.integers(3, 20, rng.integers(2, max_len - 2)) if w != target]
        if label:
            words[rng.integers(len(words))] = target
        sequences.append(words)
    enc = gt.models.encode_single(sequences, max_len, CLS, SEP, pad_id=target)
    return enc, labels.astype(np.int64)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_learns_through_train_step(pooling):
    gt.random.manual_seed(0)
    model = gt.models.TransformerClassifier(20, 2, max_len=12, d_model=32, num_layers=1, num_heads=2,
                                            dropout=0.0, pooling=pooling, type_vocab_size=0)
    enc, labels = contains_task(512, 0)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=3e-3),
                        micro_batches=2)
    for epoch in range(8):
        for i in range(0, 512, 32):
            step(enc["input_ids"][i:i + 32], labels[i:i + 32], attention_mask=enc["attention_mask"][i:i + 32])
    test, test_labels = contains_task(400, 1)
    model.eval()
    accuracy = (model(test["input_ids"], test["attention_mask"]).argmax(-1) == test_labels).mean()
    assert accuracy > 0.9


def test_trainer_with_column_mappings(tmp_path):
    gt.random.manual_seed(0)
    model = gt.models.TransformerClassifier(20, 2, max_len=12, d_model=32, num_layers=1, num_heads=2,
                                            dropout=0.0, pooling="mean")
    enc, labels = contains_task(512, 0)
    train = {**enc, "labels": labels}
    test_enc, test_labels = contains_task(400, 1)
    args = gt.TrainingArguments(output_dir=str(tmp_path), num_train_epochs=8, per_device_train_batch_size=16,
                                gradient_accumulation_steps=2, learning_rate=3e-3, save_strategy="no",
                                logging_strategy="no", disable_tqdm=True, seed=0)
    trainer = gt.Trainer(model, args, train_dataset=train, eval_dataset={**test_enc, "label": test_labels},
                         compute_metrics=gt.metrics.classification_metrics("macro"))
    trainer.train()
    metrics = trainer.evaluate()
    assert metrics["eval_accuracy"] > 0.9 and metrics["eval_f1_macro"] > 0.9
    prediction = trainer.predict({**test_enc, "labels": test_labels})
    assert prediction.predictions.shape == (400, 2)
    extra = trainer.evaluate({**test_enc, "labels": test_labels, "extra": test_labels})  # dropped, as HF's
    assert extra["eval_accuracy"] == metrics["eval_accuracy"]  # remove_unused_columns=True
    with pytest.raises(ValueError, match="eval_dataset: a dict batch needs exactly one label column"):
        trainer.evaluate({**test_enc, "labels": test_labels, "label": test_labels})
    with pytest.raises(ValueError, match="attention_mask"):
        bad = dict(test_enc, attention_mask=1 - test_enc["attention_mask"])
        trainer.evaluate({**bad, "labels": test_labels})
