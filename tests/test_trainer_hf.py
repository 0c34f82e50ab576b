"""Scripts written the way Hugging Face's documentation writes them run with only their imports
changed: examples as dicts through a padding collator, HF's argument names (transformers 5 and 4),
dict batches from a DataLoader, HF's epoch unit and end-of-run evaluation, HF's console output.
Each test trains a tiny model for a few dozen steps (a few seconds at most)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gputrain as gt
from gputrain import Trainer, TrainingArguments
from gputrain.models import TransformerClassifier
from gputrain.training_args import FIELD_TABLE, NOT_APPLICABLE, REFUSED, fields_markdown
from gputrain.trainer import TRAINER_KEYWORDS, trainer_keywords_markdown


def examples(n, seed=0, key="label"):
    """Synthetic text classification: variable-length token ids, label = majority of odd ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(4, 13))
        ids = rng.integers(3, 40, size=length)
        out.append({"input_ids": ids.tolist(), "attention_mask": [1] * length,
                    key: int((ids % 2).sum() * 2 > length)})
    return out


def compute_metrics(eval_pred):
    predictions = eval_pred.predictions.argmax(-1)
    labels = eval_pred.label_ids
    tp = int(((predictions == 1) & (labels == 1)).sum())
    wrong = int((predictions != labels).sum())
    return {"accuracy": float((predictions == labels).mean()), "f1": 2 * tp / max(2 * tp + wrong, 1)}


def classifier():
    gt.random.manual_seed(0)
    return TransformerClassifier(vocab_size=40, num_classes=2, max_len=12, d_model=16, num_layers=1, num_heads=2,
                                 dropout=0.0)


class Padder:
    """A user's data_collator as HF's DataCollatorWithPadding: pads to the batch's longest."""

    def __init__(self):
        self.calls = 0

    def __call__(self, features):
        self.calls += 1
        longest = max(len(f["input_ids"]) for f in features)
        ids = np.zeros((len(features), longest), np.int64)
        mask = np.zeros_like(ids)
        for i, f in enumerate(features):
            ids[i, :len(f["input_ids"])] = f["input_ids"]
            mask[i, :len(f["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": np.array([f["label"] for f in features])}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_text_classification_script_as_hf_writes_it(tmp_path, precision, capsys):
    train_dataset, eval_dataset = examples(64, 0), examples(24, 1)
    collator = Padder()
    training_args = TrainingArguments(
        output_dir=str(tmp_path), learning_rate=3e-3, per_device_train_batch_size=8, per_device_eval_batch_size=8,
        num_train_epochs=2, weight_decay=0.01, eval_strategy="epoch", save_strategy="epoch",
        load_best_model_at_end=True, metric_for_best_model="f1", report_to="none", warmup_steps=0.1,
        logging_steps=10, group_by_length=True, push_to_hub=False, **{precision: True})
    trainer = Trainer(model=classifier(), args=training_args, train_dataset=train_dataset,
                      eval_dataset=eval_dataset, data_collator=collator, compute_metrics=compute_metrics)
    result = trainer.train()
    assert result.global_step == 16 and np.isfinite(result.training_loss) and collator.calls >= 8
    assert training_args.get_warmup_steps(16) == 2  # warmup_steps=0.1: ceil(0.1 * 16), transformers 5
    evals = [e for e in trainer.state.log_history if "eval_f1" in e]
    assert [e["epoch"] for e in evals] == [1.0, 2.0]
    assert trainer.state.best_model_checkpoint is not None
    metrics = trainer.evaluate()
    assert set(metrics) >= {"eval_loss", "eval_accuracy", "eval_f1"}
    assert trainer.predict(eval_dataset).predictions.shape == (24, 2)
    trainer.save_model()
    assert os.path.exists(os.path.join(tmp_path, "model.safetensors"))
    out = capsys.readouterr().out
    assert "{'loss': '" in out and "'epoch': '1.25'" in out  # step 10, 8 loader batches an epoch


def test_default_collator_pads_with_the_tokenizers_pad_id_and_renames_label(tmp_path):
    class Tokenizer:
        pad_token_id = 1

    seen = []

    def preprocess(logits, labels):
        seen.append(logits.shape)
        return logits.argmax(-1)

    trainer = Trainer(model=classifier(), args=TrainingArguments(output_dir=str(tmp_path), max_steps=3,
                                                                 disable_tqdm=True, save_strategy="no"),
                      train_dataset=examples(24), eval_dataset=examples(8, 2, key="label_ids"),
                      processing_class=Tokenizer(), preprocess_logits_for_metrics=preprocess,
                      compute_metrics=lambda p: {"mean_prediction": float(np.mean(p.predictions))})
    batch = trainer._train_source.collator(examples(3))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    lengths = batch["attention_mask"].sum(1)
    for row, length in zip(batch["input_ids"], lengths):
        assert (row[length:] == 1).all()
    trainer.train()
    assert "eval_mean_prediction" in trainer.evaluate() and seen == [(8, 2)]


def test_dict_and_tuple_batches_from_a_dataloader(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 40, size=(40, 10))
    columns = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": (ids % 2).sum(1) % 2,
               "idx": np.arange(40)}  # an unused column, dropped as remove_unused_columns=True does
    loader = gt.DataLoader(columns, batch_size=8, shuffle=True, seed=0)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, disable_tqdm=True, save_strategy="no",
                             gradient_accumulation_steps=2)
    trainer = Trainer(model=classifier(), args=args, train_dataset=loader)
    assert trainer.train().global_step == 4
    strict = dataclasses.replace(args, remove_unused_columns=False)
    with pytest.raises(ValueError, match=r"columns \['idx'\] are not read"):
        Trainer(model=classifier(), args=strict, train_dataset=gt.DataLoader(columns, batch_size=8)).train()

    class Pairs(gt.data.Dataset):  # a map-style Dataset of (x, y) tuples, as torch Dataset subclasses give
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return np.full(4, i % 2, np.float32), np.int64(i % 2)

    model = gt.nn.Sequential(gt.nn.Linear(4, 2))
    mlp = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "m"), max_steps=3,
                                                      disable_tqdm=True, save_strategy="no"),
                  train_dataset=Pairs())
    assert mlp.train().global_step == 3


