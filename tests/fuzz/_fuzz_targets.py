"""What the fuzz suite calls: every public function, constructor and method of gputrain, each
with the strategies of its arguments, the exceptions it may raise on bad input (an explicit
allow-list per API), and for methods the state that a rejected call must leave unchanged.

A target's `call(fixture, **args)` runs in the worker process; `setup()` builds a fresh valid
fixture for it (a model, an optimizer after one step, ...) and `state(fixture)` is compared before
and after a call that raised. `mutates` names the arguments a call may write into; every other
array argument must come back unchanged, whatever the call did.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from itertools import islice
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

import gputrain as gt
import gputrain.functional as F
from gputrain import data, nn, optim
from _fuzz_values import Arg, anyof, arr, bad_of, choice, either, lit, num, spec_arr, valid_of, wrong_things

# Allow-lists. gt.OutOfMemoryError is a MemoryError; a copy NumPy cannot allocate is one too.
ARGS = (TypeError, ValueError)
ARRAYS = ARGS + (MemoryError,)
DEVICE = ARGS + (RuntimeError,)  # a device that is not there (gt.CudaError is one)
STATE = ARGS + (KeyError,)
INDEX = ARRAYS + (IndexError,)  # an id or label out of range, as in PyTorch


@dataclass
class Target:
    name: str
    call: Callable[..., Any]
    args: dict[str, Arg | st.SearchStrategy]  # argument name -> strategies of its spec
    allowed: tuple[type[BaseException], ...]
    setup: Callable[[], Any] | None = None
    state: Callable[[Any], Any] | None = None
    mutates: tuple[str, ...] = ()

    def strategy(self) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
        """(name, {argument: spec}) with at most two arguments bad, or all of them."""
        names = sorted(self.args)

        def pick(bad: frozenset[str]) -> st.SearchStrategy[dict[str, Any]]:
            return st.fixed_dictionaries({n: bad_of(a) if n in bad else valid_of(a) for n, a in self.args.items()})
        if not names:
            return st.tuples(st.just(self.name), st.just({}))
        bad = st.one_of(st.frozensets(st.sampled_from(names), max_size=2), st.just(frozenset(names)))
        return st.tuples(st.just(self.name), bad.flatmap(pick))


TARGETS: dict[str, Target] = {}


def target(name: str, allowed: tuple[type[BaseException], ...], /, *, setup: Callable[[], Any] | None = None,
           state: Callable[[Any], Any] | None = None, mutates: tuple[str, ...] = (),
           **args: Arg | st.SearchStrategy) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(call: Callable[..., Any]) -> Callable[..., Any]:
        TARGETS[name] = Target(name, call, args, allowed, setup, state, mutates)
        return call
    return register


# ---- fixtures and their state ---------------------------------------------------------------

X = np.linspace(-1, 1, 8 * 4, dtype=np.float32).reshape(8, 4)
Y = np.arange(8) % 3


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def trained(optimizer: str = "adamw") -> SimpleNamespace:
    """A model, its optimizer and TrainStep after one step (so the optimizer has state)."""
    model = mlp()
    opt = optim.AdamW(model.parameters(), lr=1e-2) if optimizer == "adamw" else \
        optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt)
    step(X, Y)
    return SimpleNamespace(model=model, opt=opt, step=step)


def trained_sgd() -> SimpleNamespace:
    return trained("sgd")


def with_scheduler() -> SimpleNamespace:
    f = trained()
    f.sched = optim.get_linear_schedule_with_warmup(f.opt, 2, 10)
    return f


def with_ema() -> SimpleNamespace:
    f = trained()
    f.ema = optim.EMA(f.model.parameters(), decay=0.9)
    f.ema.update()
    return f


def with_scaler() -> SimpleNamespace:
    f = trained()
    f.scaler = gt.amp.GradScaler(init_scale=256.0, growth_interval=3)
    return f


def with_loader() -> SimpleNamespace:
    loader = gt.DataLoader((X, Y), batch_size=3, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    return SimpleNamespace(loader=loader, it=it)


def model_state(model: nn.Module) -> Any:
    return {"model": model.state_dict(), "training": model.training}


def training_state(f: Any) -> Any:
    return {"model": f.model.state_dict(), "opt": f.opt.state_dict(), "lrs": [g["lr"] for g in f.opt.param_groups]}


def sched_state(f: Any) -> Any:
    return {**training_state(f), "sched": f.sched.state_dict()}


def ema_state(f: Any) -> Any:
    return {**training_state(f), "ema": f.ema.state_dict()}


def scaler_state(f: Any) -> Any:
    return {**training_state(f), "scaler": f.scaler.state_dict()}


def loader_state(f: Any) -> Any:
    return f.loader.state_dict()


def damaged(good: dict[str, Arg | st.SearchStrategy]) -> Arg:
    """A state dict spec with the keys of `good` (key -> strategy of its value's spec), with one
    key dropped, one added, or one value replaced by a wrong one; or not a dict at all."""
    keys = list(good)

    def build(drawn: tuple[dict[str, Any], str, int, Any]) -> tuple:
        values, kind, index, value = drawn
        items = list(values.items())
        key = keys[index % len(keys)]
        if kind == "drop":
            items = [(k, s) for k, s in items if k != key]
        elif kind == "add":
            items.append(("unexpected.key", value))
        elif kind == "replace":
            items = [(k, value if k == key else s) for k, s in items]
        return ("D", items)
    values = st.one_of(wrong_things, anyof(arr(3, 3)), anyof(arr(8, 4)), st.just(("D", [])), st.just(("L", [])))
    edits = st.sampled_from(["drop", "add", "replace", "replace"])
    intact = st.fixed_dictionaries({k: valid_of(v) for k, v in good.items()})
    return Arg(intact.map(lambda d: ("D", list(d.items()))),
               st.one_of(st.tuples(intact, edits, st.integers(0, 50), values).map(build), wrong_things))


# ---- gputrain.functional --------------------------------------------------------------------

DT = choice(None, "f32", "f16", "bf16")


@target("F.linear", ARRAYS, x=arr(5, 4), weight=arr(3, 4), bias=either(st.just(lit(None)), arr(3)), dtype=DT)
def _(f, **a):
    return F.linear(**a)


@target("F.linear_backward", ARRAYS, dout=arr(5, 3), x=arr(5, 4), weight=arr(3, 4), dtype=DT,
        with_bias=num(True, False))
def _(f, **a):
    return F.linear_backward(**a)


@target("F.gemm", ARRAYS, mutates=("c",), a=arr(4, 6), b=arr(6, 5), trans_a=num(False, True),
        trans_b=num(False, True), alpha=num(1.0, 0.5), beta=num(0.0, 1.0),
        c=either(st.just(lit(None)), arr(4, 5)), out_dtype=DT, dtype=DT)
def _(f, **a):
    return F.gemm(**a)


@target("F.add", ARRAYS, a=arr(4, 3), b=arr(4, 3), dtype=DT)
def _(f, **a):
    return F.add(**a)


@target("F.bias_add", ARRAYS, x=arr(4, 3), bias=arr(3), dtype=DT)
def _(f, **a):
    return F.bias_add(**a)


@target("F.bias_backward", ARRAYS, mutates=("accumulate_into",), dout=arr(4, 3), dtype=DT,
        accumulate_into=either(st.just(lit(None)), arr(3)))
def _(f, **a):
    return F.bias_backward(**a)


ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "tanh")


@target("F.activation", ARRAYS, x=arr(4, 5), kind=choice(*ACTIVATIONS), dtype=DT)
def _(f, **a):
    return F.activation(**a)


@target("F.activation_backward", ARRAYS, dout=arr(4, 5), x=arr(4, 5), kind=choice(*ACTIVATIONS), dtype=DT)
def _(f, **a):
    return F.activation_backward(**a)


for _name in ("relu", "silu", "tanh"):
    @target(f"F.{_name}", ARRAYS, x=arr(3, 4), dtype=DT)
    def _(f, _op=getattr(F, _name), **a):
        return _op(**a)

    @target(f"F.{_name}_backward", ARRAYS, dout=arr(3, 4), x=arr(3, 4), dtype=DT)
    def _(f, _op=getattr(F, _name + "_backward"), **a):
        return _op(**a)


@target("F.gelu", ARRAYS, x=arr(3, 4), approximate=choice("none", "tanh"), dtype=DT)
def _(f, **a):
    return F.gelu(**a)


@target("F.gelu_backward", ARRAYS, dout=arr(3, 4), x=arr(3, 4), approximate=choice("none", "tanh"), dtype=DT)
def _(f, **a):
    return F.gelu_backward(**a)


@target("F.cross_entropy", INDEX, logits=arr(6, 4), targets=arr(6, dtype="int64", fill="labels"),
        label_smoothing=num(0.0, 0.1), ignore_index=num(-100, 1), dloss_scale=num(1.0, 1024.0), dtype=DT)
def _(f, **a):
    return F.cross_entropy(**a)


@target("F.mse_loss", ARRAYS, pred=arr(6, 3), target=arr(6, 3), dloss_scale=num(1.0, 8.0), dtype=DT)
def _(f, **a):
    return F.mse_loss(**a)


@target("F.dropout", ARRAYS, x=arr(4, 6), p=num(0.1, 0.5, 0.0), seed=num(0, 7), layer=num(0, 2), step=num(0, 3),
        offset=num(0, 5), dtype=DT)
def _(f, **a):
    return F.dropout(**a)


@target("F.dropout_backward", ARRAYS, dout=arr(4, 6), p=num(0.1, 0.5), seed=num(0, 7), layer=num(0, 2),
        step=num(0, 3), offset=num(0, 5), dtype=DT)
def _(f, **a):
    return F.dropout_backward(**a)


@target("F.embedding", INDEX, ids=arr(2, 3, dtype="int64", fill="labels"), table=arr(5, 4), dtype=DT)
def _(f, **a):
    return F.embedding(**a)


@target("F.embedding_backward", INDEX, mutates=("accumulate_into",), dout=arr(2, 3, 4),
        ids=arr(2, 3, dtype="int64", fill="labels"), num=num(5, 4), dtype=DT,
        accumulate_into=either(st.just(lit(None)), arr(5, 4)))
def _(f, **a):
    return F.embedding_backward(**a)


@target("F.layer_norm", ARRAYS, x=arr(4, 6), weight=arr(6), bias=arr(6), eps=num(1e-5, 0.1), dtype=DT)
def _(f, **a):
    return F.layer_norm(**a)


@target("F.layer_norm_backward", ARRAYS, mutates=("dweight_into", "dbias_into"), dout=arr(4, 6), x=arr(4, 6),
        weight=arr(6), mean=arr(4), rstd=arr(4), dtype=DT,
        dweight_into=either(st.just(lit(None)), arr(6)), dbias_into=either(st.just(lit(None)), arr(6)))
def _(f, **a):
    return F.layer_norm_backward(**a)


PAIR = either(num(1, 2), st.just(("T", [lit(1), lit(2)])))
PADDING = either(num(0, 1), st.just(("T", [lit(0), lit(2)])))


@target("F.conv2d", ARRAYS, x=arr(2, 4, 5, 6), weight=arr(6, 2, 3, 2), bias=either(st.just(lit(None)), arr(6)),
        stride=PAIR, padding=PADDING, dilation=PAIR, groups=num(2, 1), dtype=DT)
def _(f, **a):
    return F.conv2d(**a)


@target("F.conv2d_backward", ARRAYS, dout=arr(2, 6, 3, 5), x=arr(2, 4, 5, 6), weight=arr(6, 2, 3, 2),
        stride=PAIR, padding=PADDING, dilation=PAIR, groups=num(2, 1), dtype=DT, with_bias=num(True, False))
def _(f, **a):
    return F.conv2d_backward(**a)


@target("F.sum_squares", ARRAYS, x=arr(5, 3))
def _(f, **a):
    return F.sum_squares(**a)


@target("gt.cast", ARRAYS, mutates=("out",), array=arr(3, 4), dtype=choice("f16", "bf16", "f32", np.float16),
        src_dtype=choice(None, "f32", "f16", "bf16"), out=either(st.just(lit(None)), arr(3, 4, dtype="float16")))
def _(f, **a):
    return gt.cast(**a)


# ---- gputrain.nn: constructors, forward, Module methods ------------------------------------

DIM = num(4, 3, 1)


@target("nn.Linear", ARRAYS, in_features=DIM, out_features=DIM, bias=num(True, False))
def _(f, **a):
    return nn.Linear(**a).compiled


@target("nn.Embedding", ARRAYS, num_embeddings=DIM, embedding_dim=DIM)
def _(f, **a):
    return nn.Embedding(**a).compiled


@target("nn.LayerNorm", ARRAYS, normalized_shape=either(DIM, st.just(("T", [lit(4)]))), eps=num(1e-5),
        bias=num(True, False))
def _(f, **a):
    return nn.LayerNorm(**a).compiled


@target("nn.Conv2d+forward", ARRAYS, in_channels=num(4, 2), out_channels=DIM, kernel_size=PAIR, stride=PAIR,
        padding=either(PADDING, choice("same", "valid")), dilation=PAIR, groups=num(1, 2), bias=num(True, False),
        x=arr(2, 4, 5, 6))
def _(f, x, **a):
    return nn.Conv2d(**a)(x)


@target("nn.Dropout", ARGS, p=num(0.0, 0.5, 0.9))
def _(f, **a):
    return nn.Dropout(**a)


@target("nn.GELU", ARGS, approximate=choice("none", "tanh"))
def _(f, **a):
    return nn.GELU(**a)


@target("nn.CrossEntropyLoss", ARGS, label_smoothing=num(0.0, 0.2), ignore_index=num(-100, 0))
def _(f, **a):
    return nn.CrossEntropyLoss(**a)


@target("nn.Parameter", ARRAYS, data=arr(3, 2), name=choice("w", ""), requires_grad=num(True, False))
def _(f, **a):
    return nn.Parameter(**a)


LAYER_KINDS = ["linear", "relu", "gelu", "silu", "tanh", "layernorm", "dropout", "flatten", "embedding",
               "residual", "bad"]


def _layer(kind: str) -> Any:
    return {"linear": lambda: nn.Linear(4, 4), "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh,
            "layernorm": lambda: nn.LayerNorm(4), "dropout": lambda: nn.Dropout(0.1), "flatten": nn.Flatten,
            "embedding": lambda: nn.Embedding(6, 4), "residual": lambda: nn.Residual(nn.Linear(4, 4), nn.ReLU()),
            "bad": object}[kind]()


@target("nn.Sequential+forward", INDEX, kinds=st.lists(st.sampled_from(LAYER_KINDS), max_size=4).map(lit),
        x=arr(3, 4), train=num(True, False))
def _(f, kinds, x, train):
    model = nn.Sequential(*[_layer(k) for k in kinds])
    model.train(train)
    return model(x)


@target("Module.__call__", ARRAYS, setup=mlp, state=model_state, x=arr(5, 4))
def _(f, x):
    return f(x)


@target("Module.load_state_dict", STATE, setup=mlp, state=model_state,
        state_dict=damaged({"0.weight": arr(8, 4), "0.bias": arr(8), "2.weight": arr(3, 8), "2.bias": arr(3)}),
        strict=num(True, False))
def _(f, **a):
    f.load_state_dict(**a)


@target("Module.summary", ARRAYS, setup=mlp, state=model_state,
        input_shape=either(st.just(lit(None)), st.lists(st.sampled_from([0, 1, 4, -1, 2**40, 2**63]), max_size=3)
                              .map(lambda s: lit(tuple(s))), wrong_things),
        precision=choice(None, "fp32", "bf16", "fp16"), checkpointing=num(None, True, False))
def _(f, **a):
    return f.summary(**a)


@target("Module.to", DEVICE, setup=mlp, state=model_state, device=choice("cpu", "cuda", "cuda:7", "sim"))
def _(f, **a):
    return f.to(**a)


@target("Module.train/zero_grad", ARGS, setup=trained, state=training_state, mode=num(True, False),
        set_to_none=num(True, False))
def _(f, mode, set_to_none):
    f.model.train(mode)
    f.model.zero_grad(set_to_none)


# ---- TrainStep ------------------------------------------------------------------------------

@target("TrainStep", ARRAYS, setup=mlp, optimizer=st.sampled_from(["adamw", "sgd", "none", "other"]).map(lit),
        micro_batches=num(1, 2), precision=choice("fp32", "bf16", "fp16"),
        gradient_checkpointing=num(False, True), max_grad_norm=num(None, 1.0), scaler=num(None), scheduler=num(None),
        set_to_none=num(True, False), log_grad_norm=num(False, True), tf32=num(None, True))
def _(model, optimizer, **a):
    opt = {"adamw": lambda: optim.AdamW(model.parameters()), "sgd": lambda: optim.SGD(model.parameters()),
           "none": lambda: None, "other": lambda: optim.AdamW(mlp().parameters())}[optimizer]()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, **a)
    return step(X, Y)


@target("TrainStep.__call__", INDEX, setup=trained, state=training_state,
        x=arr(8, 4), y=arr(8, dtype="int64", fill="labels"))
def _(f, x, y):
    return f.step(x, y)


@target("TrainStep.__call__(mse)", ARRAYS, setup=mlp, x=arr(8, 4), y=arr(8, 3))
def _(model, x, y):
    return gt.TrainStep(model, nn.MSELoss(), optim.SGD(model.parameters()))(x, y)


@target("TrainStep.memory_plan", ARRAYS, setup=trained, state=training_state,
        batch_shape=st.one_of(st.lists(st.sampled_from([0, 1, 4, 8, -1, 2**31, 2**40, 2**62, 2**63]), max_size=3)
                              .map(lambda s: lit(tuple(s))), anyof(arr(2, dtype="int64")), wrong_things))
def _(f, batch_shape):
    return f.step.memory_plan(batch_shape)


@target("TrainStep(any layers)", INDEX, kinds=st.lists(st.sampled_from(LAYER_KINDS[:-1]), min_size=1, max_size=4)
        .map(lit), precision=choice("fp32", "bf16", "fp16"), gradient_checkpointing=num(False, True),
        x=arr(4, 4), y=arr(4, dtype="int64", fill="labels"))
def _(f, kinds, precision, gradient_checkpointing, x, y):
    """Every layer kind first, in the middle and last, in each precision, trained a step."""
    model = nn.Sequential(*[_layer(k) for k in kinds], nn.Flatten(), nn.Linear(4, 3))
    opt = optim.AdamW(model.parameters())
    return gt.TrainStep(model, nn.CrossEntropyLoss(), opt, precision=precision,
                        gradient_checkpointing=gradient_checkpointing)(x, y)


@target("SpikeGuard + TrainStep", ARRAYS, setup=trained, state=training_state, window=num(2, 4),
        z_loss=num(None, 3.0), z_grad_norm=num(None, 3.0), x=arr(8, 4))
def _(f, window, z_loss, z_grad_norm, x):
    """A guard built from these settings on the step, which then runs twice (the guard decides)."""
    f.step.spike_guard = gt.SpikeGuard(window, z_loss, z_grad_norm)
    f.step(x, Y)
    return f.step(x, Y)


@target("_C.train_step(guard)", ARRAYS, setup=trained, state=training_state, guard=num(True, False),
        guard_loss=num(1.0, 1e300), guard_grad_norm=num(0.5, 1e300))
def _(f, guard, guard_loss, guard_grad_norm):
    return gt._C.train_step(gt._C.StepConfig(nn.CrossEntropyLoss()._spec(), optimizer=f.opt, guard=guard),
                            f.model.compiled, X, Y, guard_loss=guard_loss, guard_grad_norm=guard_grad_norm)


@target("Parameter.grad/data", ARRAYS, setup=trained, state=training_state,
        which=st.sampled_from(["grad", "data"]).map(lit), value=arr(8, 4), then_step=num(True, False))
def _(f, which, value, then_step):
    """A user-set gradient or weight array of the wrong kind, then an optimizer step."""
    p = next(iter(f.model.parameters()))
    setattr(p, which, value)
    if then_step is True:
        f.opt.step()


def weights_and_moments(f: Any) -> Any:
    """The training state less param_groups (where the case itself writes the bad value)."""
    return {"model": f.model.state_dict(), "state": f.opt.state_dict()["state"]}


@target("optimizer hyperparameters", ARGS, setup=trained, state=weights_and_moments,
        key=st.sampled_from(["lr", "weight_decay", "eps", "betas", "amsgrad", "maximize"]).map(lit),
        value=num(0.1), how=st.sampled_from(["step", "train_step", "push"]).map(lit))
def _(f, key, value, how):
    """A hyperparameter set through param_groups (as schedulers and users do), then used."""
    f.opt.param_groups[0][key] = value
    {"step": f.opt.step, "train_step": lambda: f.step(X, Y), "push": f.opt.push_hyperparameters}[how]()


# ---- optimizers -----------------------------------------------------------------------------

PARAMS = st.sampled_from(["model", "empty", "dup", "groups", "arrays", "none", "bad_group"]).map(lit)


def _params(kind: str) -> Any:
    model = mlp()
    p = list(model.parameters())
    return {"model": p, "empty": [], "dup": p + p[:1], "groups": [{"params": p[:2]}, {"params": p[2:], "lr": 0.5}],
            "arrays": [np.zeros(3, np.float32)], "none": None, "bad_group": [{"lr": 1.0}]}[kind]


@target("optim.AdamW", ARGS, params=PARAMS, lr=num(1e-3), betas=st.one_of(st.just(("T", [lit(0.9), lit(0.999)])),
                                                                            st.tuples(anyof(num(0.9)), anyof(num(0.99))).map(lambda t: ("T", list(t))), wrong_things),
        eps=num(1e-8), weight_decay=num(0.01), amsgrad=num(False, True), maximize=num(False),
        numerics=choice("exact", "fast"), cpu_offload_fraction=num(0.0, 0.5, 1.0), offload_chunk_numel=num(0, 64))
def _(f, params, **a):
    return optim.AdamW(_params(params), **a)


@target("optim.SGD", ARGS, params=PARAMS, lr=num(1e-3), momentum=num(0.0, 0.9), dampening=num(0.0),
        weight_decay=num(0.0), nesterov=num(False, True), maximize=num(False))
def _(f, params, **a):
    return optim.SGD(_params(params), **a)


GROUP = st.fixed_dictionaries({"lr": anyof(num(0.1)), "weight_decay": anyof(num(0.0)), "betas": wrong_things}).map(
    lambda d: ("D", list(d.items())))


for _kind, _setup in (("AdamW", trained), ("SGD", trained_sgd)):
    @target(f"{_kind}.add_param_group", STATE, setup=_setup, state=training_state,
            group=Arg(GROUP, wrong_things), params=PARAMS)
    def _(f, group, params):
        g = dict(group) if isinstance(group, dict) else group
        if isinstance(g, dict):
            g["params"] = _params(params)
        f.opt.add_param_group(g)

    @target(f"{_kind}.load_state_dict", STATE, setup=_setup, state=training_state,
            state_dict=damaged({"state": st.just(("D", [])), "param_groups": st.just(("L", []))}), real=num(True))
    def _(f, state_dict, real):
        if real is True:  # a real state dict with one value damaged
            sd = f.opt.state_dict()
            if isinstance(state_dict, dict) and state_dict:
                key = sorted(state_dict)[0]
                group = sd["param_groups"][0]
                group[key if key in group else "lr"] = state_dict[key]
            state_dict = sd
        f.opt.load_state_dict(state_dict)

    @target(f"{_kind}.methods", ARGS + (RuntimeError,), setup=_setup, state=training_state,
            method=st.sampled_from(["zero_grad", "step", "clip_grad_norm_"]).map(lit),
            a=num(True, 1.0, 0.5), b=num(2.0, 1.0, 0.0))
    def _(f, method, a, b):
        if method == "zero_grad":
            return f.opt.zero_grad(set_to_none=a)
        if method == "step":
            return f.opt.step(closure=a)
        return f.opt.clip_grad_norm_(a, b)


@target("optim.clip_grad_norm_", ARGS + (RuntimeError,), setup=trained, state=training_state,
        max_norm=num(1.0), norm_type=num(2.0, 1.0, float("inf")), error_if_nonfinite=num(False, True))
def _(f, **a):
    return optim.clip_grad_norm_(list(f.model.parameters()), **a)


@target("optim.total_norm", ARRAYS, grads=st.lists(anyof(arr(3)), max_size=3).map(lambda s: ("L", s)),
        norm_type=num(2.0, 1.0, float("inf")))
def _(f, **a):
    return optim.total_norm(**a)


@target("optim.clip_coefficient", ARGS, max_norm=num(1.0), norm=num(2.0))
def _(f, **a):
    return optim.clip_coefficient(**a)


@target("optim.param_groups_weight_decay", ARGS, params=PARAMS, weight_decay=num(0.01), skip_list=wrong_things)
def _(f, params, **a):
    return optim.param_groups_weight_decay(_params(params), **a)


@target("optim.param_groups_llrd", ARGS, setup=mlp, layers=st.sampled_from(["model", "list", "empty", "bad"]).map(lit),
        lr=num(0.1), llrd=num(0.9, 1.0), weight_decay=num(0.0, 0.1), skip_list=Arg(st.just(lit(())), wrong_things))
def _(model, layers, **a):
    chosen = {"model": model, "list": [m for _, m in model.named_children()],
              "empty": [], "bad": [object()]}[layers]
    return optim.param_groups_llrd(chosen, **a)


@target("Optimizer.for_model", ARGS + (RuntimeError,), setup=mlp, kind=st.sampled_from(["AdamW", "SGD"]).map(lit),
        lr=num(0.1), weight_decay=num(0.0))
def _(model, kind, **a):
    return getattr(optim, kind).for_model(model, **a)


# ---- schedulers, EMA, GradScaler ------------------------------------------------------------

SCHEDULES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
             "inverse_sqrt")


@target("optim.get_scheduler", ARGS, setup=trained, name=choice(*SCHEDULES), num_warmup_steps=num(None, 2, 0),
        num_training_steps=num(None, 10), steps=num(3, 0))
def _(f, name, num_warmup_steps, num_training_steps, steps):
    s = optim.get_scheduler(name, f.opt, num_warmup_steps, num_training_steps)
    for _ in range(steps if isinstance(steps, int) and 0 <= steps < 20 else 1):
        s.step()
    return s.get_last_lr()


@target("optim.LambdaLR", STATE, setup=trained, lr_lambda=Arg(st.just(lit("callable")), wrong_things),
        last_epoch=num(-1, 0, 3))
def _(f, lr_lambda, last_epoch):
    if lr_lambda == "callable":
        lr_lambda = lambda step: 1.0 / (step + 1)  # noqa: E731
    s = optim.LambdaLR(f.opt, lr_lambda, last_epoch)
    s.step()
    return s.get_last_lr()


@target("LambdaLR.load_state_dict", STATE, setup=with_scheduler, state=sched_state,
        state_dict=damaged({"last_epoch": num(3), "base_lrs": st.just(("L", [lit(0.01)])),
                            "_step_count": num(4), "_last_lr": st.just(("L", [lit(0.01)]))}))
def _(f, state_dict):
    f.sched.load_state_dict(state_dict)
    f.sched.step()


@target("optim.EMA", ARGS, params=PARAMS, decay=num(0.999, 0.0, 1.0), location=choice("device", "host", "cpu"),
        use_warmup=num(False, True))
def _(f, params, **a):
    ema = optim.EMA(_params(params), **a)
    ema.update()
    return ema.current_decay()


def over_real(owner: Any, state_dict: Any, real: Any) -> Any:
    """With real=True, the damaged entries laid over owner's own valid state (so one bad value
    sits among good ones); otherwise the damaged state as it is."""
    if real is True and isinstance(state_dict, dict):
        own = owner.state_dict()
        return {**own, **{k: v for k, v in state_dict.items() if k in own}}
    return state_dict


@target("EMA.load_state_dict", STATE, setup=with_ema, state=ema_state,
        state_dict=damaged({"decay": num(0.9), "num_updates": num(1), "shadow": st.just(("L", []))}), real=num(True))
def _(f, state_dict, real):
    f.ema.load_state_dict(over_real(f.ema, state_dict, real))


@target("amp.GradScaler", ARGS, init_scale=num(65536.0, 1.0), growth_factor=num(2.0), backoff_factor=num(0.5),
        growth_interval=num(2000, 1), enabled=num(True, False), min_scale=num(None, 1.0))
def _(f, **a):
    return gt.amp.GradScaler(**a).state_dict()


@target("GradScaler.load_state_dict", STATE + (RuntimeError,), setup=with_scaler, state=scaler_state,
        state_dict=damaged({"scale": num(256.0), "growth_factor": num(2.0), "backoff_factor": num(0.5),
                            "growth_interval": num(3), "_growth_tracker": num(0, 2)}))
def _(f, state_dict):
    f.scaler.load_state_dict(state_dict)


@target("GradScaler.methods", ARRAYS + (RuntimeError,), setup=with_scaler, state=scaler_state, mutates=("arrays",),
        method=st.sampled_from(["set_growth_factor", "set_backoff_factor", "set_growth_interval", "update",
                                "unscale_arrays"]).map(lit),
        value=num(2.0, 0.5, 3), arrays=st.lists(anyof(arr(3)), max_size=2).map(lambda s: ("L", s)))
def _(f, method, value, arrays):
    if method == "unscale_arrays":
        return f.scaler.unscale_arrays(arrays)
    return getattr(f.scaler, method)(value)


@target("GPUHealthCallback", ARGS, warn_temperature=num(80.0, 60), stop_temperature=num(85.0, 90),
        action=choice("pause", "stop"), check_interval_s=num(0.0, 10.0), max_pause_s=num(600.0, 1.0),
        poll_interval_s=num(10.0, 0.5), device_index=num(0, 1))
def _(**a):
    return gt.GPUHealthCallback(**a)


# ---- data -----------------------------------------------------------------------------------

DATASET = Arg(st.one_of(st.just(("T", [spec_arr("float32", (8, 4)), spec_arr("int64", (8,))])), arr(8, 4).valid,
                        st.just(("D", [("x", spec_arr("float32", (8, 4)))]))),
              st.one_of(st.just(("T", [spec_arr("float32", (8, 4)), spec_arr("int64", (7,))])), arr(8, 4).bad))


@target("DataLoader", ARRAYS + (RuntimeError,), dataset=DATASET,
        batch_size=num(3, 1, None), shuffle=num(None, True, False), num_workers=num(0, 1, 2),
        drop_last=num(False, True), timeout=num(0, 5.0), prefetch_factor=num(None, 2),
        persistent_workers=num(False, True), in_order=num(True, False), seed=num(None, 0, 5), pin_memory=num(False))
def _(f, num_workers, prefetch_factor, **a):
    if isinstance(num_workers, int) and not isinstance(num_workers, bool) and num_workers > 64:
        num_workers = 2**20  # the known case of issue item 9, not hundreds of variants of it
    if isinstance(prefetch_factor, int) and not isinstance(prefetch_factor, bool) and prefetch_factor > 64:
        prefetch_factor = 2**40
    loader = gt.DataLoader(num_workers=num_workers, prefetch_factor=prefetch_factor, **a)
    return [len(b) if hasattr(b, "__len__") else b for b in loader][:3]


@target("DataLoader.load_state_dict", STATE, setup=with_loader, state=loader_state,
        state_dict=damaged({"version": num(1), "epoch": num(0, 1), "batches_yielded": num(1), "seed": num(1),
                            "done": st.just(("L", []))}), real=num(True))
def _(f, state_dict, real):
    f.loader.load_state_dict(over_real(f.loader, state_dict, real))
    return [len(b[0]) for b in f.loader]


@target("DataLoader.set_epoch", ARGS, setup=with_loader, state=loader_state, epoch=num(0, 3))
def _(f, epoch):
    f.loader.set_epoch(epoch)


@target("data.RandomSampler", ARRAYS, data_source=arr(6), replacement=num(False, True),
        num_samples=num(None, 4), seed=num(None, 3))
def _(f, **a):
    return list(islice(data.RandomSampler(**a), 4))


@target("data.DistributedSampler", ARRAYS, dataset=arr(6), num_replicas=num(None, 2),
        rank=num(None, 0, 1), shuffle=num(True, False), seed=num(0), drop_last=num(False, True))
def _(f, **a):
    return list(islice(data.DistributedSampler(**a), 4))


@target("data.BatchSampler", ARRAYS, sampler=Arg(st.just(lit(range(7))), wrong_things), batch_size=num(3),
        drop_last=num(False, True))
def _(f, **a):
    return list(islice(data.BatchSampler(**a), 3))


@target("data.SequentialSampler", ARRAYS, data_source=arr(6))
def _(f, **a):
    return list(islice(data.SequentialSampler(**a), 3))


@target("data.TokenDataset", INDEX, tokens=arr(50, dtype="int64", fill="labels"), block_size=num(8, 1),
        stride=num(None, 4), index=num(0, -1, 1))
def _(f, index, **a):
    ds = data.TokenDataset(**a)
    return ds[index]


@target("data.bucket_by_length", ARRAYS, lengths=arr(20, dtype="int64", fill="labels"), batch_size=num(4, 1),
        boundaries=Arg(st.one_of(st.just(lit(None)), st.just(("L", [lit(2), lit(3)]))), wrong_things),
        pool_batches=num(50, 1), shuffle=num(True, False), seed=num(None, 0), drop_last=num(False, True))
def _(f, lengths, batch_size, **a):
    sampler = data.bucket_by_length(lengths, batch_size, **a)
    return list(islice(sampler, 3))


@target("data.RaggedArray", ARRAYS, values=arr(10, dtype="int64"), offsets=arr(4, dtype="int64", fill="labels"),
        pad_value=num(0, -1))
def _(f, **a):
    ragged = data.RaggedArray(**a)
    return [len(b[0]) for b in gt.DataLoader(ragged, batch_size=2)]


# ---- process-wide settings ------------------------------------------------------------------

DEVICE_NAMES = choice(None, "cpu", "cuda", "cuda:0", "sim")


@target("memory.set_memory_limit", DEVICE, limit=num(None, 1 << 30, 0), device=DEVICE_NAMES)
def _(f, **a):
    gt.set_memory_limit(**a)


@target("memory.set_memory_fraction", DEVICE, fraction=num(0.5, 1.0, 0.0), device=DEVICE_NAMES)
def _(f, **a):
    gt.set_memory_fraction(**a)


@target("memory.stats", DEVICE, device=DEVICE_NAMES, which=st.sampled_from(["stats", "summary", "reset"]).map(lit))
def _(f, device, which):
    return {"stats": gt.memory_stats, "summary": gt.memory_summary, "reset": gt.reset_peak_memory_stats}[which](device)


@target("set_num_threads", ARGS, n=num(1, 2))
def _(f, n):
    gt.set_num_threads(n)


@target("settings", ARGS, which=st.sampled_from(["set_debug", "set_tf32", "manual_seed"]).map(lit),
        value=num(True, False, 0, 5))
def _(f, which, value):
    {"set_debug": gt.set_debug, "set_tf32": gt.backends.set_tf32, "manual_seed": gt.random.manual_seed}[which](value)


@target("Buffer", ARRAYS + (RuntimeError,), nbytes=num(16, 0), device=DEVICE_NAMES)
def _(f, **a):
    return gt.Buffer(**a).numpy()


@target("cuda functions", DEVICE, which=st.sampled_from(["get_device_name", "get_device_capability",
                                                         "get_device_properties", "set_device", "synchronize",
                                                         "memory_stats"]).map(lit),
        device=choice(0, "cuda:0", None))
def _(f, which, device):
    return getattr(gt.cuda, which)(device)


@target("selftest.crash", ARGS, how=st.just(lit("none")))
def _(f, how):
    """Not fuzzed (all_targets leaves it out): test_fuzz_runner checks that the runner names a
    case that kills its worker or hangs."""
    if how == "segfault":
        import ctypes
        ctypes.string_at(0)
    elif how == "hang":
        threading.Event().wait()
    elif how == "wrong":
        raise AttributeError("not on the allow-list")


def all_targets() -> list[Target]:
    return [t for t in TARGETS.values() if not t.name.startswith("selftest.")]


def snapshot(value: Any) -> Any:
    """A comparable copy of a state: arrays by dtype, shape and bytes (NaN == NaN)."""
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [snapshot(v) for v in value]
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, float) and value != value:
        return ("nan",)
    return value

