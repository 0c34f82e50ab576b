"""LoRA adapters with PEFT's names, semantics and files (issue 23 item 3).

``get_peft_model(model, LoraConfig(...))`` wraps every targeted ``Linear`` of any gputrain model in
a :class:`LoraLinear`: PEFT's ``lora.Linear``, ``y = base_layer(x) + lora_B(lora_A(dropout(x))) *
scaling`` with ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``), run by
the C layer kind ``lora`` (csrc/nn/lora.c) in one forward and one backward, with the model's Philox
dropout on the adapter's input only and no weight-gradient GEMM for the frozen base. The module
tree and parameter names are PEFT's::

    base_model.model.<name>.base_layer.weight          the frozen base Linear (and .bias)
    base_model.model.<name>.lora_A.default.weight      (r, in_features), trained
    base_model.model.<name>.lora_B.default.weight      (out_features, r), trained
    base_model.model.<name>.lora_magnitude_vector.default.weight   (out_features,), DoRA's m, trained

DoRA (``use_dora=True``) is PEFT's DoraLinearLayer: ``m`` starts as the row norms of
``W + scaling B A``, and ``y = base_layer(x) + (m / n - 1) * (x W^T) + (m / n) * lora_B(lora_A(x)) *
scaling`` with ``n = ||W + scaling B A||`` per output row, treated as a constant in backward (PEFT
detaches it); with dropout in training, both DoRA terms read the dropped-out input, as PEFT's.

``save_pretrained(folder)`` writes PEFT's ``adapter_config.json`` and ``adapter_model.safetensors``
(keys without the adapter name: ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``,
``...q_proj.lora_magnitude_vector`` for DoRA, ``base_model.model.<name>.weight`` for
``modules_to_save``), which ``peft.PeftModel.from_pretrained`` loads; :meth:`PeftModel.from_pretrained`
loads PEFT's. Targets follow PEFT's rule: a string is a regular expression the full module name must match; a list names modules by their full name or
its last parts (``"q_proj"`` matches ``model.layers.0.self_attn.q_proj``); ``"all-linear"`` is
every Linear but the output layer (``lm_head``; a classifier's ``score``/``classifier``).

QLoRA: a target may be a :class:`~gputrain.nn.QLinear` (``from_pretrained(folder, quantization="nf4")``,
``"fp4"`` or ``"int8"``): the base's terms then run through the QLinear's own tile-by-tile
dequantizing forward and input gradient; the adapter is the same and saves under the same keys as
on a float base (PEFT's keys for a bitsandbytes base), so it loads onto a quantized or a float
base. On a quantized base, ``use_dora`` is refused (DoRA's norms need the dequantized weight) and
so is ``merge_and_unload`` (the merged weight would have to be quantized again).

A bf16/f16 base, as PEFT's in a bf16 model: when the model computes in bf16 or f16 (``from_pretrained(
folder, dtype="bf16")``, or ``precision=`` given to compile it), each targeted Linear's frozen weight is
kept in that precision alone, a ``QLinear(quant_type="bf16" | "f16")`` as ``base_layer`` -- 2 bytes a
weight instead of a float32 master and its half copy (6 bytes) -- and so is every other untied Linear
left frozen (an untied LM head, the projections a narrower ``target_modules`` skips; not
``modules_to_save``), and the token table (a :class:`~gputrain.nn.HalfTokenEmbedding`; a tied LM
head reads it as stored), with the values the half copy held, so
the model computes exactly what it computed before (DoRA's norms widen the half weight where they
read the master). DoRA on a half base computes in that precision only.
``merge_and_unload`` gives a float32 Linear of the half weight plus the adapter's delta.
``from_pretrained(folder, quantization="bf16")`` stores the bases in bf16 while loading.

Not here (refused by name, never ignored): LoRA on anything but a Linear or QLinear
(embeddings, convolutions, a tied LM head), DoRA on a QLinear, ``bias`` other than "none", ``fan_in_fan_out``,
rank/alpha patterns, ``layers_to_transform``, ``exclude_modules`` and several adapters at once
(one adapter, named "default"). ``modules_to_save`` modules are trained in place: PEFT keeps a
trained copy beside the original module, which only matters for switching adapters.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gputrain import random
from gputrain.models.hf.safetensors_io import read_header, read_tensor
from gputrain.nn.embedding import TiedLinear
from gputrain.nn.layers import Linear
from gputrain.nn.module import Module, planning_active
from gputrain.nn.qlinear import HALF_TYPES, QLinear
from gputrain.nn.sequence import FrozenTokenEmbedding, HalfTokenEmbedding, TokenEmbedding

__all__ = ["LoraConfig", "LoraLinear", "PeftModel", "get_peft_model"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PREFIX = "base_model.model."
ADAPTER = "default"
# PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the families gputrain loads
DEFAULT_TARGETS = {"llama": ["q_proj", "v_proj"], "mistral": ["q_proj", "v_proj"], "qwen2": ["q_proj", "v_proj"],
                   "qwen3": ["q_proj", "v_proj"], "gemma": ["q_proj", "v_proj"], "gemma3_text": ["q_proj", "v_proj"],
                   "gpt2": ["c_attn"], "bert": ["query", "value"], "roberta": ["query", "value"],
                   "xlm-roberta": ["query", "value"], "distilbert": ["q_lin", "v_lin"],
                   "deberta-v2": ["query_proj", "value_proj"]}
OUTPUT_LAYERS = ("lm_head", "score", "classifier")  # what "all-linear" leaves out, as PEFT does
# adapter_config.json fields that change the math, with the only value gputrain implements
_UNSUPPORTED = {"bias": "none", "fan_in_fan_out": False, "rank_pattern": {}, "alpha_pattern": {},
                "layers_to_transform": None, "layers_pattern": None, "layer_replication": None, "lora_bias": False,
                "exclude_modules": None, "target_parameters": None, "trainable_token_indices": None,
                "use_qalora": False, "use_bdlora": None, "alora_invocation_tokens": None}


def _positive_rank(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"r must be an int, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"r must be a positive int (the adapter's rank), got {value}")
    return int(value)


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _names(value: Any, name: str) -> list[str] | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"{name} must be a str (a regular expression, or 'all-linear'), a list of str or None, "
                    f"not {type(value).__name__}")


class LoraConfig:
    """PEFT's LoraConfig (the fields gputrain implements; the rest are refused by name).

    r: rank (int >= 1); lora_alpha: scaling numerator; lora_dropout: dropout probability on the
    adapter's input, in [0, 1); target_modules: names, a regular expression, "all-linear", or None
    (PEFT's default for the model's family); modules_to_save: modules trained and saved whole;
    use_rslora: scaling lora_alpha / sqrt(r); use_dora: DoRA's magnitude vector; init_lora_weights:
    True (A as nn.Linear's kaiming-uniform, B zeros: the adapter starts as the identity), "gaussian"
    (A ~ N(0, 1/r), B zeros) or False (A and B both as nn.Linear's: a non-zero adapter, for tests).
    The unsupported fields (bias other than "none") raise NotImplementedError."""

    def __init__(self, r: int = 8, lora_alpha: float = 8, lora_dropout: float = 0.0,
                 target_modules: Sequence[str] | str | None = None, modules_to_save: Sequence[str] | None = None,
                 use_rslora: bool = False, use_dora: bool = False, init_lora_weights: bool | str = True,
                 bias: str = "none", task_type: str | None = None, base_model_name_or_path: str | None = None,
                 inference_mode: bool = False) -> None:
        self.r = _positive_rank(r)
        self.lora_alpha = _finite(lora_alpha, "lora_alpha")
        if isinstance(lora_alpha, (int, np.integer)):
            self.lora_alpha = int(lora_alpha)  # written back as PEFT writes it
        self.lora_dropout = _finite(lora_dropout, "lora_dropout")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {lora_dropout}")
        self.target_modules = _names(target_modules, "target_modules")
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise ValueError("target_modules: an empty list targets nothing")
        mts = _names(modules_to_save, "modules_to_save")
        if isinstance(mts, str):
            raise TypeError("modules_to_save must be a list of module names, not a str")
        self.modules_to_save = mts
        for flag, value in (("use_rslora", use_rslora), ("use_dora", use_dora)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{flag} must be a bool, not {type(value).__name__}")
        self.use_rslora, self.use_dora = bool(use_rslora), bool(use_dora)
        if init_lora_weights not in (True, False, "gaussian"):
            raise ValueError(f"init_lora_weights must be True, False or 'gaussian', got {init_lora_weights!r}")
        self.init_lora_weights = init_lora_weights
        if bias != "none":
            raise NotImplementedError(f"bias={bias!r}: gputrain trains no biases in LoRA; use bias='none'")
        self.bias = bias
        self.task_type = task_type
        self.base_model_name_or_path = base_model_name_or_path
        self.inference_mode = bool(inference_mode)

    @property
    def scaling(self) -> float:
        """lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA (PEFT's LoraLayer.update_layer)."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    def to_dict(self) -> dict[str, Any]:
        """adapter_config.json's fields, as PEFT 0.21 writes them."""
        targets = self.target_modules
        return {
            "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None, "auto_mapping": None,
            "base_model_name_or_path": self.base_model_name_or_path, "bias": self.bias, "corda_config": None,
            "ensure_weight_tying": False, "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False,
            "inference_mode": self.inference_mode, "init_lora_weights": self.init_lora_weights,
            "kasa_config": None, "layer_replication": None, "layers_pattern": None, "layers_to_transform": None,
            "loftq_config": {}, "lora_alpha": self.lora_alpha, "lora_bias": False, "lora_dropout": self.lora_dropout,
            "lora_ga_config": None, "megatron_config": None, "megatron_core": "megatron.core",
            "modules_to_save": self.modules_to_save, "monteclora_config": None, "peft_type": "LORA",
            "qalora_group_size": 16, "r": self.r, "rank_pattern": {}, "revision": None,
            "target_modules": targets, "target_parameters": None, "task_type": self.task_type,
            "trainable_token_indices": None, "use_bdlora": None, "use_dora": self.use_dora, "use_qalora": False,
            "use_rslora": self.use_rslora, "velora_config": None,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = CONFIG_NAME) -> LoraConfig:
        """The config of an adapter_config.json; ValueError naming a field whose value gputrain does not
        implement (DoRA, biases, patterns, ...) or a peft_type other than LORA."""
        if not isinstance(values, dict):
            raise ValueError(f"{where}: expected a JSON object")
        if values.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"{where}: peft_type {values.get('peft_type')!r}: gputrain loads LORA adapters")
        for key, default in _UNSUPPORTED.items():
            value = values.get(key, default)
            if value != default and not (default is None and value in ({}, [], False)):
                raise ValueError(f"{where}: {key}={value!r} is not implemented in gputrain (only {default!r})")
        if "r" not in values or "target_modules" not in values:
            raise ValueError(f"{where}: needs the fields r and target_modules")
        try:
            return cls(r=values["r"], lora_alpha=values.get("lora_alpha", 8), lora_dropout=values.get("lora_dropout", 0.0),
                       target_modules=values["target_modules"], modules_to_save=values.get("modules_to_save"),
                       use_rslora=values.get("use_rslora", False), use_dora=values.get("use_dora", False),
                       init_lora_weights=values.get("init_lora_weights", True),
                       task_type=values.get("task_type"), base_model_name_or_path=values.get("base_model_name_or_path"))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {error}") from None

    def __repr__(self) -> str:
        return (f"LoraConfig(r={self.r}, lora_alpha={self.lora_alpha}, lora_dropout={self.lora_dropout}, "
                f"target_modules={self.target_modules!r}, modules_to_save={self.modules_to_save!r}, "
                f"use_rslora={self.use_rslora}, use_dora={self.use_dora}, "
                f"init_lora_weights={self.init_lora_weights!r})")


class _AdapterDict(Module):
    """PEFT's ModuleDict of one adapter: its one child is named "default"."""

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.default = module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield ADAPTER, self.default

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return self.default._spec_in(tied)


class _Magnitude(Module):
    """DoRA's magnitude vector m (out_features,) (PEFT's DoraLinearLayer, parameter ``weight``), held by
    the C kind lora in a child of kind bias."""

    _param_names = ("weight",)

    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features
        self._compile()

    def _spec(self) -> tuple:
        return ("bias", self.features)

    def extra_repr(self) -> str:
        return f"{self.features}"


_DORA_QUANTIZED = ("use_dora: {name!r} is a QLinear (a quantized base); gputrain refuses DoRA on a "
                   "quantized base, whose norms would need the dequantized weight; use use_dora=False, or load "
                   "the model without quantization")
_MERGE_QUANTIZED = ("merge_and_unload: {name!r} has a QLinear (quantized) base; gputrain refuses to merge into it: "
                    "W + scaling B A would be rounded back to its 4 or 8 bits, and that rounding (PEFT warns of "
                    "it) loses most of the adapter's small update. Save the adapter (save_pretrained), load the "
                    "base without quantization and merge there (PeftModel.from_pretrained(...).merge_and_unload())")


def _dora_norm(weight: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """PEFT's get_weight_norm: ||W + scaling B A|| per output row, float32."""
    return np.linalg.norm((weight + delta).astype(np.float32), axis=1).astype(np.float32)


class LoraLinear(Module):
    """PEFT's lora.Linear around a frozen ``base_layer`` Linear or QLinear (QLoRA; no DoRA on it):
    ``lora_A.default`` (r, in) and ``lora_B.default`` (out, r) Linear layers without bias, run as
    the C kind ``lora``; with use_dora, ``lora_magnitude_vector.default`` (out,) too, starting as the
    row norms of W + scaling B A."""

    def __init__(self, base_layer: Linear | QLinear, r: int, lora_alpha: float, lora_dropout: float = 0.0,
                 use_rslora: bool = False, init_lora_weights: bool | str = True, use_dora: bool = False) -> None:
        super().__init__()
        if type(base_layer) not in (Linear, QLinear):
            raise TypeError(f"LoraLinear wraps a gputrain.nn.Linear or QLinear, not {type(base_layer).__name__}")
        config = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, use_rslora=use_rslora,
                            init_lora_weights=init_lora_weights, use_dora=use_dora)
        if config.use_dora and isinstance(base_layer, QLinear) and not base_layer.is_half:
            raise NotImplementedError(_DORA_QUANTIZED.format(name="base_layer"))
        self.use_dora = config.use_dora
        self.r, self.lora_alpha, self.scaling = config.r, config.lora_alpha, config.scaling
        self.lora_dropout = config.lora_dropout
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        a, b = Linear(self.in_features, self.r, bias=False), Linear(self.r, self.out_features, bias=False)
        if planning_active():  # a model built for planning holds no values to initialise
            pass
        elif init_lora_weights is True:  # A keeps nn.Linear's kaiming-uniform (a=sqrt(5)): U(+-1/sqrt(in))
            b.weight.data = np.zeros_like(b.weight.data)
        elif init_lora_weights == "gaussian":
            rng = np.random.default_rng(random.next_seed())
            a.weight.data = rng.normal(0.0, 1.0 / self.r, a.weight.data.shape).astype(np.float32)
            b.weight.data = np.zeros_like(b.weight.data)
        self.base_layer = base_layer
        self.lora_A, self.lora_B = _AdapterDict(a), _AdapterDict(b)
        self.lora_magnitude_vector = None
        if self.use_dora:
            magnitude = _Magnitude(self.out_features)
            magnitude.weight.data = _dora_norm(self.base_weight(), self.delta_weight())
            self.lora_magnitude_vector = _AdapterDict(magnitude)
        for p in base_layer._params.values():
            p.requires_grad = False

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "base_layer", self.base_layer
        yield "lora_A", self.lora_A
        yield "lora_B", self.lora_B
        if self.lora_magnitude_vector is not None:
            yield "lora_magnitude_vector", self.lora_magnitude_vector

    def _check_frozen(self) -> None:
        """The C kind never computes the base's gradients: a trainable base parameter is refused."""
        for local, p in self.base_layer._params.items():
            if p.requires_grad:
                name = p.name or f"base_layer.{local}"
                raise ValueError(f"{name}: the base layer of a LoRA Linear is frozen (its gradient is never "
                                 "computed); set its requires_grad to False, or merge_and_unload() to train it")

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        self._check_frozen()
        children = [self.base_layer._spec_in(tied), self.lora_A._spec_in(tied), self.lora_B._spec_in(tied)]
        if self.lora_magnitude_vector is not None:
            children.append(self.lora_magnitude_vector._spec_in(tied))
        return ("lora", self.r, float(self.scaling), float(self.lora_dropout), self.use_dora, children)

    def base_weight(self) -> np.ndarray:
        """The base weight W (out, in) in float32 (a half base's values exactly)."""
        if isinstance(self.base_layer, QLinear):
            return self.base_layer.dequantize()
        return self.base_layer.weight.data

    def delta_weight(self) -> np.ndarray:
        """scaling * B @ A (out, in) in float32, PEFT's get_delta_weight."""
        a, b = self.lora_A.default.weight.data, self.lora_B.default.weight.data
        return (b @ a) * np.float32(self.scaling)

    def merged_weight(self) -> np.ndarray:
        """The base weight with the adapter merged (PEFT's merge): W + scaling B A, and for DoRA
        (m / n)[:, None] * (W + scaling B A) with n the row norms of W + scaling B A."""
        weight, delta = self.base_weight(), self.delta_weight()
        if not self.use_dora:
            return weight + delta
        factor = self.lora_magnitude_vector.default.weight.data / _dora_norm(weight, delta)
        return factor[:, None] * (weight + delta)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, r={self.r}, "
                f"lora_alpha={self.lora_alpha}, scaling={self.scaling:g}, lora_dropout={self.lora_dropout}"
                + (", use_dora=True" if self.use_dora else ""))


def _other_frozen_layers(model: Module, config: LoraConfig, targets: list[tuple[str, Linear | QLinear]]
                         ) -> list[tuple[str, Linear | TokenEmbedding]]:
    """(name, layer) of the untied Linear and TokenEmbedding layers the adapter leaves frozen and does
    not adapt (an untied LM head, the token embedding, tied or not; the projections a narrower
    target_modules skips): not the targets, nothing in modules_to_save (nor a table a saved
    TiedLinear reads)."""
    skipped = {id(m) for _, m in targets}
    saved = [m for _, module in _saved_modules(model, config) for m in module.modules()]
    skipped |= {id(m) for m in saved}
    skipped |= {id(m.embedding) for m in saved if isinstance(m, TiedLinear)}
    return [(n, m) for n, m in model.named_modules()
            if type(m) in (Linear, TokenEmbedding) and id(m) not in skipped]


def _half_layer(layer: Linear | TokenEmbedding, half: str) -> QLinear | HalfTokenEmbedding:
    """A frozen layer of a bf16/f16 model (a LoRA base, or a layer the adapter leaves frozen) with its
    weight in `half` alone: no float32 master copy, the values the model's half copy held (rounded to
    nearest even); a Linear's bias copied. Built without moving the seed sequence."""
    with random.sequence_kept():
        if type(layer) is Linear:
            return QLinear.from_linear(layer, half)
        return HalfTokenEmbedding.from_token_embedding(layer, half)


def _unloaded_base(base: Linear | QLinear) -> Linear:
    """The Linear a merged LoRA layer leaves: its base, or for a half base a Linear of its shape
    (merge_and_unload writes the merged weight; the bias is copied)."""
    if isinstance(base, Linear):
        return base
    with random.sequence_kept():
        linear = Linear(base.in_features, base.out_features, bias=base.has_bias)
    if base.has_bias:
        linear.bias.data = base.bias.data.copy()
    return linear


def _swapped(value: Any, old: Module, new: Module) -> Any:
    """`value` with `old` replaced by `new`: the value itself, a list's or dict's items in place, a
    tuple rebuilt (nested ones too)."""
    if value is old:
        return new
    if isinstance(value, list):
        value[:] = [_swapped(item, old, new) for item in value]
    elif isinstance(value, dict):
        for key, item in value.items():
            value[key] = _swapped(item, old, new)
    elif isinstance(value, tuple):
        items = tuple(_swapped(item, old, new) for item in value)
        if any(a is not b for a, b in zip(items, value)):
            return items
    return value


def _is_module(root: Module, name: str) -> bool:
    try:
        root.get_submodule(name)
    except AttributeError:
        return False
    return True


def _replace(root: Module, name: str, new: Module) -> None:
    """Puts `new` in the place of the submodule `name` of `root`, wherever a module of the tree
    refers to it: models hold a layer in more than one structure (an attribute their spec reads
    and the tree their named_children walk: the encoders' self.q and attention.self.query)."""
    old = root.get_submodule(name)
    for module in list(root.modules()):
        for attr, value in list(vars(module).items()):
            if attr in ("_owner", "_compiled", "_params", "_buffer_values"):
                continue
            swapped = _swapped(value, old, new)
            if swapped is not value:
                setattr(module, attr, swapped)


def _matches(config: LoraConfig, name: str) -> bool:
    """PEFT's check_target_module_exists: a regular expression matches the whole name; a list entry
    equals the name or its last dotted parts."""
    targets = config.target_modules
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _model_type(model: Module) -> str | None:
    values = getattr(model, "hf_values", None)
    if isinstance(values, dict):
        return values.get("model_type")
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) if config is not None else None