class FakeTensor:
    """What a torch.Tensor offers to duck typing (detach, cpu, numpy), without torch."""

    def __init__(self, value):
        self.value = np.asarray(value)

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.value


def test_tensor_samples_are_converted_by_duck_typing():
    batch = gt.data.default_collate([(FakeTensor([1.0, 2.0]), FakeTensor(3)), (FakeTensor([4.0, 5.0]), FakeTensor(6))])
    assert isinstance(batch[0], np.ndarray) and batch[0].tolist() == [[1.0, 2.0], [4.0, 5.0]]
    assert batch[1].tolist() == [3, 6]
    padded = gt.data.DataCollatorWithPadding(0)([{"input_ids": FakeTensor([5, 6, 7]), "label": FakeTensor(1)},
                                                 {"input_ids": FakeTensor([8]), "label": FakeTensor(0)}])
    assert padded["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]] and padded["labels"].tolist() == [1, 0]


def test_exhausted_loader_restarts_and_second_train_refuses(tmp_path, caplog):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    loader = gt.DataLoader((x, y), batch_size=8)
    for _ in loader:  # iterated to its end before the Trainer sees it
        pass
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, disable_tqdm=True, save_strategy="no",
                             learning_rate=1e-2)
    trainer = Trainer(model=gt.nn.Sequential(gt.nn.Linear(4, 2)), args=args, train_dataset=loader)
    with caplog.at_level("WARNING", logger="gputrain.trainer"):
        result = trainer.train()
    assert result.global_step == 4 and result.training_loss > 0
    assert any("already iterated" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="already trained 4 of 4 steps"):
        trainer.train()


