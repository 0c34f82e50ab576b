"""8-bit AdamW (gputrain.optim.AdamW8bit, bitsandbytes' AdamW8bit): bit for bit against a NumPy
reference of the same quantization and update on the CPU and on sim; bitsandbytes' dynamic maps
and a run of bitsandbytes' own AdamW8bit (committed fixture, made by
tests/fixtures/make_adamw8bit_fixtures.py in the side venv) within tolerance; the loss curve
against fp32 AdamW; the Trainer's optim="adamw_8bit" resuming bit-identically; the memory plan
against the allocator's peak; bad input refused, nothing changed."""

from __future__ import annotations

import gc
import os
import re

import numpy as np
import pytest

import _adamw8bit_reference as ref
import gputrain as gt
from gputrain import _C, _C_testing
from gputrain import checkpoint as ckpt
from gputrain.nn import Parameter
from gputrain.optim import AdamW, AdamW8bit
from gputrain.quant.codes import DYNAMIC_SIGNED, DYNAMIC_UNSIGNED, sorted_bounds

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "adamw8bit", "bnb_adamw8bit.npz")
HEADER = os.path.join(HERE, "..", "csrc", "ops", "dynamic_map.h")
nn = gt.nn


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8 if a.dtype == np.uint8 else np.uint32)


def assert_bits(a, b, what=""):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert np.array_equal(bits(a), bits(b)), f"{what}: {int((bits(a) != bits(b)).sum())} elements differ"


# -- the maps ---------------------------------------------------------------------------------------
def test_the_maps_are_bitsandbytes_create_dynamic_map():
    fixture = np.load(FIXTURE)
    assert_bits(fixture["signed_map"], DYNAMIC_SIGNED, "signed")
    assert_bits(fixture["unsigned_map"], DYNAMIC_UNSIGNED, "unsigned")
    assert_bits(fixture["qmap1"], DYNAMIC_SIGNED, "AdamW8bit's qmap1")
    assert_bits(fixture["qmap2"], DYNAMIC_UNSIGNED, "AdamW8bit's qmap2")


def test_the_c_tables_are_the_maps_and_their_bounds():
    with open(HEADER) as f:
        text = f.read()
    tables = {name: np.array([int(w, 16) for w in re.findall(r"0x([0-9a-f]{8})u", body)], np.uint32)
              for name, body in re.findall(r"#define GT_DYNMAP_(\w+) \\\n(.*?)\n\n", text, re.S)}
    for key, code in (("SIGNED", DYNAMIC_SIGNED), ("UNSIGNED", DYNAMIC_UNSIGNED)):
        bounds, order = sorted_bounds(code)
        assert np.array_equal(order, np.arange(256))  # sorted: a code is its index
        assert np.array_equal(tables[f"{key}_CODE"], bits(code))
        assert np.array_equal(tables[f"{key}_BOUNDS"], bits(bounds))