def _targets(model: Module, config: LoraConfig) -> list[tuple[str, Linear | QLinear]]:
    """The (name, Linear or QLinear) pairs the config targets, checked (nothing is changed):
    ValueError for targets that match nothing (naming the patterns) or a matched module that is not
    a Linear or QLinear; NotImplementedError for use_dora on a QLinear."""
    targets = config.target_modules
    if targets is None:
        kind = _model_type(model)
        if kind not in DEFAULT_TARGETS:
            raise ValueError("target_modules: give the modules to adapt (no default is known for "
                             f"{type(model).__name__})")
        config.target_modules = targets = list(DEFAULT_TARGETS[kind])
    modules = list(model.named_modules())
    for name, module in modules:
        if isinstance(module, LoraLinear):
            raise ValueError(f"get_peft_model: the model already has a LoRA adapter ({name!r}); gputrain "
                             "holds one adapter per model")
    if targets == "all-linear":
        found = [(n, m) for n, m in modules if isinstance(m, (Linear, QLinear)) and
                 n.rpartition(".")[2] not in OUTPUT_LAYERS]
    else:
        found = [(n, m) for n, m in modules if n and _matches(config, n)]
    for n, m in found:
        if isinstance(m, QLinear) and not m.is_half and config.use_dora:
            raise NotImplementedError(_DORA_QUANTIZED.format(name=n))
        if type(m) not in (Linear, QLinear):
            raise ValueError(f"target_modules: {n!r} is a {type(m).__name__}; gputrain puts LoRA on Linear "
                             "(or QLinear) layers only")
    if targets == "all-linear":
        config.target_modules = sorted(n for n, _ in found)  # PEFT saves the names it found
    if not found:
        raise ValueError(f"target_modules {targets!r} matched no module of {type(model).__name__}; its Linear "
                         f"layers are named like {[n for n, m in modules if type(m) is Linear][:4]}")
    for n in config.modules_to_save or ():
        if not _is_module(model, n) and not any(name.endswith("." + n) for name, _ in modules):
            raise ValueError(f"modules_to_save: {n!r} names no module of {type(model).__name__}")
    return found