def test_epoch_in_loader_batches_and_evaluation_at_the_last_step(tmp_path):
    x = np.random.default_rng(0).normal(size=(104, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, per_device_train_batch_size=8,
                             gradient_accumulation_steps=2, logging_steps=3, eval_strategy="steps", eval_steps=3,
                             disable_tqdm=True, save_strategy="no")
    trainer = Trainer(model=gt.nn.Sequential(gt.nn.Linear(4, 2)), args=args, train_dataset=(x, y),
                      eval_dataset=(x, y))
    trainer.train()
    history = trainer.state.log_history
    assert [round(e["epoch"], 4) for e in history if "loss" in e] == [0.4615, 0.9231]  # 6 and 12 of 13 batches
    assert [e["step"] for e in history if "eval_loss" in e] == [3, 6, 7]  # HF evaluates at the last step too


def test_every_field_has_a_status_and_the_table_renders():
    names = [f.name for f in dataclasses.fields(TrainingArguments)]
    assert set(names) == set(FIELD_TABLE)
    table = fields_markdown()
    assert all(f"| `{name}` |" in table for name in names)
    assert len(table.splitlines()) == len(names) + 2
    signature = inspect.signature(Trainer.__init__)
    assert set(signature.parameters) - {"self"} == set(TRAINER_KEYWORDS)
    assert all(f"| `{name}` |" in trainer_keywords_markdown() for name in TRAINER_KEYWORDS)


def test_hf_names_accepted_reported_or_refused(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), evaluation_strategy="epoch", save_strategy="epoch",
                             torch_compile=True, report_to=["wandb"],
                             gradient_checkpointing_kwargs={"use_reentrant": False},
                             fp16_full_eval=True, group_by_length=True, warmup_steps=0.1, use_cpu=True)
    assert args.eval_strategy == "epoch" and args.device == "cpu" and args.train_sampling_strategy == "group_by_length"
    assert args.get_warmup_steps(95) == 10 and TrainingArguments(warmup_steps=3).get_warmup_steps(95) == 3
    notes = "\n".join(args.not_applicable())
    for name in ("torch_compile", "report_to", "gradient_checkpointing_kwargs", "fp16_full_eval"):
        assert name in notes, name
    assert "train_sampling_strategy" not in notes  # group_by_length is applied (tests/test_length_grouped.py)
    assert "batch_rebalance" in "\n".join(TrainingArguments(train_sampling_strategy="batch_rebalance").not_applicable())
    assert TrainingArguments(activation_checkpointing=True).gradient_checkpointing is True
    again = TrainingArguments.from_dict(json.loads(args.to_json_string()))
    assert again.to_dict() == args.to_dict()
    for name, (status, meaning) in FIELD_TABLE.items():
        if status == REFUSED:
            value = {"push_to_hub": True, "batch_eval_metrics": True, "save_only_model": True,
                     "enable_jit_checkpoint": True, "use_liger_kernel": True}.get(name, "x")
            with pytest.raises(ValueError, match=f"{name}=.* is not supported by gputrain: "):
                TrainingArguments(**{name: value})
    assert FIELD_TABLE["torch_compile"][0] == NOT_APPLICABLE
    with pytest.raises(ValueError, match="evaluation_strategy='steps'.*disagree"):
        TrainingArguments(evaluation_strategy="steps", eval_strategy="epoch")
    with pytest.raises(ValueError, match="warmup_steps must be an integer if bigger than 1"):
        TrainingArguments(warmup_steps=2.5)
    model = gt.nn.Sequential(gt.nn.Linear(4, 2))
    for keyword, value in (("optimizers", (object(), None)), ("compute_loss_func", len), ("model_init", len)):
        with pytest.raises(ValueError, match=f"Trainer\\({keyword}=...\\) is not supported"):
            Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path)), **{keyword: value})
    with pytest.raises(NotImplementedError, match="hyperparameter_search"):
        Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path))).hyperparameter_search()


SCRIPT = """
import numpy as np
from gputrain import Trainer, TrainingArguments
import gputrain as gt
x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int64)
args = TrainingArguments(output_dir=OUT, max_steps=20, logging_steps=10, per_device_train_batch_size=8,
                         save_strategy="no", log_level=LEVEL)
Trainer(model=gt.nn.Sequential(gt.nn.Linear(4, 2)), args=args, train_dataset=(x, y)).train()
"""


@pytest.mark.parametrize("level", ["passive", "warning"])
def test_console_output_without_configuring_logging(tmp_path, level):
    script = SCRIPT.replace("OUT", repr(str(tmp_path))).replace("LEVEL", repr(level))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=os.environ)
    assert run.returncode == 0, run.stderr
    assert ("***** Running training *****" in run.stderr) == (level == "passive")  # log_level honoured
    assert "Total optimization steps = 20" in run.stderr or level != "passive"
    assert "20/20" in run.stderr  # the tqdm bar
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert [line.startswith("{'loss': '") for line in lines] == [True, True, False]
    assert "'grad_norm': '" in lines[0] and "'learning_rate': '" in lines[0]


def test_eval_on_start_eval_delay_prediction_loss_only_and_nan_filter(tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=8,
                             eval_strategy="steps", eval_steps=2, eval_delay=5, eval_on_start=True,
                             prediction_loss_only=True, disable_tqdm=True, save_strategy="no", use_cpu=True)
    trainer = Trainer(model=gt.nn.Sequential(gt.nn.Linear(4, 2)), args=args, train_dataset=(x, y),
                      eval_dataset=(x, y), compute_metrics=lambda p: {"never": 1.0})
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert [e["step"] for e in evals] == [0, 6, 8]  # on start, then from step eval_delay=5 on
    assert not any("eval_never" in e for e in evals)


