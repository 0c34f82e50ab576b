"""Damaged checkpoints (issue 27): a resume reads and checks every file before it changes anything,
so each damage class raises gputrain.CheckpointError naming the file and the field and leaves the
Trainer exactly as it was -- every state_dict (model, optimizer, scheduler, scaler, EMA, loader,
callbacks) and the trainer's own state compared bit for bit before and after. A manifest with a
SHA-256 per file finds flipped bytes and edited headers; a checkpoint from before the manifest
loads with a warning."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import warnings

import numpy as np
import pytest

pytest.importorskip("safetensors")

import gputrain as gt  # noqa: E402
from gputrain import checkpoint as ckpt  # noqa: E402

MAX_STEPS = 10


class Counter(gt.TrainerCallback):
    """A callback with a checkpointed state whose load_state_dict refuses a bad one."""

    def __init__(self):
        self.count = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]  # applied before the check: the Trainer must undo it
        if not isinstance(state["count"], int):
            raise TypeError(f"count must be an int, not {type(state['count']).__name__}")


class StopAt(gt.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def make_trainer(output_dir, stop_at=None, device="cpu"):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    gt.random.manual_seed(3)
    model = gt.nn.Sequential(gt.nn.Linear(6, 8), gt.nn.GELU(), gt.nn.Dropout(0.1), gt.nn.Linear(8, 2))
    args = gt.TrainingArguments(output_dir=str(output_dir), max_steps=MAX_STEPS, per_device_train_batch_size=8,
                                gradient_accumulation_steps=2, learning_rate=1e-2, warmup_steps=2,
                                lr_scheduler_type="cosine", save_strategy="steps", save_steps=5, logging_steps=2,
                                ema_decay=0.9, fp16=True, disable_tqdm=True, seed=7, device=device)
    callbacks = [Counter()] + ([StopAt(stop_at)] if stop_at else [])
    return gt.Trainer(model, args, train_dataset=(x, y), callbacks=callbacks)


def canonical(value):
    """A bit-exact, comparable form of a state (arrays as dtype, shape and bytes)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), canonical(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(canonical(v) for v in value))
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, repr(value))


def fingerprint(trainer, timings=True):
    """Every state a resume restores (without the logged timings of train() when asked)."""
    state = dataclasses.asdict(trainer.state)
    if not timings:
        state["log_history"] = [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
                                for entry in state["log_history"]]
    return canonical({
        "model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.lr_scheduler.state_dict(), "scaler": trainer.scaler.state_dict(),
        "ema": trainer.ema.state_dict(), "loader": trainer.train_dataloader.state_dict(),
        "trainer_state": state, "logging": trainer._logged, "done": trainer._done,
        "dropout_step": trainer.model.compiled.step, "micro_cap": trainer._micro_cap,
        "callbacks": [c.state_dict() for c in trainer.callback_handler.callbacks if hasattr(c, "state_dict")]})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """checkpoint-5 of a 10-step run (fp16 scaler, EMA, a stateful callback)."""
    root = tmp_path_factory.mktemp("saved")
    make_trainer(root, stop_at=5).train()
    return str(root / "checkpoint-5")


@pytest.fixture
def target(tmp_path):
    """A trainer 2 steps into its own run, whose state differs from the checkpoint's in everything."""
    trainer = make_trainer(tmp_path / "target", stop_at=2)
    trainer.train()
    return trainer


def copy_of(saved, tmp_path):
    directory = str(tmp_path / "checkpoint-5")
    shutil.copytree(saved, directory)
    return directory


def rewrite_manifest(directory):
    """The manifest of the files as they are now (a checkpoint whose fields are wrong but whose
    hashes are right: what a bug in a writer, or a hand edit, gives)."""
    files = {}
    for name in sorted(os.listdir(directory)):
        if name != ckpt.MANIFEST_NAME:
            data = read_bytes(os.path.join(directory, name))
            files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    ckpt.save_json(os.path.join(directory, ckpt.MANIFEST_NAME), {"format_version": ckpt.FORMAT_VERSION,
                                                                 "files": files})


