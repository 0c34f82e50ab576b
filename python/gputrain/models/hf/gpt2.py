"""The ``gpt2`` family: Hugging Face's GPT2LMHeadModel (and GPT2Model checkpoints) as
:class:`GPT2LMHeadModel`, gputrain's GPT under transformers' names.

config.json fields (GPT2Config), each implemented, refused or irrelevant:

- read: ``vocab_size``, ``n_positions``, ``n_embd``, ``n_layer``, ``n_head``, ``n_inner``
  (null: 4 n_embd), ``activation_function`` (``gelu_new`` and ``gelu_pytorch_tanh``: GELU's
  tanh approximation; ``gelu``: exact; ``relu``, ``silu``/``swish``, ``tanh``),
  ``layer_norm_epsilon``, ``resid_pdrop``/``embd_pdrop``/``attn_pdrop`` (gputrain's GPT has one
  dropout rate: they must be equal), ``tie_word_embeddings``, ``dtype``/``torch_dtype``
  (``from_pretrained(dtype='auto')``).
- accepted only at transformers' default (another value is refused, naming the field):
  ``scale_attn_weights`` (true), ``scale_attn_by_inverse_layer_idx`` (false),
  ``reorder_and_upcast_attn`` (false), ``add_cross_attention`` (false), ``is_encoder_decoder``
  (false), ``pruned_heads`` ({}), ``is_decoder`` (false: GPT-2 is causal either way, but the flag
  asks for cross-attention plumbing).
- irrelevant to the arithmetic: ``n_ctx`` (transformers ignores it), ``summary_type``,
  ``summary_use_proj``, ``summary_activation``, ``summary_proj_to_labels``,
  ``summary_first_dropout`` (GPT2DoubleHeadsModel's head, not built), ``initializer_range``,
  and PretrainedConfig's bookkeeping, token ids and generation defaults (config.GENERIC_IRRELEVANT).

Any other field refuses the checkpoint. ``architectures`` may name GPT2LMHeadModel or GPT2Model;
heads that gputrain does not build (GPT2ForSequenceClassification, GPT2DoubleHeadsModel, ...) are
refused. Tensors: GPT2LMHeadModel's names (``transformer.h.0.attn.c_attn.weight``, ...) or
GPT2Model's (without ``transformer.``); the ``attn.bias``/``attn.masked_bias`` buffers of old
files are skipped, and so is ``lm_head.weight`` when the head is tied (it is the token embedding).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from gputrain.models.gpt import GPT, Block, GPTConfig
from gputrain.models.hf import folder as hf_folder
from gputrain.models.hf.config import HFConfig
from gputrain.nn.layers import MultiheadAttention
from gputrain.nn.module import Module
from gputrain.nn.sequence import check_attention_mask

# activation_function -> gputrain's activation
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "silu": "silu", "swish": "silu", "tanh": "tanh"}
_SAVED_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu", "tanh": "tanh"}
_DEFAULT_ONLY = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                 "reorder_and_upcast_attn": False, "add_cross_attention": False, "is_encoder_decoder": False,
                 "pruned_heads": {}, "is_decoder": False}
_IRRELEVANT = ("n_ctx", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
               "summary_first_dropout", "initializer_range")
_BUFFER = re.compile(r"^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$")


class _Attention(MultiheadAttention):
    """MultiheadAttention whose projections are named as GPT2Attention's: c_attn, c_proj."""

    @property
    def c_attn(self) -> Module:
        return self.in_proj

    @property
    def c_proj(self) -> Module:
        return self.out_proj

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("c_attn", self.in_proj), ("c_proj", self.out_proj)))


class _Block(Block):
    attention_class = _Attention