def test_a_torch_dataset_of_tensors_trains(tmp_path):
    """A torch.utils.data.Dataset subclass returning tensors (skipped without PyTorch): its
    samples are converted by duck typing; gputrain never imports torch itself."""
    torch = pytest.importorskip("torch")

    class Tensors(torch.utils.data.Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            return torch.full((4,), float(i % 2)), torch.tensor(i % 2)

    trainer = Trainer(model=gt.nn.Sequential(gt.nn.Linear(4, 2)),
                      args=TrainingArguments(output_dir=str(tmp_path), max_steps=3, disable_tqdm=True,
                                             save_strategy="no"), train_dataset=Tensors())
    assert trainer.train().global_step == 3


# transformers 5.25's TrainingArguments fields (src/transformers/training_args.py), every one of
# which a script may set: each must be a field here, with a status in FIELD_TABLE.
HF_525_FIELDS = """
    output_dir per_device_train_batch_size num_train_epochs max_steps learning_rate lr_scheduler_type
    lr_scheduler_kwargs warmup_steps optim optim_args weight_decay adam_beta1 adam_beta2 adam_epsilon
    optim_target_modules gradient_accumulation_steps average_tokens_across_devices max_grad_norm
    label_smoothing_factor bf16 fp16 bf16_full_eval fp16_full_eval tf32 activation_checkpointing
    activation_checkpointing_kwargs gradient_checkpointing gradient_checkpointing_kwargs torch_compile
    torch_compile_backend torch_compile_mode use_liger_kernel liger_kernel_config use_cache
    neftune_noise_alpha torch_empty_cache_steps auto_find_batch_size logging_strategy logging_steps
    logging_first_step log_on_each_node logging_nan_inf_filter include_num_input_tokens_seen log_level
    log_level_replica disable_tqdm report_to run_name project trackio_space_id trackio_bucket_id
    trackio_static_space_id eval_strategy eval_steps eval_delay per_device_eval_batch_size
    prediction_loss_only eval_on_start eval_do_concat_batches eval_use_gather_object eval_accumulation_steps
    include_for_metrics batch_eval_metrics save_only_model save_strategy save_steps save_on_each_node
    save_total_limit enable_jit_checkpoint push_to_hub hub_token hub_private_repo hub_model_id hub_strategy
    hub_always_push hub_revision load_best_model_at_end metric_for_best_model greater_is_better
    ignore_data_skip restore_callback_states_from_checkpoint full_determinism seed data_seed use_cpu
    accelerator_config parallelism_config dataloader_drop_last dataloader_num_workers dataloader_pin_memory
    dataloader_persistent_workers dataloader_prefetch_factor dataloader_multiprocessing_context
    dataloader_in_order remove_unused_columns label_names train_sampling_strategy length_column_name
    ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph ddp_backend
    ddp_timeout fsdp fsdp_config deepspeed debug skip_memory_metrics do_train do_eval do_predict
    resume_from_checkpoint local_rank
""".split()


def test_every_transformers_5_field_is_here():
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert [name for name in HF_525_FIELDS if name not in names] == []


def test_log_steps_and_epochs_are_transformers_own(tmp_path):
    """The (kind, step, epoch) of every log line and evaluation, against transformers 5's Trainer
    over the same data and arguments (tests/fixtures/make_hf_trainer_logs.py)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf_trainer_logs.json")
    with open(path) as f:
        reference = json.load(f)
    runs = {"steps": (104, dict(num_train_epochs=1, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                                logging_steps=3, eval_strategy="steps", eval_steps=3)),
            "epochs": (50, dict(num_train_epochs=3, per_device_train_batch_size=4, gradient_accumulation_steps=3,
                                logging_steps=2, eval_strategy="epoch")),
            "max_steps": (40, dict(max_steps=7, per_device_train_batch_size=6, logging_steps=4,
                                   eval_strategy="steps", eval_steps=5))}
    for name, (rows, fields) in runs.items():
        x = np.random.default_rng(0).normal(size=(rows, 4)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        args = TrainingArguments(output_dir=str(tmp_path / name), save_strategy="no", report_to="none", use_cpu=True,
                                 disable_tqdm=True, **fields)
        trainer = Trainer(model=gt.nn.Sequential(gt.nn.Linear(4, 2)), args=args, train_dataset=(x, y),
                          eval_dataset=(x, y))
        trainer.train()
        ours = [["eval" if "eval_loss" in e else "loss", e["step"], e["epoch"]]
                for e in trainer.state.log_history if "eval_loss" in e or "loss" in e]
        assert [[k, s] for k, s, _ in ours] == [[k, s] for k, s, _ in reference[name]], name
        np.testing.assert_allclose([e for *_, e in ours], [e for *_, e in reference[name]], rtol=1e-12,
                                   err_msg=name)