def make_legacy(directory):
    """The checkpoint as gputrain wrote it before manifests: no manifest.json, no checkpoint_format."""
    os.remove(os.path.join(directory, ckpt.MANIFEST_NAME))
    edit_json(directory, "gputrain_state.json", lambda s: s.pop("checkpoint_format"))


def edit_json(directory, name, change):
    """Rewrites a JSON file of the checkpoint with change(value) applied to its value in place."""
    path = os.path.join(directory, name)
    with open(path) as f:
        value = json.load(f)
    change(value)
    replace_json(directory, name, value)


def replace_json(directory, name, value):
    with open(os.path.join(directory, name), "w") as f:
        json.dump(value, f)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def set_key(path, value):
    """change(obj): obj[path[0]]...[path[-1]] = value."""
    def change(obj):
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return change


def delete_key(key):
    def change(obj):
        del obj[key]
    return change


def edit_header(directory, name, change):
    """Rewrites a safetensors file's JSON header with `change(header)`, keeping its length (padded
    with spaces, as the format allows), so the tensor bytes stay where they were."""
    path = os.path.join(directory, name)
    data = read_bytes(path)
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    change(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    write_bytes(path, data[:8] + text.ljust(length) + data[8 + length:])


def first_tensor(header):
    return header[min(k for k in header if k != "__metadata__")]


def retype_f32_as_i32(header):
    first_tensor(header)["dtype"] = "I32"  # the same size: the bytes would be read as integers


def rewrite_arrays(directory, name, change):
    arrays = ckpt.load_arrays(os.path.join(directory, name))
    change(arrays)
    ckpt.save_arrays(os.path.join(directory, name), arrays)


# (name, file named in the error, damage(directory))
DAMAGE = [
    ("optimizer lr = -1", "optimizer.json", lambda d: edit_json(d, "optimizer.json",
                                                                set_key(["param_groups", 0, "lr"], -1))),
    ("optimizer steps a list", "optimizer.json", lambda d: edit_json(d, "optimizer.json", set_key(["steps"], []))),
    ("optimizer step beyond global_step", "optimizer.json",
     lambda d: edit_json(d, "optimizer.json", set_key(["steps", "0"], 99.0))),
    ("optimizer amsgrad turned on", "optimizer.json",
     lambda d: edit_json(d, "optimizer.json", set_key(["param_groups", 0, "amsgrad"], True))),
    ("optimizer state of a wrong shape", "optimizer", lambda d: rewrite_arrays(
        d, "optimizer.safetensors", lambda a: a.update({"0.exp_avg": np.zeros((3, 3), np.float32)}))),
    ("scheduler garbage", "scheduler.json", lambda d: replace_json(
        d, "scheduler.json", {"last_epoch": "x", "base_lrs": None, "_last_lr": {}, "_step_count": -7,
                              "lr_lambdas": 3})),
    ("scheduler position not the run's", "scheduler.json",
     lambda d: edit_json(d, "scheduler.json", set_key(["last_epoch"], 9))),
    ("scheduler lr not the optimizer's", "scheduler.json",
     lambda d: edit_json(d, "scheduler.json", set_key(["_last_lr", 0], 0.5))),
    ("gputrain_state without loader", "gputrain_state.json", lambda d: edit_json(d, "gputrain_state.json",
                                                                                 delete_key("loader"))),
    ("gputrain_state without model_step", "gputrain_state.json",
     lambda d: edit_json(d, "gputrain_state.json", delete_key("model_step"))),
    ("logging a list", "gputrain_state.json", lambda d: edit_json(d, "gputrain_state.json",
                                                                  set_key(["logging"], []))),
    ("done beyond global_step", "gputrain_state.json",
     lambda d: edit_json(d, "gputrain_state.json", set_key(["done", "save"], 99))),
    ("loader position garbage", "gputrain_state.json",
     lambda d: edit_json(d, "gputrain_state.json", set_key(["loader", "next_batch"], "x"))),
    ("callback state refused", "gputrain_state.json",
     lambda d: edit_json(d, "gputrain_state.json", set_key(["callbacks", "Counter", "count"], "x"))),
    ("global_step = 'five'", "trainer_state.json",
     lambda d: edit_json(d, "trainer_state.json", set_key(["global_step"], "five"))),
    ("global_step = 1000000", "trainer_state.json",
     lambda d: edit_json(d, "trainer_state.json", set_key(["global_step"], 1000000))),
    ("global_step = -3", "trainer_state.json", lambda d: edit_json(d, "trainer_state.json",
                                                                   set_key(["global_step"], -3))),
    ("global_step not the directory's", "trainer_state.json",
     lambda d: edit_json(d, "trainer_state.json", set_key(["global_step"], 4))),
    ("trainer_state a list", "trainer_state.json", lambda d: replace_json(d, "trainer_state.json", [1, 2])),
    ("ema decay = 2", "ema.json", lambda d: edit_json(d, "ema.json", set_key(["decay"], 2.0))),
    ("scaler scale = 0", "scaler.json", lambda d: edit_json(d, "scaler.json", set_key(["scale"], 0.0))),
    ("scaler.json missing", "scaler.json", lambda d: os.remove(os.path.join(d, "scaler.json"))),
    ("model tensor F32 -> I32", "model.safetensors",
     lambda d: edit_header(d, "model.safetensors", retype_f32_as_i32)),
    ("model tensor missing", "model.safetensors",
     lambda d: rewrite_arrays(d, "model.safetensors", lambda a: a.pop("0.bias"))),
    ("model tensor NaN", "model.safetensors",
     lambda d: rewrite_arrays(d, "model.safetensors", lambda a: a["0.weight"].__setitem__((0, 0), np.nan))),
    ("model.safetensors not safetensors", "model.safetensors",
     lambda d: write_bytes(os.path.join(d, "model.safetensors"), b"\x10\0\0\0\0\0\0\0{not json}      ")),
]


@pytest.mark.parametrize("mode", ["manifest rewritten", "legacy"])
@pytest.mark.parametrize("name, file, damage", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_checkpoint_raises_and_changes_nothing(saved, tmp_path, target, name, file, damage, mode):
    directory = copy_of(saved, tmp_path)
    if mode == "legacy":
        make_legacy(directory)
    damage(directory)
    if mode == "manifest rewritten":
        rewrite_manifest(directory)
    before = fingerprint(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ckpt.LegacyCheckpointWarning)
        with pytest.raises(gt.CheckpointError) as caught:
            target.train(resume_from_checkpoint=directory)
    assert file in str(caught.value) and directory in str(caught.value)
    assert fingerprint(target) == before


def flip_bytes_in_first_tensor(directory, count=20):
    path = os.path.join(directory, "model.safetensors")
    data = bytearray(read_bytes(path))
    (length,) = struct.unpack("<Q", data[:8])
    start, end = first_tensor(json.loads(data[8:8 + length]))["data_offsets"]
    for offset in np.random.default_rng(0).choice(end - start, count, replace=False):
        data[8 + length + start + int(offset)] ^= 0x5A
    write_bytes(path, bytes(data))


@pytest.mark.parametrize("damage, message", [
    (flip_bytes_in_first_tensor, "model.safetensors: its SHA-256 is not the manifest's"),
    (lambda d: edit_header(d, "model.safetensors", retype_f32_as_i32), "model.safetensors: its SHA-256"),
    (lambda d: edit_json(d, "gputrain_state.json", set_key(["model_step"], 0)),
     r"gputrain_state.json: (its SHA-256|\d+ bytes)"),
    (lambda d: os.truncate(os.path.join(d, "optimizer.safetensors"), 100),
     "optimizer.safetensors: 100 bytes"),
    (lambda d: os.remove(os.path.join(d, "ema.json")), "ema.json: listed in the manifest but missing"),
    (lambda d: edit_json(d, ckpt.MANIFEST_NAME, set_key(["format_version"], 2)), "format_version: 2 is not"),
    (lambda d: edit_json(d, ckpt.MANIFEST_NAME, set_key(["files"], [])), "manifest.json: files: must be"),
    (lambda d: edit_json(d, ckpt.MANIFEST_NAME, lambda m: m["files"].pop("model.safetensors")),
     "model.safetensors: missing from the checkpoint's manifest"),
    (lambda d: os.remove(os.path.join(d, ckpt.MANIFEST_NAME)), "manifest.json: missing, but gputrain_state.json"),
], ids=["20 flipped tensor bytes", "F32 -> I32 header", "edited JSON", "truncated", "file missing",
        "unknown format version", "manifest files a list", "file not in manifest", "manifest missing"])
def test_manifest_finds_damage(saved, tmp_path, target, damage, message):
    directory = copy_of(saved, tmp_path)
    damage(directory)
    before = fingerprint(target)
    with pytest.raises(gt.CheckpointError, match=message):
        target.train(resume_from_checkpoint=directory)
    assert fingerprint(target) == before


def test_manifest_lists_every_file_with_its_hash(saved):
    manifest = json.loads(read_bytes(os.path.join(saved, ckpt.MANIFEST_NAME)))
    assert manifest["format_version"] == ckpt.FORMAT_VERSION
    assert sorted(manifest["files"]) == sorted(set(os.listdir(saved)) - {ckpt.MANIFEST_NAME})
    for name, entry in manifest["files"].items():
        data = read_bytes(os.path.join(saved, name))
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    state = json.loads(read_bytes(os.path.join(saved, "gputrain_state.json")))
    assert state["checkpoint_format"] == ckpt.FORMAT_VERSION


def test_a_file_written_around_the_save_functions_is_refused(tmp_path):
    """Every file of a checkpoint has its hash in the manifest: one written by other means would
    not, so the checkpoint is not made."""
    def write(directory):
        ckpt.save_json(os.path.join(directory, "a.json"), {"a": 1})
        write_bytes(os.path.join(directory, "b.json"), b"{}")

    with pytest.raises(RuntimeError, match=r"\['b.json'\] were not written through"):
        ckpt.write_checkpoint(str(tmp_path), 3, write)
    assert os.listdir(tmp_path) == []
    assert ckpt._RECORDING == {}


def test_legacy_checkpoint_resumes_exactly_with_a_warning(saved, tmp_path):
    legacy = copy_of(saved, tmp_path / "legacy")
    make_legacy(legacy)
    resumed = make_trainer(tmp_path / "a")
    with pytest.warns(ckpt.LegacyCheckpointWarning, match="before checkpoints had a manifest"):
        resumed.train(resume_from_checkpoint=legacy)
    straight = make_trainer(tmp_path / "b")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckpt.LegacyCheckpointWarning)  # a checkpoint with a manifest: no warning
        straight.train(resume_from_checkpoint=saved)
    assert resumed.state.global_step == straight.state.global_step == MAX_STEPS
    for name, value in straight.model.state_dict().items():
        assert np.array_equal(resumed.model.state_dict()[name], value), name


@pytest.mark.parametrize("damage, file, field", [
    (lambda d: edit_json(d, "trainer_state.json", set_key(["global_step"], "five")), "trainer_state.json",
     "global_step"),
    (lambda d: edit_json(d, "gputrain_state.json", set_key(["loader", "next_batch"], "x")), "gputrain_state.json",
     "loader.next_batch"),
    (lambda d: edit_json(d, "scaler.json", set_key(["scale"], 0.0)), "scaler.json", "scale"),
    (lambda d: edit_json(d, "optimizer.json", set_key(["param_groups", 0, "amsgrad"], True)),
     "optimizer.json / optimizer.safetensors", "param_groups[0].amsgrad"),
    (lambda d: edit_header(d, "model.safetensors", retype_f32_as_i32), "model.safetensors", "0.bias"),
], ids=["trainer_state", "loader", "scaler", "optimizer", "model"])
def test_checkpoint_error_is_a_value_error_naming_file_and_field(saved, tmp_path, target, damage, file, field):
    directory = copy_of(saved, tmp_path)
    damage(directory)
    rewrite_manifest(directory)
    with pytest.raises(ValueError) as caught:
        target.train(resume_from_checkpoint=directory)
    error = caught.value
    assert isinstance(error, gt.CheckpointError)
    assert (error.directory, error.file, error.field) == (directory, file, field)
    assert str(error).startswith(f"{os.path.join(directory, file)}: {field}: ")


def json_leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_leaves(item, (*path, key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from json_leaves(item, (*path, index))
    else:
        yield path


GARBAGE = ["x", [], {}, None, -1, -1.5, 1e300, float("nan"), True, 0, 10**20, [1, 2], {"a": 1}]
JSON_FILES = ["optimizer.json", "scheduler.json", "scaler.json", "ema.json", "gputrain_state.json",
              "trainer_state.json"]


def random_damage(directory, rng):
    """One random field of one JSON file replaced by garbage (manifest rewritten), or one byte of
    a safetensors header flipped in a checkpoint without a manifest."""
    if rng.random() < 0.25:
        make_legacy(directory)
        path = os.path.join(directory, str(rng.choice(["model.safetensors", "optimizer.safetensors"])))
        data = bytearray(read_bytes(path))
        data[8 + int(rng.integers(0, struct.unpack("<Q", data[:8])[0]))] ^= 1 << int(rng.integers(0, 8))
        write_bytes(path, bytes(data))
        return
    name = str(rng.choice(JSON_FILES))
    with open(os.path.join(directory, name)) as f:
        value = json.load(f)
    leaves = [*json_leaves(value), ()]
    path, garbage = leaves[int(rng.integers(len(leaves)))], GARBAGE[int(rng.integers(len(GARBAGE)))]
    if path:
        set_key(list(path), garbage)(value)
    replace_json(directory, name, value if path else garbage)
    rewrite_manifest(directory)


def test_random_damage_is_refused_whole_or_loads(saved, tmp_path):
    """The harness's sweep, bounded: a damaged field either is a valid value (the resume goes on)
    or raises CheckpointError with every state as it was -- never another exception."""
    rng = np.random.default_rng(27)
    target = make_trainer(tmp_path / "target", stop_at=2)
    target.train()
    refused = 0
    for trial in range(24):
        directory = copy_of(saved, tmp_path / str(trial))
        random_damage(directory, rng)
        before = fingerprint(target)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ckpt.LegacyCheckpointWarning)
            try:
                target._load_checkpoint(directory)  # the resume alone: no training after it
            except gt.CheckpointError:
                assert fingerprint(target) == before, trial
                refused += 1
                continue
        target = make_trainer(tmp_path / f"target{trial}", stop_at=2)  # it resumed: a fresh target
        target.train()
    assert refused >= 12  # most garbage is refused (the rest: free-form log entries, valid numbers)


@pytest.mark.parametrize("name", ["optimizer lr = -1", "scheduler garbage", "callback state refused",
                                  "global_step = 'five'", "model tensor NaN", "model tensor F32 -> I32"])
def test_damage_on_the_simulated_device_changes_nothing(tmp_path, name):
    """A model and optimizer on a device (sim: the device code path on the CPU) keep their state
    through a refused resume as well; the undamaged checkpoint resumes bit-identically."""
    make_trainer(tmp_path / "saved", stop_at=5, device="sim").train()
    directory = copy_of(str(tmp_path / "saved" / "checkpoint-5"), tmp_path)
    dict((d[0], d[2]) for d in DAMAGE)[name](directory)
    rewrite_manifest(directory)
    target = make_trainer(tmp_path / "target", stop_at=2, device="sim")
    target.train()
    before = fingerprint(target)
    with pytest.raises(gt.CheckpointError):
        target.train(resume_from_checkpoint=directory)
    assert fingerprint(target) == before
    target.train(resume_from_checkpoint=str(tmp_path / "saved" / "checkpoint-5"))
    straight = make_trainer(tmp_path / "straight", device="sim")
    straight.train()
    assert fingerprint(target, timings=False) == fingerprint(straight, timings=False)
