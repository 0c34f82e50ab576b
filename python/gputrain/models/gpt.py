"""GPT-2 as one gputrain model: token and learned position embeddings, n_layer pre-LayerNorm
blocks (causal multi-head attention and a GELU-tanh MLP, each in a Residual), a final LayerNorm
and an LM head tied to the token embedding; GPT-2's initialisation (nanoGPT's: N(0, 0.02), the
residual projections N(0, 0.02 / sqrt(2 n_layer)), LayerNorms 1 and 0, biases 0).

Weights load from and save to Hugging Face's GPT-2 names (``transformer.h.0.attn.c_attn.weight``,
...): their Conv1D layers store (in, out) matrices, the transpose of a Linear's (out, in).
``GPT.from_hf_state_dict`` takes a dict of NumPy arrays (e.g. ``safetensors.numpy.load_file(path)``
or ``{k: v.numpy() for k, v in torch_model.state_dict().items()}``) or, when the ``safetensors``
package is installed, the path of a ``.safetensors`` file.

``generate`` samples with a key/value cache, one new token per step reusing every earlier
position's keys and values: float32, over a copy of the model's parameters, with gputrain's C ops
(gputrain.functional: GEMMs, LayerNorm, GELU) and the attention against the cache in NumPy."""

from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gputrain import functional as F
from gputrain import random
from gputrain.nn.embedding import PositionEmbedding, TiedLinear
from gputrain.nn.layers import Embedding, LayerNorm, Linear, MultiheadAttention
from gputrain.nn.module import Module

_HF_BUFFERS = re.compile(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$")


@dataclass(frozen=True)
class GPTConfig:
    """GPT-2's sizes (defaults: GPT-2 small, 124M parameters)."""

    vocab_size: int = 50257
    block_size: int = 1024  # the longest sequence (rows of the position table)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0  # on the embeddings, the attention probabilities and both residual branches
    bias: bool = True  # biases in the Linears and LayerNorms (GPT-2 has them)
    n_inner: int | None = None  # the MLP's hidden width (None: 4 n_embd)
    activation: str = "gelu_tanh"  # the MLP's: one of ACTIVATIONS (GPT-2: GELU, tanh approximation)
    layer_norm_eps: float = 1e-5  # every LayerNorm's epsilon
    tie_word_embeddings: bool = True  # the LM head is the token embedding (else its own (vocab, n_embd) Linear)


ACTIVATIONS = ("gelu_tanh", "gelu", "relu", "silu", "tanh")  # the MLP activations (gputrain's C names)


class MLP(Module):
    """GPT-2's feed-forward: c_fc (n_embd -> n_inner, default 4 n_embd), the activation (GPT-2:
    GELU, tanh approximation), c_proj."""

    def __init__(self, n_embd: int, bias: bool, n_inner: int | None = None, activation: str = "gelu_tanh") -> None:
        super().__init__()
        n_inner = 4 * n_embd if n_inner is None else n_inner
        self.activation = activation
        self.c_fc = Linear(n_embd, n_inner, bias)
        self.c_proj = Linear(n_inner, n_embd, bias)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("c_fc", self.c_fc), ("c_proj", self.c_proj)))

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        return [self.c_fc._spec_in(tied), ("activation", self.activation), self.c_proj._spec_in(tied)]

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("sequential", self._layers(tied))