# -- the trajectory against the NumPy reference -------------------------------------------------------
SIZES = [5000, 4096, 100, 300, 256]  # a short last block; whole blocks; 32-bit (< min_8bit_size); one block
GROUPS = [{"lr": 1e-2, "weight_decay": 0.1}, {"lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.0}]
GROUP_OF = [0, 0, 1, 1, 0]
STEPS = 5
MIN_SIZE = 256


def _hp(group):
    full = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2, **group}
    return full["lr"], full["betas"][0], full["betas"][1], full["eps"], full["weight_decay"]


def _data(seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    # gradients over six decades, so blocks hold codes from the whole of each map
    grads = [[(rng.standard_normal(n) * np.logspace(-4, 1, n)).astype(np.float32) for n in SIZES]
             for _ in range(STEPS)]
    return params, grads


def _skipped(step, index):
    return step == 2 and index == 1  # no gradient: its step count lags the others'


def _run_gputrain(params0, grads):
    params = [Parameter(p.copy()) for p in params0]
    groups = [{"params": [p for p, g in zip(params, GROUP_OF) if g == k], **GROUPS[k]} for k in range(2)]
    opt = AdamW8bit(groups, min_8bit_size=MIN_SIZE)
    order = [i for k in range(2) for i, g in enumerate(GROUP_OF) if g == k]  # the optimizer's parameter order
    coefs = []
    for step in range(STEPS):
        for i, p in enumerate(params):
            p.grad = None if _skipped(step, i) else grads[step][i].copy()
        # step 3: a clip coefficient, applied as the update reads the gradients
        coefs.append(gt.optim.clip_coefficient(1.0, opt.clip_grad_norm_(1.0)) if step == 3 else 1.0)
        opt.step()
    state = opt.state_dict()["state"]
    return [params[i].data for i in range(len(SIZES))], {order[k]: s for k, s in state.items()}, coefs


def test_the_cpu_trajectory_is_the_numpy_references_bit_for_bit():
    params0, grads = _data()
    result, state, coefs = _run_gputrain(params0, grads)
    assert coefs[3] < 1.0
    for i, n in enumerate(SIZES):
        p = params0[i].copy()
        lr, b1, b2, eps, wd = _hp(GROUPS[GROUP_OF[i]])
        if n < MIN_SIZE:  # 32-bit state: gputrain's AdamW (exact numerics), step by step
            q = Parameter(p)
            adamw = AdamW([q], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
            for step in range(STEPS):
                q.grad = grads[step][i].copy()
                adamw._pending_coef = coefs[step]
                adamw.step()
            assert_bits(result[i], q.data, f"param {i}")
            expected = adamw.state_dict()["state"][0]
            assert set(state[i]) == {"step", "exp_avg", "exp_avg_sq"}
            assert_bits(state[i]["exp_avg"], expected["exp_avg"], "exp_avg")
            assert_bits(state[i]["exp_avg_sq"], expected["exp_avg_sq"], "exp_avg_sq")
            continue
        st, t = ref.initial_state(n), 0
        for step in range(STEPS):
            if _skipped(step, i):
                continue
            t += 1
            ref.step8(p, grads[step][i], st, ref.scalars(lr, b1, b2, eps, wd, t, coefs[step]))
        assert_bits(result[i], p, f"param {i}")
        assert float(state[i]["step"]) == t
        for key in ("state1", "state2", "absmax1", "absmax2"):
            assert_bits(state[i][key].reshape(-1), st[key], f"param {i} {key}")
        assert len(np.unique(st["state1"])) > 100  # the trajectory exercises most of the map


DEVICE_SIZES = [7, 1000, 33, 70_001, 16]  # _C_testing.optimizer_on_device: min_8bit_size 0, all 8-bit


def _device_run(device, grad_coef=0.7):
    rng = np.random.default_rng(5)
    total = sum(DEVICE_SIZES)
    params = rng.standard_normal(total).astype(np.float32)
    grads = (rng.standard_normal((6, total)) * np.logspace(-3, 1, total)).astype(np.float32)
    hparams = {"lr": 1e-2, "betas": (0.85, 0.99), "weight_decay": 0.05}
    out = params.copy()
    _C_testing.optimizer_on_device("adamw8bit", device, out, DEVICE_SIZES, grads, hparams, grad_coef=grad_coef)
    return params, grads, hparams, out


def test_the_cpu_device_path_is_the_reference_per_parameter_blocks():
    params, grads, hp, out = _device_run("cpu")
    starts = np.cumsum([0] + DEVICE_SIZES)
    for a, b in zip(starts[:-1], starts[1:]):
        p, st = params[a:b].copy(), ref.initial_state(b - a)
        for t in range(1, grads.shape[0] + 1):
            s = ref.scalars(hp["lr"], *hp["betas"], 1e-8, hp["weight_decay"], t, 0.7)
            ref.step8(p, grads[t - 1, a:b], st, s)
        assert_bits(out[a:b], p, f"parameter at {a}")


@pytest.mark.sim
def test_sim_gives_the_cpu_bits():
    assert_bits(_device_run("sim:0")[3], _device_run("cpu")[3])


# -- bitsandbytes' own run --------------------------------------------------------------------------
def _bnb_run():
    f = np.load(FIXTURE)
    lr, b1, b2, eps, wd, min_size = (float(v) for v in f["hparams"])
    big, small = Parameter(f["big0"].copy()), Parameter(f["small0"].copy())
    opt = AdamW8bit([big, small], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, min_8bit_size=int(min_size))
    return f, big, small, opt


def test_one_step_from_bitsandbytes_state_is_its_update_with_the_nearest_codes():
    """From each state bitsandbytes' AdamW8bit (CPU backend) reached, one step of ours gives its
    parameters within float32 rounding of the update, its absmax, and codes at least as near to
    the new moments as its own: its CPU library's quantizer is a binary search that sometimes
    lands on a farther code (e.g. 3.0e-7 of a block's absmax to the code 1.6e-5), ours is the
    nearest (bitsandbytes' default backend's bucketize over the midpoints)."""
    f, big, small, opt = _bnb_run()
    lr, b1, b2, eps, wd, _ = (float(v) for v in f["hparams"])
    groups = opt.state_dict()["param_groups"]
    for k in range(f["grads_big"].shape[0]):
        if k:
            big.data, small.data = f["big"][k - 1], f["small"][k - 1]
            opt.load_state_dict({"state": {
                0: {"step": k, **{key: f[key][k - 1] for key in ("state1", "state2", "absmax1", "absmax2")}},
                1: {"step": k, "exp_avg": f["small_exp_avg"][k - 1], "exp_avg_sq": f["small_exp_avg_sq"][k - 1]}},
                "param_groups": groups})
        before = {key: f[key][k - 1] if k else ref.initial_state(big.numel())[key]
                  for key in ("state1", "state2", "absmax1", "absmax2")}
        big.grad, small.grad = f["grads_big"][k].copy(), f["grads_small"][k].copy()
        opt.step()
        state = opt.state_dict()["state"]
        np.testing.assert_allclose(big.data, f["big"][k], rtol=0, atol=3e-7)
        np.testing.assert_allclose(small.data, f["small"][k], rtol=0, atol=3e-7)
        # the moments before requantization, as the reference computes them from the same state
        p, st = (f["big"][k - 1] if k else f["big0"]).copy(), dict(before)
        ref.step8(p, f["grads_big"][k], st, ref.scalars(lr, b1, b2, eps, wd, k + 1))
        assert_bits(state[0]["state1"], st["state1"], "state1 = the reference's")
        m = ref.dequantize(before["state1"], before["absmax1"], DYNAMIC_SIGNED) * np.float32(b1) + \
            np.float32(1 - b1) * f["grads_big"][k]
        np.testing.assert_allclose(state[0]["absmax1"], f["absmax1"][k], rtol=1e-6)
        np.testing.assert_allclose(state[0]["absmax2"], f["absmax2"][k], rtol=1e-6)
        for key, code, absmax, x in (("state1", DYNAMIC_SIGNED, "absmax1", m),):
            scale = np.repeat(state[0][absmax], 256)[:x.size]
            ours = np.abs(code[state[0][key]] * scale - x)
            theirs = np.abs(code[f[key][k]] * scale - x)
            assert np.all(ours <= theirs * (1 + 1e-5) + 1e-12 * scale), key
        assert np.mean(state[0]["state2"] == f["state2"][k]) > 0.9
        np.testing.assert_allclose(state[1]["exp_avg"], f["small_exp_avg"][k], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(state[1]["exp_avg_sq"], f["small_exp_avg_sq"][k], rtol=1e-5, atol=1e-10)


def test_a_free_run_stays_near_bitsandbytes_run():
    f, big, small, opt = _bnb_run()
    lr = float(f["hparams"][0])
    for k in range(f["grads_big"].shape[0]):
        big.grad, small.grad = f["grads_big"][k].copy(), f["grads_small"][k].copy()
        opt.step()
        diff = np.abs(big.data - f["big"][k])
        assert diff.max() < 0.25 * lr and diff.mean() < 0.005 * lr, (k, diff.max(), diff.mean())
        np.testing.assert_allclose(small.data, f["small"][k], rtol=0, atol=3e-7)


# -- state bytes and the memory plan ----------------------------------------------------------------
def test_two_bytes_of_state_per_parameter_and_the_plan_is_what_it_allocates():
    n = 1 << 20
    plan8 = _C.optimizer_plan("adamw8bit", [n], [{}])["device_bytes"]
    plan32 = _C.optimizer_plan("adamw", [n], [{}])["device_bytes"]
    assert plan8 == 2 * n + 2 * 4 * (n // 256)  # codes of both moments + an f32 absmax per block each
    assert plan8 / n == 2.03125 and plan32 / n == 8
    numels = [5000, 4096, 100, 300, 4095]
    params = [Parameter(np.zeros(k, np.float32)) for k in numels]
    built = AdamW8bit(params).memory()
    planned = _C.optimizer_plan("adamw8bit", numels, [{}])
    assert planned["device_bytes"] == built["device_bytes"]
    # 8-bit: 5000 and 4096 (min_8bit_size 4096); 32-bit: 100, 300, 4095; the six pieces 64-byte aligned
    align = lambda b: -(-b // 64) * 64  # noqa: E731
    blocks = -(-5000 // 256) + 4096 // 256
    assert planned["device_bytes"] == 2 * align(9096) + 2 * align(4 * blocks) + 2 * align(4 * 4495)


def _model(width=128):
    gt.random.manual_seed(1)
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, width), nn.GELU(), nn.LayerNorm(width),
                         nn.Linear(width, 4))  # 32*128 = 4096 weights: 8-bit; the rest 32-bit


def _classes(rows=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 12)).astype(np.float32)
    return x, ((x[:, 0] + x[:, 1] > 0).astype(np.int64) + 2 * (x[:, 2] > 0.3))


def _args(tmp_path, **kwargs):
    options = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, learning_rate=1e-2, save_strategy="no",
                   logging_steps=50, disable_tqdm=True, seed=3, device="cpu", optim="adamw_8bit", max_steps=2)
    options.update(kwargs)
    return gt.TrainingArguments(**options)


@pytest.mark.sim
def test_a_sim_run_peaks_at_the_plan_with_the_8bit_state(tmp_path):
    x, y = _classes()
    m = _model().to("sim")
    gc.collect()
    gt.reset_peak_memory_stats("sim:0")
    trainer = gt.Trainer(m, _args(tmp_path, device="sim"), train_dataset=(x, y))
    plan = trainer.memory_plan()
    trainer.train()
    assert gt.memory_stats("sim:0")["peak_reserved_bytes"] == plan.total("sim:0"), str(plan)
    assert isinstance(trainer.optimizer, AdamW8bit)
    numels = [p.numel() for p in m.parameters()]
    assert plan["sim:0"]["optimizer_state"] == _C.optimizer_plan("adamw8bit", numels, [{}])["device_bytes"]
    assert plan["sim:0"]["optimizer_state"] == trainer.optimizer.memory()["device_bytes"]


@pytest.mark.sim
def test_a_model_on_sim_trains_the_cpu_bits(tmp_path):
    x, y = _classes(32)
    runs = []
    for device in ("cpu", "sim"):
        m = _model().to(device)
        opt = AdamW8bit(m.parameters(), lr=1e-2)
        step = gt.TrainStep(m, nn.CrossEntropyLoss(), opt, max_grad_norm=1.0)
        losses = [step(x, y).loss for _ in range(4)]
        runs.append((losses, m.state_dict(), opt.state_dict()["state"]))
    (loss_a, model_a, state_a), (loss_b, model_b, state_b) = runs
    assert loss_a == loss_b
    for name in model_a:
        assert_bits(model_a[name], model_b[name], name)
    assert state_a.keys() == state_b.keys()
    assert any("state1" in s for s in state_a.values()) and any("exp_avg" in s for s in state_a.values())
    for index in state_a:
        for key in state_a[index]:
            assert_bits(state_a[index][key], state_b[index][key], f"{index}.{key}")


# -- training ---------------------------------------------------------------------------------------
@pytest.mark.native_only  # a 60-step loss curve, twice: the 8-bit kernels run under qemu in the tests above
def test_the_loss_curve_follows_fp32_adamw():
    x, y = _classes(256, seed=4)
    curves = {}
    for name, make in (("adamw", AdamW), ("adamw8bit", AdamW8bit)):
        m = _model(256)  # 32*256 and the head: most parameters 8-bit
        step = gt.TrainStep(m, nn.CrossEntropyLoss(), make(m.parameters(), lr=3e-3, weight_decay=0.01))
        curves[name] = np.array([step(x, y).loss for _ in range(60)])
    a, b = curves["adamw"], curves["adamw8bit"]
    assert a[-1] < 0.5 * a[0] and b[-1] < 0.5 * b[0]
    assert np.max(np.abs(a - b)) < 0.005 * a[0], np.max(np.abs(a - b))  # measured: 2.5e-4 of a[0]
    assert not np.array_equal(a, b)  # the moments really are quantized


class _StopAt(gt.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def whole_and_resumed(tmp_path, model, **args):
    """Two Trainer runs over 160 rows saving every step: one whole, one stopped after step 3 and
    resumed from its checkpoint; `args` are the TrainingArguments besides _args'."""
    x, y = _classes(160)

    def run(out, **kw):
        trainer = gt.Trainer(model(), _args(out, save_strategy="steps", save_steps=1, **args),
                             train_dataset=(x, y), callbacks=kw.pop("callbacks", []))
        trainer.train(**kw)
        return trainer

    whole = run(tmp_path / "whole")
    run(tmp_path / "resumed", callbacks=[_StopAt(3)])
    return whole, run(tmp_path / "resumed", resume_from_checkpoint=True)


def test_the_trainer_with_adamw_8bit_resumes_bit_identically(tmp_path):
    whole, resumed = whole_and_resumed(tmp_path, _model, max_steps=8, gradient_accumulation_steps=2)
    assert resumed.state.global_step == whole.state.global_step == 8
    for name, value in whole.model.state_dict().items():
        assert_bits(value, resumed.model.state_dict()[name], name)
    a, b = whole.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert a.keys() == b.keys()
    for index in a:
        for key in a[index]:
            assert_bits(np.asarray(a[index][key]), np.asarray(b[index][key]), f"{index}.{key}")
    saved = ckpt.read_optimizer(ckpt.read_checkpoint_files(str(tmp_path / "resumed" / "checkpoint-3")))
    assert any(np.asarray(s.get("state1", np.zeros(0, np.float32))).dtype == np.uint8 for s in saved["state"].values())


# -- bad input --------------------------------------------------------------------------------------
def test_bad_arguments_are_refused_naming_them(tmp_path):
    p = Parameter(np.zeros(5000, np.float32))
    for kwargs, match in (({"amsgrad": True}, "amsgrad"), ({"optim_bits": 8}, "optim_bits"),
                          ({"min_8bit_size": -1}, "min_8bit_size"),
                          ({"lr": -1.0}, "learning rate"), ({"args": object()}, "args")):
        with pytest.raises(ValueError, match=match):
            AdamW8bit([p], **kwargs)
    with pytest.raises(ValueError, match="zero_size"):
        _C.Optimizer("adamw8bit", [p.data], [0], [{}], zero_size=2, zero_rank=0)
    with pytest.raises(ValueError, match="kind"):
        _C.optimizer_plan("adamw9bit", [1], [{}])
    with pytest.raises(ValueError, match=r"optim must be one of \[.*'adamw_8bit'"):
        _args(tmp_path, optim="lion_8bit")
    with pytest.raises(ValueError, match="zero_stage"):
        _args(tmp_path, zero_stage=1)
    assert _args(tmp_path, optim="adamw_torch_fused").optim == "adamw_torch_fused"


def test_a_bad_state_dict_is_refused_and_changes_nothing():
    big, small = Parameter(np.ones(5000, np.float32)), Parameter(np.ones(10, np.float32))
    opt = AdamW8bit([big, small])
    big.grad, small.grad = np.full(5000, 0.5, np.float32), np.full(10, 0.5, np.float32)
    opt.step()
    good = opt.state_dict()
    before = {i: {k: np.array(v) for k, v in s.items()} for i, s in good["state"].items()}

    def edited(index, key, value):
        state = {i: dict(s) for i, s in good["state"].items()}
        if value is None:
            del state[index][key]
        else:
            state[index][key] = value
        return {"state": state, "param_groups": good["param_groups"]}

    cases = [(edited(0, "state1", good["state"][0]["state1"].astype(np.float32)), TypeError, "uint8"),
             (edited(0, "state1", np.full(5000, 256)), ValueError, r"\[0, 255\]"),
             (edited(0, "absmax1", np.ones(5, np.float32)), ValueError, "shape"),
             (edited(0, "absmax2", -good["state"][0]["absmax2"] - 1), ValueError, "negative"),
             (edited(0, "state2", None), KeyError, "state2"),
             (edited(1, "state1", np.zeros(10, np.uint8)), KeyError, "state1"),
             (edited(1, "exp_avg_sq", -np.ones(10, np.float32)), ValueError, "negative")]
    for state_dict, error, match in cases:
        with pytest.raises(error, match=match):
            opt.load_state_dict(state_dict)
        after = opt.state_dict()["state"]
        for i in before:
            for k in before[i]:
                assert_bits(np.asarray(after[i][k]), before[i][k], f"{i}.{k}")
    opt.load_state_dict(good)  # and the good one loads


@pytest.mark.sim
def test_a_deferred_scaled_step_is_refused_before_it_changes_anything():
    x, y = _classes(32)
    m = _model().to("sim")
    opt = AdamW8bit(m.parameters())
    before = m.state_dict()
    batches = iter(gt.DataLoader((x, y), batch_size=32, device="sim"))
    step = gt.TrainStep(m, nn.CrossEntropyLoss(), opt, precision="fp16", scaler=gt.amp.GradScaler(), sync=False)
    with pytest.raises(ValueError, match="8-bit AdamW runs its update synchronously"):
        step(*next(batches))
    assert opt.step_count == 0
    for name, value in m.state_dict().items():
        assert_bits(value, before[name], name)
    synchronous = gt.TrainStep(m, nn.CrossEntropyLoss(), opt, precision="fp16", scaler=gt.amp.GradScaler())
    assert not synchronous(x, y).skipped and opt.step_count == 1


def test_pickle_and_add_param_group_keep_the_8bit_state_exactly():
    import pickle

    p, q = Parameter(np.ones(5000, np.float32)), Parameter(np.ones(10, np.float32))
    opt = AdamW8bit([p, q], min_8bit_size=300)
    p.grad, q.grad = np.linspace(-1, 1, 5000).astype(np.float32), np.ones(10, np.float32)
    opt.step()
    before = opt.state_dict()["state"]
    copy = pickle.loads(pickle.dumps(opt))
    assert copy.min_8bit_size == 300
    opt.add_param_group({"params": [Parameter(np.ones(600, np.float32))], "lr": 1e-2})
    for other in (copy.state_dict()["state"], opt.state_dict()["state"]):
        assert other.keys() == before.keys()
        for i in before:
            for key in before[i]:
                assert_bits(np.asarray(other[i][key]), np.asarray(before[i][key]), f"{i}.{key}")