class _Transformer(Module):
    """GPT2Model's names over the GPT's layers (it holds no layer of its own)."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.wte, self.wpe, self.h, self.ln_f = model.wte, model.wpe, model.h, model.ln_f

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "wte", self.wte
        yield "wpe", self.wpe
        for i, block in enumerate(self.h):
            yield f"h.{i}", block
        yield "ln_f", self.ln_f


class GPT2LMHeadModel(GPT):
    """gputrain's GPT under Hugging Face's GPT2LMHeadModel names: ``state_dict()`` is
    transformers' (``transformer.wte.weight``, ``transformer.h.0.attn.c_attn.weight`` as an
    (in, out) Conv1D matrix, ..., and ``lm_head.weight`` only when untied) and
    ``load_state_dict`` takes it; the Parameters (named_parameters, their .grad) keep gputrain's
    Linear layout (out, in). Call it as ``model(input_ids, attention_mask=None)`` for logits
    (batch, T, vocab_size). Built by ``gputrain.models.from_pretrained`` from a folder, or
    ``GPT2LMHeadModel(GPTConfig(...))``; ``save_pretrained(folder)`` writes a folder
    transformers loads."""

    block_class = _Block

    def named_children(self) -> Iterator[tuple[str, Module]]:
        body = self.__dict__.get("transformer")
        if body is None:
            body = self.__dict__["transformer"] = _Transformer(self)
        yield "transformer", body
        yield "lm_head", self.lm_head

    def _conv1d(self) -> set[str]:
        """The names whose stored (HF) layout is the transpose of the Parameter's."""
        return {hf for _, hf, conv in self._hf_names() if conv}

    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        conv = self._conv1d()
        return OrderedDict((k, np.ascontiguousarray(v.T) if k in conv else v) for k, v in super().state_dict().items())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Takes transformers' state_dict (Conv1D weights (in, out)); a ``lm_head.weight`` of a
        tied model must equal ``transformer.wte.weight``. Checked before anything is copied."""
        super().load_state_dict(state_dict, strict)  # Module's: _stage_state_dict (below), then the copy

    def _stage_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> tuple[Any, ...]:
        """Module's checks of transformers' state_dict with the Conv1D weights transposed to the
        Parameters' layout; the Trainer's checkpoints (load_best_model_at_end, resume) stage through it."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, not {type(state_dict).__name__}")
        state = dict(state_dict)
        if self.config.tie_word_embeddings and "lm_head.weight" in state:
            head = np.asarray(state.pop("lm_head.weight"))
            wte = np.asarray(state.get("transformer.wte.weight"))
            if head.shape != wte.shape or not np.array_equal(head, wte):
                raise ValueError("state_dict['lm_head.weight']: differs from transformer.wte.weight; this model "
                                 "ties the LM head to the token embedding")
        own = super().state_dict()
        for name in self._conv1d() & set(state):
            array = np.asarray(state[name])
            if array.shape[::-1] != own[name].shape:
                raise ValueError(f"state_dict[{name!r}]: expected shape {own[name].shape[::-1]} (a Conv1D weight, "
                                 f"(in, out)), got {array.shape}")
            state[name] = array.T
        return super()._stage_state_dict(state, strict)

    def __call__(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """Logits (batch, T, vocab_size) of int ids (batch, T). attention_mask (batch, T) of 0/1
        is checked (right padding: each row ones then zeros); the attention is causal, so a real
        token never sees the padding after it, and its logits are those without the mask (the
        padded positions' logits are computed as if the padding were tokens)."""
        ids = np.asarray(input_ids)
        if attention_mask is not None:
            check_attention_mask(attention_mask, ids.shape if ids.ndim == 2 else None)
        return self.compiled.forward(ids)

    # -- the Hugging Face views GPT offers, under these names ----------------------------------
    def _gpt_state(self) -> dict[str, np.ndarray]:
        own = super().state_dict()  # Module's: HF names, Linear layout
        return {name: own[hf] for name, hf, _ in self._hf_names()}

    def to_hf_state_dict(self) -> OrderedDict[str, np.ndarray]:
        out = self.state_dict()
        if self.config.tie_word_embeddings:
            out["lm_head.weight"] = out["transformer.wte.weight"].copy()
        return out

    def load_hf_state_dict(self, state: Mapping[str, Any] | str | Any) -> None:
        from gputrain.models.gpt import _load_hf
        self.load_state_dict(_load_hf(state))

    # -- the folder format (gputrain.models.hf.folder) ----------------------------------------
    def _hf_load_tensor(self, name: str, array: np.ndarray) -> None:
        """Writes one stored tensor (checked by the folder loader) into its parameter, on the host
        (from_pretrained builds on the CPU and moves the model afterwards)."""
        if "_hf_slots" not in self.__dict__:
            self._hf_slots = (dict(self.named_parameters()), self._conv1d())
        params, conv = self._hf_slots
        params[name].data = array.T if name in conv else array

    def _hf_loaded(self) -> None:
        self.__dict__.pop("_hf_slots", None)
        self.compiled.refresh_half_parameters()

    def _hf_config(self) -> dict[str, Any]:
        c = self.config
        if not c.bias:
            raise ValueError("save_pretrained: bias=False has no GPT-2 config field (GPT2Config always has biases)")
        config = {**getattr(self, "hf_extra", {}),
                  "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": c.vocab_size,
                  "n_positions": c.block_size, "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head,
                  "n_inner": c.n_inner, "activation_function": _SAVED_ACTIVATION[c.activation],
                  "layer_norm_epsilon": c.layer_norm_eps, "resid_pdrop": c.dropout, "embd_pdrop": c.dropout,
                  "attn_pdrop": c.dropout, "tie_word_embeddings": c.tie_word_embeddings, "dtype": "float32"}
        return config

    def save_pretrained(self, folder: Any, max_shard_size: int | str = hf_folder.DEFAULT_MAX_SHARD_SIZE) -> None:
        """See gputrain.models.hf.save_pretrained."""
        hf_folder.save_pretrained(self, folder, max_shard_size)


def parse(config: HFConfig) -> tuple[GPTConfig, dict[str, Any]]:
    """(the GPTConfig, the irrelevant fields to write back when saving)."""
    n_embd = config.int("n_embd", 768)
    n_head = config.int("n_head", 12)
    if n_embd % n_head:
        raise ValueError(f"{config.path}: field 'n_embd' = {n_embd} is not divisible by field 'n_head' = {n_head}")
    n_inner = config.raw("n_inner", None)
    if n_inner is not None:
        n_inner = config.int("n_inner")
    rates = {name: config.float(name, 0.1, 0.0, 1.0) for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    if len(set(rates.values())) > 1:
        raise ValueError(f"{config.path}: fields 'resid_pdrop', 'embd_pdrop', 'attn_pdrop' = {list(rates.values())} "
                         "differ; gputrain's GPT has one dropout rate for all three")
    if rates["resid_pdrop"] >= 1.0:
        raise ValueError(f"{config.path}: field 'resid_pdrop' = 1.0 drops everything")
    for name, default in _DEFAULT_ONLY.items():
        config.at_default(name, default)
    config.irrelevant(*_IRRELEVANT)
    extra = {k: config.values[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config.values}
    gpt = GPTConfig(vocab_size=config.int("vocab_size", 50257), block_size=config.int("n_positions", 1024),
                    n_layer=config.int("n_layer", 12), n_head=n_head, n_embd=n_embd,
                    dropout=rates["resid_pdrop"], bias=True, n_inner=n_inner,
                    activation=config.choice("activation_function", "gelu_new", ACTIVATIONS),
                    layer_norm_eps=config.float("layer_norm_epsilon", 1e-5, low_open=True),
                    tie_word_embeddings=config.bool("tie_word_embeddings", True))
    return gpt, extra


def tensors(spec: tuple[GPTConfig, dict[str, Any]]) -> dict[str, tuple[int, ...]]:
    """The tensors a GPT-2 checkpoint of `spec` must hold, as GPT2LMHeadModel stores them: name -> shape
    (Conv1D weights as (in, out))."""
    c = spec[0]
    inner = 4 * c.n_embd if c.n_inner is None else c.n_inner
    e = c.n_embd
    shapes = {"transformer.wte.weight": (c.vocab_size, e), "transformer.wpe.weight": (c.block_size, e)}
    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": (e,), p + "ln_1.bias": (e,),
                       p + "attn.c_attn.weight": (e, 3 * e), p + "attn.c_attn.bias": (3 * e,),
                       p + "attn.c_proj.weight": (e, e), p + "attn.c_proj.bias": (e,),
                       p + "ln_2.weight": (e,), p + "ln_2.bias": (e,),
                       p + "mlp.c_fc.weight": (e, inner), p + "mlp.c_fc.bias": (inner,),
                       p + "mlp.c_proj.weight": (inner, e), p + "mlp.c_proj.bias": (e,)})
    shapes.update({"transformer.ln_f.weight": (e,), "transformer.ln_f.bias": (e,)})
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, e)
    return shapes


def canonical(name: str, spec: tuple[GPTConfig, dict[str, Any]]) -> str | None:
    """A stored tensor name as tensors() spells it: GPT2Model's names get the 'transformer.' prefix;
    attention-bias buffers and a tied lm_head.weight give None (skipped)."""
    if _BUFFER.match(name) or (name == "lm_head.weight" and spec[0].tie_word_embeddings):
        return None
    if name == "lm_head.weight" or name.startswith("transformer."):
        return name
    return "transformer." + name  # GPT2Model's names


def build(spec: tuple[GPTConfig, dict[str, Any]]) -> GPT2LMHeadModel:
    """The GPT2LMHeadModel of `spec` (parameters at their initial values), keeping the config's irrelevant
    fields to write back on save."""
    model = GPT2LMHeadModel(spec[0])
    model.hf_extra = dict(spec[1])
    return model


FAMILY = hf_folder.register_family(hf_folder.Family(
    model_type="gpt2", architectures=("GPT2LMHeadModel", "GPT2Model"), parse=parse, tensors=tensors,
    canonical=canonical, build=build))