def _saved_modules(model: Module, config: LoraConfig) -> list[tuple[str, Module]]:
    """(name, module) of the modules_to_save (PEFT: the full name or its last parts)."""
    wanted = config.modules_to_save or []
    return [(n, m) for n, m in model.named_modules() if n and any(n == w or n.endswith("." + w) for w in wanted)]


class _LoraModel(Module):
    """PEFT's LoraModel: its one child, ``model``, is the adapted model."""

    def __init__(self, model: Module) -> None:
        super().__init__()
        self.model = model

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "model", self.model


class PeftModel(Module):
    """A model with a LoRA adapter (PEFT's PeftModel): ``base_model.model`` is the adapted model,
    whose attributes (``shift_labels``, ``config``, ...) are reached through this one. Called as
    the adapted model is; trains with TrainStep/Trainer like any model (only parameters with
    requires_grad train)."""

    def __init__(self, model: Module, config: LoraConfig,
                 _targets_found: list[tuple[str, Linear | QLinear]] | None = None) -> None:
        super().__init__()
        if not isinstance(model, Module):
            raise TypeError(f"model must be a gputrain.nn.Module, not {type(model).__name__}")
        if model._owner is not None:
            raise ValueError("model: a submodule of a compiled model; adapt the whole model")
        found = _targets(model, config) if _targets_found is None else _targets_found
        old = model._compiled.model if model._compiled is not None else None
        frozen = {id(p): p.requires_grad for _, linear in found for p in linear._params.values()}
        replaced: list[tuple[str, Module]] = []
        self.peft_config = {ADAPTER: config}
        self.active_adapter = ADAPTER
        self.base_model = _LoraModel(model)
        training = model.training
        half = old.precision if old is not None and old.precision in HALF_TYPES else None
        others = _other_frozen_layers(model, config, found) if half else []
        try:
            for name, layer in others:
                _replace(model, name, _half_layer(layer, half))
                replaced.append((name, layer))
            for name, linear in found:
                base = _half_layer(linear, half) if half and type(linear) is Linear else linear
                _replace(model, name, LoraLinear(base, config.r, config.lora_alpha, config.lora_dropout,
                                                 config.use_rslora, config.init_lora_weights, config.use_dora))
                replaced.append((name, linear))
            if old is not None:
                self._compile(old.device, seed=old.seed, precision=old.precision)
                self._compiled.model.step, self._compiled.model.checkpointing = old.step, old.checkpointing
            else:
                self._compile()
        except BaseException:  # e.g. out of memory: the model is left as it was (compiling touches no module first)
            for name, layer in reversed(replaced):
                _replace(model, name, layer)
                for p in layer._params.values():
                    p.requires_grad = frozen.get(id(p), p.requires_grad)  # a target's, as it was
            raise
        self.train(training)
        keep = {id(m.default) for m in self.modules() if isinstance(m, _AdapterDict)}
        for _, saved in _saved_modules(model, config):
            keep.update(id(m) for m in saved.modules())
        for m in self.modules():  # PEFT's rule: the adapters and modules_to_save train, nothing else
            for p in m._params.values():
                p.requires_grad = id(m) in keep

    # -- structure -------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "base_model", self.base_model

    def _spec_list(self, tied: dict[int, int] | None = None) -> list[tuple]:
        return self.base_model.model._spec_list(tied)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self.__dict__.get("base_model")
            if base is None:
                raise
            return getattr(base.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """The adapted model's outputs, called with the adapted model's arguments."""
        model = self.base_model.model
        signature = inspect.signature(type(model).__call__)
        bound = signature.bind(None, *args, **kwargs).arguments
        x = bound.get("input_ids", bound.get("x"))
        mask, types = bound.get("attention_mask"), bound.get("token_type_ids")
        pack = getattr(model, "pack", None)  # an encoder's rows (its defaults for the mask and types)
        if pack is not None and not (np.ndim(x) == 3 and mask is None and types is None):
            return self.compiled.forward(pack(x, mask, types))
        return Module.__call__(self, x, mask, types, bound.get("position_ids"))

    def _check_trainable(self) -> None:
        """Refuses a trainable base parameter of a LoRA layer (its gradient is never computed)."""
        for m in self.modules():
            if isinstance(m, LoraLinear):
                m._check_frozen()

    # -- PEFT's methods --------------------------------------------------------------------
    def get_nb_trainable_parameters(self) -> tuple[int, int]:
        """(trainable, all) parameter counts; as PEFT, `all` counts a modules_to_save module twice
        (PEFT keeps its original beside the trained copy) and a QLinear's stored weight as its
        out * in elements (PEFT's count of a bitsandbytes Params4bit, two a packed byte, and of a
        bf16 base), a frozen token table's (HalfTokenEmbedding, QTokenEmbedding) as its elements."""
        trainable = total = 0
        saved = {id(p) for _, m in _saved_modules(self.base_model.model, self.peft_config[ADAPTER])
                 for p in m.parameters()}
        for p in self.parameters():
            count = p.numel()
            total += count * (2 if id(p) in saved else 1)
            trainable += count if p.requires_grad else 0
        total += sum(m.in_features * m.out_features for m in self.modules() if isinstance(m, QLinear))
        total += sum((m.num_embeddings + m.type_vocab_size) * m.embedding_dim for m in self.modules()
                     if isinstance(m, FrozenTokenEmbedding))
        return trainable, total

    def print_trainable_parameters(self) -> None:
        """PEFT's line: trainable params: ... || all params: ... || trainable%: ..."""
        trainable, total = self.get_nb_trainable_parameters()
        print(f"trainable params: {trainable:,d} || all params: {total:,d} || trainable%: {100 * trainable / total:.4f}")

    def lora_layers(self) -> Iterator[tuple[str, LoraLinear]]:
        """(name in the adapted model, LoraLinear) of every adapted layer."""
        for name, module in self.base_model.model.named_modules():
            if isinstance(module, LoraLinear):
                yield name, module

    def adapter_state_dict(self) -> dict[str, np.ndarray]:
        """The adapter's tensors under PEFT's file keys (float32 copies)."""
        state = self.state_dict()
        out: dict[str, np.ndarray] = {}
        for name, layer in self.lora_layers():
            for part in ("lora_A", "lora_B"):
                out[f"{PREFIX}{name}.{part}.weight"] = state[f"{PREFIX}{name}.{part}.{ADAPTER}.weight"]
            if layer.use_dora:  # PEFT's file key has no ".weight"
                out[f"{PREFIX}{name}.lora_magnitude_vector"] = state[f"{PREFIX}{name}.lora_magnitude_vector.{ADAPTER}.weight"]
        for name, module in _saved_modules(self.base_model.model, self.peft_config[ADAPTER]):
            for local in module._param_names:
                if module._has_param(local):
                    out[f"{PREFIX}{name}.{local}"] = state[f"{PREFIX}{name}.{local}"]
        return out

    def adapter_files(self) -> dict[str, bytes]:
        """The bytes of PEFT's two adapter files, {adapter_model.safetensors: float32 tensors under
        PEFT's keys, adapter_config.json: the config as PEFT writes it}: what save_pretrained writes
        (and the Trainer's checkpoints, through its hashing writers)."""
        import safetensors.numpy

        tensors = {k: np.ascontiguousarray(v) for k, v in self.adapter_state_dict().items()}
        config = self.peft_config[ADAPTER].to_dict()
        config["inference_mode"] = True  # as PEFT writes it
        return {WEIGHTS_NAME: safetensors.numpy.save(tensors, metadata={"format": "pt"}),
                CONFIG_NAME: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")}

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """PEFT's adapter folder: adapter_config.json and adapter_model.safetensors (float32), each
        written to a temporary name and renamed."""
        folder = os.fspath(save_directory)
        os.makedirs(folder, exist_ok=True)
        for name, data in self.adapter_files().items():
            tmp = os.path.join(folder, name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(folder, name))

    def merge_and_unload(self) -> Module:
        """The adapted model with every adapter merged into its base (W + scaling B A, float32,
        PEFT's merge) and the LoRA layers replaced by their base Linear (a half base becomes a
        Linear with float32 master weights: its values, exactly, plus the adapter's delta); the
        model is compiled on its own again (same device, precision, seed and step). This PeftModel
        is left unusable. A quantized (4- or 8-bit QLinear) base is refused with nothing changed
        (see _MERGE_QUANTIZED's message)."""
        model = self.base_model.model
        layers = list(self.lora_layers())
        for name, lora in layers:
            if isinstance(lora.base_layer, QLinear) and not lora.base_layer.is_half:
                raise ValueError(_MERGE_QUANTIZED.format(name=name))
        merged = {name: lora.merged_weight() for name, lora in layers}
        old = self._compiled.model
        for name, lora in layers:
            _replace(model, name, _unloaded_base(lora.base_layer))
        model._compile(old.device, seed=old.seed, precision=old.precision)
        model._compiled.model.step, model._compiled.model.checkpointing = old.step, old.checkpointing
        model.load_state_dict({f"{name}.weight": value for name, value in merged.items()}, strict=False)
        model.train(self.training)
        self.__dict__["base_model"] = None
        return model

    @classmethod
    def from_pretrained(cls, model: Module, model_id: str | os.PathLike, adapter_name: str = ADAPTER,
                        is_trainable: bool = False, **kwargs: Any) -> PeftModel:
        """`model` with the adapter of folder `model_id` (PEFT's files). Frozen and in eval mode
        unless is_trainable (then exactly PEFT's parameters train: the adapter and modules_to_save).
        Everything is read and checked before the model changes: ValueError naming the file and key
        for a tensor of another shape (an adapter for another base), a missing or unexpected key, a
        config field gputrain does not implement; FileNotFoundError for a missing file."""
        if adapter_name != ADAPTER:
            raise ValueError(f"adapter_name={adapter_name!r}: gputrain holds one adapter, named 'default'")
        if kwargs:
            raise TypeError(f"from_pretrained() got unexpected arguments {sorted(kwargs)}")
        if not isinstance(is_trainable, bool):
            raise TypeError(f"is_trainable must be a bool, not {type(is_trainable).__name__}")
        folder = os.fspath(model_id)
        config_path, weights_path = os.path.join(folder, CONFIG_NAME), os.path.join(folder, WEIGHTS_NAME)
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"{config_path}: no adapter config (PEFT's adapter_config.json)")
        with open(config_path) as f:
            try:
                values = json.load(f)
            except json.JSONDecodeError as error:
                raise ValueError(f"{config_path}: not JSON ({error})") from None
        config = LoraConfig.from_dict(values, config_path)
        config.inference_mode = not is_trainable
        found = _targets(model, config)
        refs = read_header(weights_path)
        expected = {}
        for name, linear in found:
            expected[f"{PREFIX}{name}.lora_A.weight"] = (config.r, linear.in_features)
            expected[f"{PREFIX}{name}.lora_B.weight"] = (linear.out_features, config.r)
            if config.use_dora:
                expected[f"{PREFIX}{name}.lora_magnitude_vector"] = (linear.out_features,)
        for name, module in _saved_modules(model, config):
            for local in module._param_names:
                if module._has_param(local):
                    expected[f"{PREFIX}{name}.{local}"] = tuple(getattr(module, local).data.shape)
        for key, ref in refs.items():
            if key not in expected:
                raise ValueError(f"{weights_path}: tensor {key!r} is not part of this adapter on "
                                 f"{type(model).__name__} (an adapter for another model?)")
            if tuple(ref.shape) != expected[key]:
                raise ValueError(f"{weights_path}: tensor {key!r} has shape {tuple(ref.shape)}, but this model needs "
                                 f"{expected[key]} (an adapter for another base model)")
        missing = sorted(set(expected) - set(refs))
        if missing:
            raise ValueError(f"{weights_path}: misses {len(missing)} tensors of the adapter, e.g. {missing[0]!r}")
        tensors = {key: read_tensor(ref) for key, ref in refs.items()}
        for key, value in tensors.items():
            if not np.all(np.isfinite(value)):
                raise ValueError(f"{weights_path}: tensor {key!r} holds NaN or infinite values")
        peft = cls(model, config, _targets_found=found)
        state = {_internal_key(key): value for key, value in tensors.items()}
        peft.load_state_dict(state, strict=False)
        if not is_trainable:
            for p in peft.parameters():
                p.requires_grad = False
            peft.eval()
        return peft


def _internal_key(key: str) -> str:
    """A file key -> the parameter's name in the model (PEFT's state_dict, adapter "default")."""
    for part in ("lora_A", "lora_B"):
        if key.endswith(f".{part}.weight"):
            return key.removesuffix(f".{part}.weight") + f".{part}.{ADAPTER}.weight"
    if key.endswith(".lora_magnitude_vector"):
        return key + f".{ADAPTER}.weight"
    return key


def get_peft_model(model: Module, peft_config: LoraConfig) -> PeftModel:
    """`model` with LoRA adapters on the Linear layers `peft_config` targets (PEFT's
    get_peft_model): everything but the adapters and modules_to_save is frozen. The targets are
    checked before anything changes (ValueError naming the patterns when they match nothing)."""
    if not isinstance(peft_config, LoraConfig):
        raise TypeError(f"peft_config must be a gputrain.peft.LoraConfig, not {type(peft_config).__name__}")
    return PeftModel(model, peft_config)