class Block(Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)), each branch followed by dropout. With gradient
    checkpointing, each of the two residual branches keeps only its input."""

    attention_class: type[MultiheadAttention] = MultiheadAttention  # a subclass may rename its children

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.dropout = config.dropout
        eps = config.layer_norm_eps
        self.ln_1 = LayerNorm(config.n_embd, eps=eps, bias=config.bias)
        self.attn = self.attention_class(config.n_embd, config.n_head, bias=config.bias,
                                         dropout=config.dropout, causal=True)
        self.ln_2 = LayerNorm(config.n_embd, eps=eps, bias=config.bias)
        self.mlp = MLP(config.n_embd, config.bias, config.n_inner, config.activation)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("ln_1", self.ln_1), ("attn", self.attn), ("ln_2", self.ln_2), ("mlp", self.mlp)))

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        drop = [("dropout", self.dropout)] if self.dropout > 0 else []
        attention = [self.ln_1._spec_in(tied), self.attn._spec_in(tied), *drop]
        mlp = [self.ln_2._spec_in(tied), *self.mlp._layers(tied), *drop]
        return ("sequential", [("residual", attention), ("residual", mlp)])


def _config_from(config: GPTConfig | None, overrides: dict[str, Any]) -> GPTConfig:
    if config is not None and not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, not {type(config).__name__}")
    fields = asdict(config or GPTConfig())
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"GPT: unexpected argument(s) {', '.join(unknown)}; the sizes are {', '.join(fields)}")
    fields.update(overrides)
    for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_inner"):
        value = fields[name]
        if name == "n_inner" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if fields["n_embd"] % fields["n_head"]:
        raise ValueError(f"n_embd must be divisible by n_head, got {fields['n_embd']} and {fields['n_head']}")
    dropout = fields["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    fields["dropout"], fields["bias"] = float(dropout), bool(fields["bias"])
    if fields["activation"] not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {fields['activation']!r}")
    eps = fields["layer_norm_eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < math.inf:
        raise ValueError(f"layer_norm_eps must be a positive float, got {eps!r}")
    fields["layer_norm_eps"], fields["tie_word_embeddings"] = float(eps), bool(fields["tie_word_embeddings"])
    return GPTConfig(**fields)


class GPT(Module):
    """GPT-2: ``GPT(GPTConfig(...))`` or ``GPT(vocab_size=..., block_size=..., n_layer=...,
    n_head=..., n_embd=..., dropout=..., bias=..., n_inner=..., activation=...,
    layer_norm_eps=..., tie_word_embeddings=...)``.

    Input: int64 token ids (batch, T) with T <= block_size; output: logits (batch, T,
    vocab_size). Train it with ``gputrain.nn.CrossEntropyLoss()`` on targets (batch, T) (the
    ids shifted by one). state_dict names: ``wte.weight``, ``wpe.weight``,
    ``h.{i}.ln_1.weight``, ``h.{i}.attn.in_proj.weight`` (3 n_embd, n_embd), ...,
    ``ln_f.weight``; the LM head is ``wte.weight`` (tied), listed once, or ``lm_head.weight``
    with tie_word_embeddings=False. (``gputrain.models.GPT2LMHeadModel`` is this model under
    Hugging Face's names.)"""

    block_class: type[Block] = Block  # a subclass may rename the blocks' children

    def __init__(self, config: GPTConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config = _config_from(config, overrides)
        c = self.config
        self.wte = Embedding(c.vocab_size, c.n_embd)
        self.wpe = PositionEmbedding(c.block_size, c.n_embd)
        self.h = [self.block_class(c) for _ in range(c.n_layer)]
        self.ln_f = LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias)
        self.lm_head = TiedLinear(self.wte) if c.tie_word_embeddings else Linear(c.n_embd, c.vocab_size, bias=False)
        self._compile()
        self._init_gpt2(random.next_seed())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "wte", self.wte
        yield "wpe", self.wpe
        for i, block in enumerate(self.h):
            yield f"h.{i}", block
        yield "ln_f", self.ln_f
        yield "lm_head", self.lm_head

    def _spec_list(self, tied: dict[int, int] | None = None) -> list[tuple]:
        tied = {} if tied is None else tied
        drop = [("dropout", self.config.dropout)] if self.config.dropout > 0 else []
        return [self.wte._spec_in(tied), self.wpe._spec_in(tied), *drop,
                *(block._spec_in(tied) for block in self.h), self.ln_f._spec_in(tied),
                self.lm_head._spec_in(tied)]

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("sequential", self._spec_list(tied))

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.config).items())

    def _init_gpt2(self, seed: int) -> None:
        """GPT-2's initialisation, drawn from NumPy's generator seeded with `seed`."""
        rng = np.random.default_rng(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        values = OrderedDict()
        for name, value in self.state_dict().items():
            if name.endswith("bias"):
                values[name] = np.zeros_like(value)
            elif ".ln_" in name or name.startswith("ln_f"):
                values[name] = np.ones_like(value)
            else:
                std = residual_std if name.endswith(("out_proj.weight", "c_proj.weight")) else 0.02
                values[name] = rng.normal(0.0, std, value.shape).astype(np.float32)
        self.load_state_dict(values)

    # -- Hugging Face GPT-2 weights --------------------------------------------------------
    def _hf_names(self) -> list[tuple[str, str, bool]]:
        """(own name, Hugging Face name, transposed) for every parameter."""
        names = [("wte.weight", "transformer.wte.weight", False), ("wpe.weight", "transformer.wpe.weight", False)]
        kinds = ("weight", "bias") if self.config.bias else ("weight",)
        for i in range(self.config.n_layer):
            parts = [("ln_1", "ln_1", False), ("attn.in_proj", "attn.c_attn", True),
                     ("attn.out_proj", "attn.c_proj", True), ("ln_2", "ln_2", False),
                     ("mlp.c_fc", "mlp.c_fc", True), ("mlp.c_proj", "mlp.c_proj", True)]
            for own, hf, conv in parts:
                names.extend((f"h.{i}.{own}.{k}", f"transformer.h.{i}.{hf}.{k}", conv and k == "weight")
                             for k in kinds)
        names.extend((f"ln_f.{k}", f"transformer.ln_f.{k}", False) for k in kinds)
        if not self.config.tie_word_embeddings:
            names.append(("lm_head.weight", "lm_head.weight", False))
        return names

    def _gpt_state(self) -> dict[str, np.ndarray]:
        """Copies of the parameters under GPT's own names and layouts (what generate's cache reads)."""
        return dict(self.state_dict())

    def to_hf_state_dict(self) -> OrderedDict[str, np.ndarray]:
        """Copies of the weights under Hugging Face's GPT-2 names (GPT2LMHeadModel's state_dict
        without its attention-mask buffers), Conv1D weights transposed to (in, out);
        ``lm_head.weight`` is a copy of ``transformer.wte.weight`` (tied)."""
        own = self.state_dict()
        out = OrderedDict((hf, np.ascontiguousarray(own[name].T) if conv else own[name])
                          for name, hf, conv in self._hf_names())
        if self.config.tie_word_embeddings:
            out["lm_head.weight"] = own["wte.weight"].copy()
        return out

    @classmethod
    def from_hf_state_dict(cls, state: Mapping[str, Any] | str | os.PathLike, n_head: int | None = None,
                           dropout: float = 0.0, block_size: int | None = None) -> GPT:
        """A GPT holding Hugging Face GPT-2 weights: a mapping of arrays (NumPy, or anything
        np.asarray takes) under GPT2LMHeadModel's names (``transformer.wte.weight``, ...) or
        GPT2Model's (without ``transformer.``), or the path of a ``.safetensors`` file (needs the
        ``safetensors`` package; without it, load the file yourself into a dict of NumPy arrays).
        The sizes are read from the shapes; ``n_head`` cannot be, and is required (ValueError
        naming it otherwise: a guess builds a model whose logits are silently wrong). The rest of
        GPT-2's configuration is assumed at its defaults (GELU tanh, LayerNorm epsilon 1e-5):
        ``gputrain.models.from_pretrained(folder)`` reads a checkpoint folder's config.json
        instead. ``attn.bias``/``attn.masked_bias`` buffers are ignored; a ``lm_head.weight``
        that differs from the token embedding gives an untied head (tie_word_embeddings=False). A
        missing, unexpected or mis-shaped entry raises KeyError/ValueError naming it.
        ``block_size`` may crop the position table (to train on shorter sequences)."""
        if n_head is None:
            raise ValueError("n_head: required (a state dict does not say how many heads the attention has; "
                             "gputrain.models.from_pretrained(folder) reads it from config.json)")
        state = _load_hf(state)
        wte = _hf_array(state, "transformer.wte.weight", 2)
        wpe = _hf_array(state, "transformer.wpe.weight", 2)
        n_layer = len({int(m.group(1)) for k in state if (m := re.match(r"transformer\.h\.(\d+)\.", k))})
        n_embd = wte.shape[1]
        block_size = wpe.shape[0] if block_size is None else block_size
        if isinstance(block_size, bool) or not isinstance(block_size, int) or not 0 < block_size <= wpe.shape[0]:
            raise ValueError(f"block_size must be an int in [1, {wpe.shape[0]}] (the rows of "
                             f"transformer.wpe.weight), got {block_size!r}")
        c_fc = "transformer.h.0.mlp.c_fc.weight"
        n_inner = _hf_array(state, c_fc, 2).shape[1] if c_fc in state else None
        n_inner = None if n_inner == 4 * n_embd else n_inner  # GPT-2's default width
        tied = "lm_head.weight" not in state or np.array_equal(_hf_array(state, "lm_head.weight", 2), wte)
        config = _config_from(None, dict(
            vocab_size=wte.shape[0], block_size=block_size, n_layer=max(n_layer, 1),
            n_head=n_head, n_embd=n_embd, dropout=dropout, n_inner=n_inner,
            bias="transformer.ln_f.bias" in state, tie_word_embeddings=tied))
        model = cls(config)
        model.load_hf_state_dict(state)
        return model

    def load_hf_state_dict(self, state: Mapping[str, Any] | str | os.PathLike) -> None:
        """Copies Hugging Face GPT-2 weights in (see from_hf_state_dict); every entry is checked
        before any is copied, so a bad one changes nothing."""
        state = _load_hf(state)
        own = self.state_dict()
        expected = {hf for _, hf, _ in self._hf_names()}
        extra = sorted(set(state) - expected - {"lm_head.weight"})  # lm_head.weight: in `expected` when untied
        if extra:
            raise KeyError(f"state: unexpected key {extra[0]!r} ({len(extra)} unexpected in all); this "
                           f"GPT has {self.config.n_layer} layers, bias={self.config.bias}")
        values = OrderedDict()
        for name, hf, conv in self._hf_names():
            if hf not in state:
                raise KeyError(f"state: missing key {hf!r}")
            shape = own[name].shape[::-1] if conv else own[name].shape
            if hf == "transformer.wpe.weight":  # a longer table is cropped to block_size rows
                array = _hf_array(state, hf, 2)
                if array.shape[0] >= shape[0] and array.shape[1:] == shape[1:]:
                    array = array[:shape[0]]
            else:
                array = _hf_array(state, hf, len(shape))
            if array.shape != shape:
                raise ValueError(f"state[{hf!r}]: expected shape {shape}, got {array.shape}")
            values[name] = array.T if conv else array
        if "lm_head.weight" in state and self.config.tie_word_embeddings:
            head = _hf_array(state, "lm_head.weight", 2)
            if head.shape != values["wte.weight"].shape or not np.array_equal(head, values["wte.weight"]):
                raise ValueError("state['lm_head.weight']: differs from transformer.wte.weight; GPT ties the "
                                 "LM head to the token embedding")
        self.load_state_dict(values)

    # -- generation ------------------------------------------------------------------------
    def generate(self, tokens: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, seed: int | None = None, use_cache: bool = True, *,
                 do_sample: bool = False) -> np.ndarray:
        """`tokens` ((T,) or (batch, T) int ids) followed by `max_new_tokens` new ones.

        Greedy (the most likely token) unless do_sample=True, as transformers' generate (it
        sampled by default until this release). Sampling draws each new token from
        softmax(logits / temperature) of the last position, kept to the `top_k` largest logits
        when given; temperature 0 or top_k=1 is greedy again.
        The draws come from NumPy's generator seeded with `seed` (None: the next seed of
        gputrain.random's sequence), so a seed gives the same tokens. The context is cropped to the
        last block_size tokens, as nanoGPT's.

        With use_cache (default) it runs over a float32 copy of the model's parameters with a
        key/value cache (gputrain's C ops for the GEMMs, LayerNorms and GELU, NumPy for the
        attention against the cache): the prompt is processed once, then one token per step against the cached
        keys and values (once the context is longer than block_size, the positions shift and the
        cropped window is processed again). Without it, every step runs the model's own forward
        on the whole cropped context (eval mode) -- the full recompute the cache must agree with."""
        ids = _check_tokens(tokens, self.config.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a non-negative float, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0):
            raise ValueError(f"top_k must be None or a positive int, got {top_k!r}")
        if not isinstance(do_sample, bool):
            raise TypeError(f"do_sample must be True or False, not {type(do_sample).__name__}")
        temperature = float(temperature) if do_sample else 0.0
        rng = np.random.default_rng(random.next_seed() if seed is None else seed)
        squeeze = ids.ndim == 1
        ids = ids[None] if squeeze else ids
        step = _CachedGPT(self) if use_cache else _Recompute(self)
        for _ in range(max_new_tokens):
            logits = step(ids)
            ids = np.concatenate([ids, _sample(logits, float(temperature), top_k, rng)[:, None]], axis=1)
        return ids[0] if squeeze else ids


def _load_hf(state: Mapping[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """The mapping with GPT2LMHeadModel's names and without the attention-mask buffers."""
    if isinstance(state, (str, os.PathLike)):
        try:
            from safetensors.numpy import load_file
        except ImportError as error:
            raise ImportError("GPT.from_hf_state_dict: reading a .safetensors path needs the 'safetensors' "
                              "package; without it, pass a dict of NumPy arrays (e.g. from torch: "
                              "{k: v.numpy() for k, v in model.state_dict().items()})") from error
        state = load_file(os.fspath(state))
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of arrays or a path, not {type(state).__name__}")
    prefix = "" if any(str(k).startswith("transformer.") for k in state) else "transformer."
    out = {}
    for key, value in state.items():
        name = key if key == "lm_head.weight" else prefix + str(key)
        if not _HF_BUFFERS.match(name):
            out[name] = value
    return out


def _hf_array(state: Mapping[str, Any], key: str, ndim: int) -> np.ndarray:
    if key not in state:
        raise KeyError(f"state: missing key {key!r}")
    try:
        array = np.asarray(state[key], dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise TypeError(f"state[{key!r}]: not an array of numbers ({error})") from None
    if array.ndim != ndim:
        raise ValueError(f"state[{key!r}]: expected {ndim} dimensions, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"state[{key!r}]: holds NaN or infinite values")
    return array


def _check_tokens(tokens: Any, vocab_size: int) -> np.ndarray:
    ids = np.asarray(tokens)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"tokens must be integer ids, not {ids.dtype}")
    if ids.ndim not in (1, 2) or ids.shape[-1] == 0 or ids.size == 0:
        raise ValueError(f"tokens must be (T,) or (batch, T) with T >= 1, got shape {ids.shape}")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"tokens must be in [0, {vocab_size}), got values in [{ids.min()}, {ids.max()}]")
    return ids.astype(np.int64)


def _sample(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> np.ndarray:
    """(batch,) ids drawn from (batch, vocab) logits."""
    if temperature == 0:
        return np.argmax(logits, axis=-1)
    logits = logits.astype(np.float64)
    scaled = (logits - logits.max(axis=-1, keepdims=True)) / temperature  # <= 0: no overflow
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -top_k, axis=-1)[:, -top_k][:, None]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled)
    cdf = np.cumsum(probs / probs.sum(axis=-1, keepdims=True), axis=-1)
    draws = rng.random(len(cdf))
    return np.minimum((cdf < draws[:, None]).sum(axis=-1), cdf.shape[-1] - 1)


class _Recompute:
    """Logits of the last position from the model's own forward on the cropped context."""

    def __init__(self, model: GPT) -> None:
        self.model = model

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        was_training = self.model.training
        self.model.eval()
        try:
            return self.model(ids[:, -self.model.config.block_size:])[:, -1]
        finally:
            self.model.train(was_training)


class _CachedGPT:
    """GPT's forward (float32, eval mode) over a copy of the parameters with a key/value cache per
    layer: the GEMMs, LayerNorms and GELU run as gputrain's C ops (gputrain.functional, in
    gputrain's thread pool), the attention of the new tokens against the cache in NumPy. Call it
    with the whole context each step; only the tokens after the cached ones are processed."""

    def __init__(self, model: GPT) -> None:
        self.config = model.config
        self.p = {k: v.astype(np.float32) for k, v in model._gpt_state().items()}
        self.length = 0  # positions cached
        self.tokens: np.ndarray | None = None  # the context the cache holds
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return F.linear(x, self.p[name + ".weight"], self.p.get(name + ".bias"))

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        weight = self.p[name + ".weight"]
        return F.layer_norm(x, weight, self.p.get(name + ".bias", np.zeros_like(weight)), self.config.layer_norm_eps)[0]

    def _attention(self, x: np.ndarray, i: int, start: int) -> np.ndarray:
        c = self.config
        batch, new, _ = x.shape
        head = c.n_embd // c.n_head
        qkv = self._linear(x, f"h.{i}.attn.in_proj").reshape(batch, new, 3, c.n_head, head)
        q, k, v = (qkv[:, :, j].transpose(0, 2, 1, 3) for j in range(3))  # (B, H, new, D)
        self.keys[i][:, :, start:start + new] = k
        self.values[i][:, :, start:start + new] = v
        keys, values = self.keys[i][:, :, :start + new], self.values[i][:, :, :start + new]
        scores = q @ keys.transpose(0, 1, 3, 2) * np.float32(1.0 / math.sqrt(head))
        visible = np.arange(start + new)[None, :] <= (start + np.arange(new))[:, None]
        scores = np.where(visible, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        y = (probs @ values).transpose(0, 2, 1, 3).reshape(batch, new, c.n_embd)
        return self._linear(y, f"h.{i}.attn.out_proj")

    def _reset(self, batch: int) -> None:
        c = self.config
        shape = (batch, c.n_head, c.block_size, c.n_embd // c.n_head)
        if not self.keys or self.keys[0].shape != shape:
            self.keys = [np.empty(shape, np.float32) for _ in range(c.n_layer)]
            self.values = [np.empty(shape, np.float32) for _ in range(c.n_layer)]
        self.length = 0

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        context = ids[:, -self.config.block_size:]
        cached = self.tokens is not None and len(ids) == len(self.tokens) and \
            ids.shape[1] <= self.config.block_size and np.array_equal(context[:, :self.length], self.tokens)
        if not cached:  # a new prompt, or the window moved: process it whole
            self._reset(len(ids))
        start = self.length
        x = self.p["wte.weight"][context[:, start:]] + self.p["wpe.weight"][start:context.shape[1]]
        for i in range(self.config.n_layer):
            x = x + self._attention(self._ln(x, f"h.{i}.ln_1"), i, start)
            hidden = F.activation(self._linear(self._ln(x, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc"), self.config.activation)
            x = x + self._linear(hidden, f"h.{i}.mlp.c_proj")
        self.length, self.tokens = context.shape[1], context.copy()
        head = "wte.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        return F.linear(self._ln(x[:, -1], "ln_f"), self.p[head])
