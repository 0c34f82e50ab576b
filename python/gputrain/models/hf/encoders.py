"""The encoder families (issue 22): ``bert``, ``roberta``, ``xlm-roberta`` and ``distilbert``, each
as ``...ForSequenceClassification``, ``...ForTokenClassification`` and ``...ForMaskedLM``.

One module tree builds the four: they differ in names, in RoBERTa's positions and in the heads.
The modules carry transformers' names, so that ``state_dict()`` is transformers' and adapters can
target modules by name::

    bert.embeddings.word_embeddings (+ token_type_embeddings), position_embeddings, LayerNorm
    bert.encoder.layer.{i}.attention.self.query, key, value      (roberta.* the same)
    bert.encoder.layer.{i}.attention.output.dense, LayerNorm
    bert.encoder.layer.{i}.intermediate.dense, output.dense, output.LayerNorm
    bert.pooler.dense                                            (BertForSequenceClassification)
    classifier | classifier.dense + classifier.out_proj (RoBERTa) | cls.predictions.* | lm_head.*

    distilbert.embeddings.word_embeddings, position_embeddings, LayerNorm
    distilbert.transformer.layer.{i}.attention.q_lin, k_lin, v_lin, out_lin, sa_layer_norm,
        ffn.lin1, ffn.lin2, output_layer_norm
    pre_classifier + classifier | classifier | vocab_transform, vocab_layer_norm, vocab_projector

The C layers behind a layer (post-LN, as BERT): ("residual", [parallel(query | key | value),
attention (bidirectional, keys past each row's attention-mask length masked), dense, dropout]),
layernorm, ("residual", [dense, activation, dense, dropout]), layernorm -- exactly
LayerNorm(x + block(x)) twice.

Token embeddings: gputrain's TokenEmbedding holds the word and token-type rows in one
(vocab_size + type_vocab_size, hidden) table. ``state_dict()`` / ``load_state_dict()`` /
save_pretrained / from_pretrained split and join it under transformers' two names;
``named_parameters()`` lists the one table under ``...embeddings.word_embeddings.weight`` (its rows
from vocab_size on are ``token_type_embeddings``; its ``.grad`` likewise).

Padding rows: transformers' word_embeddings is an nn.Embedding with padding_idx = pad_token_id,
whose lookups give that row no gradient. gputrain's table row pad_token_id is trained like the
others, which gives transformers' gradients whenever pad ids sit only where the attention mask is
0 (their outputs then reach no loss term) -- tokenizers' padding; a pad id at a kept position
(BERT, DistilBERT: accepted, the forward is transformers') would get an embedding gradient that
transformers' does not. (RoBERTa refuses such a batch, see below.)

Positions: BERT and DistilBERT add ``position_embeddings`` rows 0..T-1. RoBERTa numbers a row's
tokens from ``padding_idx + 1`` counting only tokens that are not ``pad_token_id``
(transformers' create_position_ids_from_input_ids): under right padding with no pad id among the
real tokens, real token t sits at padding_idx + 1 + t, which is what gputrain computes (rows from
padding_idx + 1). A batch where pad_token_id occurs at a position the attention mask keeps would
get other positions, and is refused (ValueError naming input_ids). Padded positions' own outputs
are not transformers' (they never reach a real token's output, the pooled token or a loss term
with labels -100 there).

The call: ``model(input_ids, attention_mask=None, token_type_ids=None)`` returns the logits
((batch, num_labels) or (batch, T, num_labels | vocab_size)). The mask must be right padding
(ones then zeros); a missing mask is all ones, missing token types zeros (transformers' defaults).
``model.loss_fn()`` is the loss transformers' forward would apply for the head's problem_type
(cross-entropy with ignore_index -100; regression: mean squared error); multi-label
classification (BCEWithLogitsLoss) has no gputrain loss yet and is refused there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain import random
from gputrain.models.hf import folder as hf_folder
from gputrain.models.hf.config import HFConfig
from gputrain.nn.embedding import Bias, PositionEmbedding, TiedLinear
from gputrain.nn.layers import LayerNorm, Linear
from gputrain.nn.module import Module
from gputrain.nn.sequence import TokenEmbedding, check_attention_mask

# transformers' ACT2FN names -> gputrain's activation kind
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu", "tanh": "tanh"}
PROBLEM_TYPES = {None: None, "regression": "regression", "single_label_classification": "single_label_classification",
                 "multi_label_classification": "multi_label_classification"}
_BERT_DEFAULT_ONLY = {"is_decoder": False, "add_cross_attention": False, "is_encoder_decoder": False,
                      "position_embedding_type": "absolute", "pruned_heads": {}}
# fields no forward reads: the init's std, old flags, and the original Google BERT configs' pooler
# description and text direction (bert-base-chinese, multilingual), which transformers never uses
_IRRELEVANT = ("initializer_range", "gradient_checkpointing", "output_past", "directionality", "pooler_fc_size",
               "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type")


@dataclass(frozen=True)
class EncoderConfig:
    """What the arithmetic of an encoder depends on, read from config.json (parse_encoder_config)."""

    family: str  # model_type: "bert", "roberta", "xlm-roberta", "distilbert"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str  # gputrain's activation name (of the feed-forward)
    layer_norm_eps: float
    hidden_dropout: float
    attention_dropout: float
    max_position_embeddings: int
    type_vocab_size: int  # 0: no token types (DistilBERT)
    pad_token_id: int | None
    position_offset: int  # the position_embeddings row of position 0 (RoBERTa: padding_idx + 1)
    seqcls_dropout: float  # the sequence classifier's dropout
    tokcls_dropout: float  # the token classifier's dropout
    mlm_activation: str  # the MLM head's transform activation
    num_labels: int
    problem_type: str | None
    tie_word_embeddings: bool

    @property
    def head_dim(self) -> int:
        """hidden_size / num_heads (BERT-style configs have no head_dim field)."""
        return self.hidden_size // self.num_heads


def _num_labels(config: HFConfig) -> int:
    """transformers' num_labels: len(id2label), or num_labels when written (they must agree)."""
    id2label = config.raw("id2label", None)
    given = config.raw("num_labels", None)
    if id2label is not None and not isinstance(id2label, dict):
        raise ValueError(f"{config.path}: field 'id2label' must be an object, got {id2label!r}")
    if given is not None:
        given = config.int("num_labels")
    count = len(id2label) if id2label else None
    if given is not None and count is not None and given != count:
        raise ValueError(f"{config.path}: field 'num_labels' = {given} disagrees with field 'id2label' "
                         f"({count} labels)")
    return given or count or 2


def _dropout(config: HFConfig, name: str, default: float) -> float:
    p = config.float(name, default, 0.0, 1.0)
    if p >= 1.0:
        raise ValueError(f"{config.path}: field {name!r} = 1.0 drops everything")
    return p


def _check_pad(config: HFConfig, pad: int | None, vocab: int) -> None:
    if pad is not None and pad >= vocab:  # the word embeddings' padding_idx
        raise ValueError(f"{config.path}: field 'pad_token_id' = {pad} is not a row of the {vocab} word embeddings "
                         "(field 'vocab_size')")


def parse_encoder_config(config: HFConfig) -> EncoderConfig:
    """Reads every field of a bert/roberta/xlm-roberta/distilbert config.json: implemented,
    refused (ValueError naming the field) or irrelevant to the arithmetic."""
    family = config.raw("model_type")
    if family == "distilbert":
        return _parse_distilbert(config)
    if family not in ("bert", "roberta", "xlm-roberta"):
        raise ValueError(f"{config.path}: field 'model_type' = {family!r} is not an encoder family gputrain builds")
    for name, default in _BERT_DEFAULT_ONLY.items():
        config.at_default(name, default)
    config.irrelevant(*_IRRELEVANT)
    hidden, heads = config.int("hidden_size", 768), config.int("num_attention_heads", 12)
    if hidden % heads:
        raise ValueError(f"{config.path}: field 'hidden_size' = {hidden} is not a multiple of field "
                         f"'num_attention_heads' = {heads}")
    roberta = family != "bert"
    pad = config.raw("pad_token_id", 1 if roberta else 0)
    if pad is not None:
        pad = config.int("pad_token_id", minimum=0)
    vocab = config.int("vocab_size", 30522)
    _check_pad(config, pad, vocab)
    max_positions = config.int("max_position_embeddings", 512)
    offset = 0
    if roberta:
        if pad is None:
            raise ValueError(f"{config.path}: field 'pad_token_id' is null; RoBERTa's positions start at it")
        offset = pad + 1
        if offset >= max_positions:
            raise ValueError(f"{config.path}: field 'max_position_embeddings' = {max_positions} leaves no position "
                             f"after pad_token_id + 1 = {offset}")
    hidden_dropout = _dropout(config, "hidden_dropout_prob", 0.1)
    classifier = config.raw("classifier_dropout", None)
    classifier = hidden_dropout if classifier is None else _dropout(config, "classifier_dropout", 0.1)
    act = config.choice("hidden_act", "gelu", ACTIVATIONS)
    return EncoderConfig(
        family=family, vocab_size=vocab, hidden_size=hidden,
        num_layers=config.int("num_hidden_layers", 12), num_heads=heads,
        intermediate_size=config.int("intermediate_size", 3072), activation=act,
        layer_norm_eps=config.float("layer_norm_eps", 1e-12, low_open=True), hidden_dropout=hidden_dropout,
        attention_dropout=_dropout(config, "attention_probs_dropout_prob", 0.1),
        max_position_embeddings=max_positions, type_vocab_size=config.int("type_vocab_size", 2),
        pad_token_id=pad, position_offset=offset, seqcls_dropout=classifier, tokcls_dropout=classifier,
        mlm_activation="gelu" if roberta else act, num_labels=_num_labels(config),
        problem_type=config.choice("problem_type", None, PROBLEM_TYPES),
        tie_word_embeddings=config.bool("tie_word_embeddings", True))


def _parse_distilbert(config: HFConfig) -> EncoderConfig:
    config.at_default("sinusoidal_pos_embds", False)  # a fixed sinusoid table, not trained: not built
    config.at_default("tie_weights_", True)
    config.at_default("is_encoder_decoder", False)
    config.irrelevant(*_IRRELEVANT, "qa_dropout")  # the question-answering head is not built
    dim, heads = config.int("dim", 768), config.int("n_heads", 12)
    if dim % heads:
        raise ValueError(f"{config.path}: field 'dim' = {dim} is not a multiple of field 'n_heads' = {heads}")
    pad = config.raw("pad_token_id", 0)
    if pad is not None:
        pad = config.int("pad_token_id", minimum=0)
    vocab = config.int("vocab_size", 30522)
    _check_pad(config, pad, vocab)
    dropout = _dropout(config, "dropout", 0.1)
    act = config.choice("activation", "gelu", ACTIVATIONS)
    return EncoderConfig(
        family="distilbert", vocab_size=vocab, hidden_size=dim,
        num_layers=config.int("n_layers", 6), num_heads=heads, intermediate_size=config.int("hidden_dim", 3072),
        activation=act, layer_norm_eps=1e-12,  # DistilBERT's LayerNorms are eps=1e-12 whatever the config
        hidden_dropout=dropout, attention_dropout=_dropout(config, "attention_dropout", 0.1),
        max_position_embeddings=config.int("max_position_embeddings", 512), type_vocab_size=0,
        pad_token_id=pad, position_offset=0, seqcls_dropout=_dropout(config, "seq_classif_dropout", 0.2),
        tokcls_dropout=dropout, mlm_activation=act, num_labels=_num_labels(config),
        problem_type=config.choice("problem_type", None, PROBLEM_TYPES),
        tie_word_embeddings=config.bool("tie_word_embeddings", True))


def _dropout_spec(p: float) -> list[tuple]:
    return [("dropout", p)] if p > 0.0 else []


def _norm(config: EncoderConfig) -> LayerNorm:
    return LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class _Named(Module):
    """A module that only names its children (transformers' containers), in the order they run."""

    def __init__(self, *children: tuple[str, Module]) -> None:
        super().__init__()
        self._child_names = [name for name, _ in children]
        for name, child in children:
            setattr(self, name, child)

    def named_children(self) -> Iterator[tuple[str, Module]]:  # the attributes: a swapped child is seen
        return ((name, getattr(self, name)) for name in self._child_names)


class EncoderEmbeddings(Module):
    """``embeddings``: LayerNorm(word + token type + position embeddings), then dropout. The word
    and token-type rows are one TokenEmbedding table (see the module docstring)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.word_embeddings = TokenEmbedding(c.vocab_size, c.hidden_size, c.type_vocab_size, attention_mask=True)
        self.position_embeddings = PositionEmbedding(c.max_position_embeddings, c.hidden_size, c.position_offset)
        self.LayerNorm = _norm(c)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "word_embeddings", self.word_embeddings
        yield "position_embeddings", self.position_embeddings
        yield "LayerNorm", self.LayerNorm

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        return [self.word_embeddings._spec_in(tied), self.position_embeddings._spec_in(tied),
                self.LayerNorm._spec_in(tied), *_dropout_spec(self.config.hidden_dropout)]


class EncoderLayer(Module):
    """One post-LN layer: LayerNorm(x + attention(x)), then LayerNorm(x + ffn(x)).
    BERT's names (attention.self.query/key/value, attention.output.dense/LayerNorm,
    intermediate.dense, output.dense/LayerNorm) or DistilBERT's (attention.q_lin/k_lin/v_lin/
    out_lin, sa_layer_norm, ffn.lin1/lin2, output_layer_norm)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        e, i = c.hidden_size, c.intermediate_size
        self.q, self.k, self.v, self.o = Linear(e, e), Linear(e, e), Linear(e, e), Linear(e, e)
        self.attention_norm = _norm(c)
        self.up, self.down = Linear(e, i), Linear(i, e)
        self.output_norm = _norm(c)
        if c.family == "distilbert":
            self.attention = _Named(("q_lin", self.q), ("k_lin", self.k), ("v_lin", self.v), ("out_lin", self.o))
            self._tree = (("attention", self.attention), ("sa_layer_norm", self.attention_norm),
                          ("ffn", _Named(("lin1", self.up), ("lin2", self.down))), ("output_layer_norm", self.output_norm))
        else:
            self.attention = _Named(("self", _Named(("query", self.q), ("key", self.k), ("value", self.v))),
                                    ("output", _Named(("dense", self.o), ("LayerNorm", self.attention_norm))))
            self._tree = (("attention", self.attention), ("intermediate", _Named(("dense", self.up))),
                          ("output", _Named(("dense", self.down), ("LayerNorm", self.output_norm))))

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter(self._tree)

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        c = self.config
        qkv = ("parallel", [self.q._spec_in(tied), self.k._spec_in(tied), self.v._spec_in(tied)])
        attention = ("attention", c.hidden_size, c.num_heads, c.attention_dropout, False, 0, 0, 0, 0.0)
        drop = _dropout_spec(c.hidden_dropout)
        return ("sequential", [
            ("residual", [qkv, attention, self.o._spec_in(tied), *drop]), self.attention_norm._spec_in(tied),
            ("residual", [self.up._spec_in(tied), ("activation", c.activation), self.down._spec_in(tied), *drop]),
            self.output_norm._spec_in(tied)])


class EncoderModel(Module):
    """``bert`` / ``roberta`` / ``distilbert``: embeddings, the layers (under ``encoder.layer.{i}``
    or DistilBERT's ``transformer.layer.{i}``), and BERT's pooler (dense + tanh on the first
    token) when the head uses it."""

    def __init__(self, config: EncoderConfig, pooler: bool) -> None:
        super().__init__()
        self.config = config
        self.embeddings = EncoderEmbeddings(config)
        self.layers = [EncoderLayer(config) for _ in range(config.num_layers)]
        self.pooler = _Named(("dense", Linear(config.hidden_size, config.hidden_size))) if pooler else None

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "embeddings", self.embeddings
        encoder = "transformer" if self.config.family == "distilbert" else "encoder"
        for i, layer in enumerate(self.layers):
            yield f"{encoder}.layer.{i}", layer
        if self.pooler is not None:
            yield "pooler", self.pooler

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        out = [*self.embeddings._layers(tied), *(layer._spec_in(tied) for layer in self.layers)]
        if self.pooler is not None:
            out += [("pool", "cls"), self.pooler.dense._spec_in(tied), ("activation", "tanh")]
        return out


class _OutputBias(Module):
    """A tied decoder (TiedLinear over the word embeddings, or an untied Linear without bias)
    followed by the head's own ``bias`` (vocab_size,): the MLM decoders' ``x E^T + b``. Its
    children are listed first and its bias after them (the order C lays the parameters out in)."""

    _param_names = ("bias",)

    def __init__(self, decoder: Module, vocab_size: int, children: tuple[tuple[str, Module], ...] = ()) -> None:
        super().__init__()
        self.decoder = decoder
        self.bias_layer = Bias(vocab_size)
        self._kids = (*children, ("decoder", decoder))

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((*self._kids, ("bias", self.bias_layer)))  # the module walk (parameters: below)

    # the bias is the Bias layer's parameter, named here: children first, then "bias"
    def _named_param_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str]]:
        for name, child in self._kids:
            yield from child._named_param_slots(prefix + name + ".")
        yield self.bias_layer, "bias", prefix + "bias"

    def _named_state_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str, bool]]:
        for module, local, full in self._named_param_slots(prefix):
            yield module, local, full, False

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        specs = [spec for _, child in self._kids[:-1] for spec in child._layers(tied)]
        return [*specs, self.decoder._spec_in(tied), self.bias_layer._spec_in(tied)]


class _Transform(Module):
    """BERT's ``cls.predictions.transform``: dense, activation, LayerNorm."""

    def __init__(self, config: EncoderConfig, names: tuple[str, str]) -> None:
        super().__init__()
        self.activation = config.mlm_activation
        self.dense, self.norm = Linear(config.hidden_size, config.hidden_size), _norm(config)
        self._names = names

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter(((self._names[0], self.dense), (self._names[1], self.norm)))

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        return [self.dense._spec_in(tied), ("activation", self.activation), self.norm._spec_in(tied)]


class _EncoderHead(Module):
    """What the heads share: the config, the call, weights by HF names, folders."""

    head = ""  # "ForSequenceClassification" | "ForTokenClassification" | "ForMaskedLM"
    pooler = False  # BertForSequenceClassification's pooler

    def __init__(self, config: EncoderConfig | Mapping[str, Any], *, init_weights: bool = True) -> None:
        """config: a config.json mapping (transformers' ...Config fields, with its model_type) or
        a parsed EncoderConfig. init_weights=False skips transformers' initialisation
        (from_pretrained, which writes every parameter next, builds so)."""
        super().__init__()
        values = None
        if isinstance(config, Mapping):
            values = dict(config)
            hf = HFConfig(values, "config")
            config = self._parse_config(hf)
            hf.dtype()  # the saved precision: from_pretrained(dtype="auto") reads it
            hf.finish(config.family)
        elif not isinstance(config, self._config_type):
            raise TypeError(f"config must be an {self._config_type.__name__} or a config.json mapping, not "
                            f"{type(config).__name__}")
        family = getattr(type(self), "family", "")
        if family and config.family != family:
            raise ValueError(f"config: model_type {config.family!r} is not {type(self).__name__}'s {family!r}")
        self.config = config
        self.hf_values = values
        self.base_name = self._base_prefix(config.family)
        self.encoder = self._build_encoder(config)
        self._build_head()
        self._compile()
        if init_weights:
            self._init_weights(random.next_seed())

    # -- what a family with its own encoder (deberta.py) replaces ----------------------------
    _config_type: type = EncoderConfig

    @staticmethod
    def _parse_config(config: HFConfig) -> Any:
        return parse_encoder_config(config)

    @staticmethod
    def _base_prefix(family: str) -> str:
        """The encoder's name in transformers' state_dict."""
        return "distilbert" if family == "distilbert" else "bert" if family == "bert" else "roberta"

    def _build_encoder(self, config: Any) -> Module:
        return EncoderModel(config, self.pooler and config.family == "bert")

    @staticmethod
    def _folder_tensors(spec: tuple[Any, dict[str, Any], type]) -> dict[str, tuple[int, ...]]:
        return _tensors(spec)

    @staticmethod
    def _folder_canonical(family: str) -> Any:
        return _canonical_for(family)

    @property
    def _table_width(self) -> int:
        """Columns of the word + token-type table."""
        return self.config.hidden_size

    def _build_head(self) -> None:
        raise NotImplementedError

    def _head(self) -> Iterator[tuple[str, Module]]:
        raise NotImplementedError

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        raise NotImplementedError

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield self.base_name, self.encoder
        yield from self._head()

    def _spec_list(self, tied: dict[int, int] | None = None) -> list[tuple]:
        tied = {} if tied is None else tied
        return [*self.encoder._layers(tied), *self._head_layers(tied)]

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("sequential", self._spec_list(tied))

    def _init_weights(self, seed: int, std: float = 0.02) -> None:
        """transformers' _init_weights: N(0, std) matrices and embeddings, zero biases, LayerNorm
        weights 1, and the word embeddings' pad_token_id row 0 (nn.Embedding's padding_idx)."""
        rng = np.random.default_rng(seed)
        values = {}
        for name, value in self.state_dict().items():
            if name.endswith("bias"):
                values[name] = np.zeros_like(value)
            elif value.ndim == 1:
                values[name] = np.ones_like(value)
            else:
                values[name] = rng.normal(0.0, std, value.shape).astype(np.float32)
        if self.config.pad_token_id is not None:
            values[self._table_name][self.config.pad_token_id] = 0.0
        self.load_state_dict(values)

    # -- the table of word + token-type rows under transformers' two names -------------------
    @property
    def _table_name(self) -> str:
        return f"{self.base_name}.embeddings.word_embeddings.weight"

    @property
    def _types_name(self) -> str:
        return f"{self.base_name}.embeddings.token_type_embeddings.weight"

    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        """transformers' state_dict: word_embeddings (vocab_size, hidden) and
        token_type_embeddings (type_vocab_size, hidden) as two tensors."""
        own = super().state_dict()
        if not self.config.type_vocab_size:
            return own
        out: OrderedDict[str, np.ndarray] = OrderedDict()
        v = self.config.vocab_size
        for name, value in own.items():
            if name == self._table_name:
                out[name] = value[:v].copy()
                out[self._types_name] = value[v:].copy()
            else:
                out[name] = value
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Takes transformers' state_dict (see state_dict); checked before anything is copied."""
        super().load_state_dict(state_dict, strict)  # Module's: _stage_state_dict (below), then the copy

    def _stage_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> tuple[Any, ...]:
        """Module's checks of transformers' state_dict with the two embedding tensors joined into
        the one table; the Trainer's checkpoints (load_best_model_at_end, resume) stage through it."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, not {type(state_dict).__name__}")
        state = dict(state_dict)
        c = self.config
        if c.type_vocab_size and (self._table_name in state or self._types_name in state):
            words, types = state.pop(self._table_name, None), state.pop(self._types_name, None)
            if words is None or types is None:
                missing = self._table_name if words is None else self._types_name
                raise KeyError(f"state_dict: {missing!r} is missing (the word and token-type embeddings are "
                               "loaded together)")
            words, types = np.asarray(words), np.asarray(types)
            for name, array, rows in ((self._table_name, words, c.vocab_size), (self._types_name, types,
                                                                                c.type_vocab_size)):
                if array.shape != (rows, self._table_width):
                    raise ValueError(f"state_dict[{name!r}]: expected shape {(rows, self._table_width)}, got "
                                     f"{array.shape}")
            state[self._table_name] = np.concatenate([words, types])
        return super()._stage_state_dict(state, strict)

    # -- the call ----------------------------------------------------------------------------
    def pack(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
        """The int64 (batch, channels, T) rows the model reads: ids | token types (when the
        family has them) | mask, checked (ValueError naming the argument)."""
        return pack_encoder_inputs(self.config, input_ids, attention_mask, token_type_ids)

    def __call__(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
        """The logits (see the module docstring). Rows from :meth:`pack` ((batch, channels, T))
        are taken as they are."""
        ids = np.asarray(input_ids)
        if ids.ndim == 3 and attention_mask is None and token_type_ids is None:
            return self.compiled.forward(ids)
        return self.compiled.forward(self.pack(ids, attention_mask, token_type_ids))

    def loss_fn(self) -> Any:
        """The gputrain loss of transformers' forward with labels for this head (see the module
        docstring)."""
        from gputrain.nn.loss import CrossEntropyLoss

        return CrossEntropyLoss()

    # -- the folder format (gputrain.models.hf.folder) ---------------------------------------
    def _hf_load_tensor(self, name: str, array: np.ndarray) -> None:
        if "_hf_slots" not in self.__dict__:
            self._hf_slots = dict(self.named_parameters())
        v = self.config.vocab_size
        if name == self._types_name:
            self._hf_slots[self._table_name].data[v:] = array
        elif name == self._table_name and self.config.type_vocab_size:
            self._hf_slots[name].data[:v] = array
        else:
            self._hf_slots[name].data = array

    def _hf_loaded(self) -> None:
        self.__dict__.pop("_hf_slots", None)
        self.compiled.refresh_half_parameters()

    def _hf_config(self) -> dict[str, Any]:
        if self.hf_values is None:
            raise ValueError("save_pretrained: this model was built from an EncoderConfig; build it from a "
                             "config.json mapping (e.g. BertForSequenceClassification({...})) to save it as a folder")
        values = {k: v for k, v in self.hf_values.items() if k != "torch_dtype"}
        values.update(architectures=[type(self).__name__], dtype="float32")
        return values

    def save_pretrained(self, folder: Any, max_shard_size: int | str = hf_folder.DEFAULT_MAX_SHARD_SIZE) -> None:
        """See gputrain.models.hf.save_pretrained."""
        hf_folder.save_pretrained(self, folder, max_shard_size)

    @classmethod
    def from_pretrained(cls, folder: Any, *, num_labels: int | None = None, problem_type: str | None = None,
                        dtype: Any = None, device: str | None = None) -> _EncoderHead:
        """This head over the encoder of any checkpoint of its family (transformers'
        ``AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3)``): a
        pretraining or MLM checkpoint gives the encoder, and the tensors of this head that the
        folder does not hold (the classifier, BERT's pooler) start at transformers' init (N(0,
        0.02) weights, zero biases). Tensors of other heads (an MLM head, the NSP head, another
        classifier) are left out. num_labels / problem_type replace config.json's (num_labels
        renames the labels LABEL_0..). Everything is checked before the model is built: an
        encoder tensor missing or of another shape raises ValueError naming it."""
        import os

        from gputrain.models.hf.safetensors_io import checkpoint_tensors

        folder = os.fspath(folder)
        config = HFConfig.load(folder)
        values = dict(config.values)
        family = getattr(cls, "family", "")
        if values.get("model_type") != family:
            raise ValueError(f"{config.path}: field 'model_type' = {values.get('model_type')!r}: {cls.__name__} "
                             f"loads {family!r} checkpoints")
        values["architectures"] = [cls.__name__]
        if num_labels is not None:
            if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
                raise ValueError(f"num_labels must be an int >= 1, got {num_labels!r}")
            values.pop("num_labels", None)
            values["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
            values["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
        if problem_type is not None:
            values["problem_type"] = problem_type
        hf = HFConfig(values, config.path)
        parsed = cls._parse_config(hf)
        precision = hf_folder._precision(dtype, hf)
        hf.finish(family)
        spec = (parsed, values, cls)
        expected, canonical = cls._folder_tensors(spec), cls._folder_canonical(family)
        base = cls._base_prefix(family)
        found = {}
        for name, ref in checkpoint_tensors(folder).items():
            key = canonical(name, spec)
            if key is None or (key not in expected and not key.startswith(base + ".")):
                continue  # another head's tensor
            if key not in expected:
                raise ValueError(f"{ref.path}: unexpected tensor {name!r} (a {family} encoder of this config.json "
                                 "does not have it)")
            if ref.shape != expected[key]:
                raise ValueError(f"{ref.path}: tensor {name!r} has shape {ref.shape}, config.json implies "
                                 f"{expected[key]}")
            found[key] = ref
        missing = [k for k in expected if k.startswith(base + ".") and k not in found
                   and not k.startswith(f"{base}.pooler.")]
        if missing:
            raise ValueError(f"{folder}: tensor {missing[0]!r} is missing from the checkpoint "
                             f"({len(missing)} encoder tensors missing in all)")
        model = cls(values)  # transformers' init for what the folder does not hold
        return hf_folder.load_tensors(model, found, precision, device)

    def extra_repr(self) -> str:
        c = self.config
        return (f"{c.family}: layers={c.num_layers}, hidden={c.hidden_size}, heads={c.num_heads}, "
                f"vocab={c.vocab_size}")


class EncoderForSequenceClassification(_EncoderHead):
    """logits (batch, num_labels) from the first token: BERT's pooler (dense + tanh), dropout
    (classifier_dropout, else hidden_dropout_prob) and ``classifier``; RoBERTa's
    ``classifier.dense`` + tanh + ``classifier.out_proj`` with that dropout before each;
    DistilBERT's ``pre_classifier`` + ReLU + dropout (seq_classif_dropout) + ``classifier``."""

    head = "ForSequenceClassification"
    pooler = True

    def _build_head(self) -> None:
        c = self.config
        if c.family in ("roberta", "xlm-roberta"):
            self.classifier = _Named(("dense", Linear(c.hidden_size, c.hidden_size)),
                                     ("out_proj", Linear(c.hidden_size, c.num_labels)))
        else:
            self.pre_classifier = Linear(c.hidden_size, c.hidden_size) if c.family == "distilbert" else None
            self.classifier = Linear(c.hidden_size, c.num_labels)

    def _head(self) -> Iterator[tuple[str, Module]]:
        if getattr(self, "pre_classifier", None) is not None:
            yield "pre_classifier", self.pre_classifier
        yield "classifier", self.classifier

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        c = self.config
        drop = _dropout_spec(c.seqcls_dropout)
        if c.family in ("roberta", "xlm-roberta"):
            return [("pool", "cls"), *drop, self.classifier.dense._spec_in(tied), ("activation", "tanh"), *drop,
                    self.classifier.out_proj._spec_in(tied)]
        if c.family == "distilbert":
            return [("pool", "cls"), self.pre_classifier._spec_in(tied), ("activation", "relu"), *drop,
                    self.classifier._spec_in(tied)]
        return [*drop, self.classifier._spec_in(tied)]  # after the pooler

    @property
    def problem_type(self) -> str:
        """transformers' rule: the config's problem_type, else regression for one label and
        single-label classification otherwise (transformers picks multi-label only from float labels)."""
        c = self.config
        return c.problem_type or ("regression" if c.num_labels == 1 else "single_label_classification")

    def loss_fn(self) -> Any:
        from gputrain.nn.loss import CrossEntropyLoss, MSELoss

        kind = self.problem_type
        if kind == "multi_label_classification":
            raise ValueError("problem_type 'multi_label_classification': transformers trains it with "
                             "BCEWithLogitsLoss, which gputrain does not have yet; its logits are exact")
        return MSELoss() if kind == "regression" else CrossEntropyLoss()


class EncoderForTokenClassification(_EncoderHead):
    """logits (batch, T, num_labels): dropout and ``classifier`` on every token."""

    head = "ForTokenClassification"

    def _build_head(self) -> None:
        self.classifier = Linear(self.config.hidden_size, self.config.num_labels)

    def _head(self) -> Iterator[tuple[str, Module]]:
        yield "classifier", self.classifier

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        return [*_dropout_spec(self.config.tokcls_dropout), self.classifier._spec_in(tied)]


class EncoderForMaskedLM(_EncoderHead):
    """logits (batch, T, vocab_size): the prediction head (dense, activation, LayerNorm) and the
    decoder, tied to the word embeddings (tie_word_embeddings) or its own matrix, plus the bias:
    BERT's ``cls.predictions.{transform.dense, transform.LayerNorm, decoder, bias}``, RoBERTa's
    ``lm_head.{dense, layer_norm, decoder, bias}``, DistilBERT's ``vocab_transform``,
    ``vocab_layer_norm``, ``vocab_projector`` (+ its bias). Labels: token ids, -100 ignored."""

    head = "ForMaskedLM"

    def _decoder(self) -> Module:
        c = self.config
        if c.tie_word_embeddings:
            return TiedLinear(self.encoder.embeddings.word_embeddings)
        return Linear(c.hidden_size, c.vocab_size, bias=False)

    def _build_head(self) -> None:
        c = self.config
        if c.family == "distilbert":
            self.transform = _Transform(c, ("vocab_transform", "vocab_layer_norm"))
            self.vocab_projector = _OutputBias(self._decoder(), c.vocab_size)
            self._tree = (*self.transform.named_children(), ("vocab_projector", _Renamed(self.vocab_projector)))
        elif c.family == "bert":
            transform = _Transform(c, ("dense", "LayerNorm"))
            self.predictions = _OutputBias(self._decoder(), c.vocab_size, (("transform", transform),))
            self._tree = (("cls", _Named(("predictions", self.predictions))),)
        else:
            self.transform = _Transform(c, ("dense", "layer_norm"))
            self.lm_head = _OutputBias(self._decoder(), c.vocab_size)
            self._tree = (("lm_head", _Merged(self.transform, self.lm_head)),)

    def _head(self) -> Iterator[tuple[str, Module]]:
        return iter(self._tree)

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        if self.config.family == "bert":
            return self.predictions._layers(tied)
        head = self.vocab_projector if self.config.family == "distilbert" else self.lm_head
        return [*self.transform._layers(tied), *head._layers(tied)]


class _Renamed(Module):
    """DistilBERT's ``vocab_projector``: a tied (weight) decoder whose bias is ``vocab_projector.bias``."""

    def __init__(self, head: _OutputBias) -> None:
        super().__init__()
        self.head = head

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("decoder", self.head.decoder), ("bias", self.head.bias_layer)))  # the module walk

    def _named_param_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str]]:
        if not isinstance(self.head.decoder, TiedLinear):
            yield self.head.decoder, "weight", prefix + "weight"
        yield self.head.bias_layer, "bias", prefix + "bias"

    def _named_state_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str, bool]]:
        for module, local, full in self._named_param_slots(prefix):
            yield module, local, full, False


class _Merged(Module):
    """RoBERTa's ``lm_head``: dense, layer_norm (the transform's) with decoder and bias in one name space."""

    def __init__(self, transform: _Transform, head: _OutputBias) -> None:
        super().__init__()
        self.transform, self.head = transform, head

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self.transform.named_children()
        yield "decoder", self.head.decoder
        yield "bias", self.head.bias_layer  # the module walk (parameters: below)

    def _named_param_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str]]:
        for name, child in (*self.transform.named_children(), ("decoder", self.head.decoder)):
            yield from child._named_param_slots(prefix + name + ".")
        yield self.head.bias_layer, "bias", prefix + "bias"

    def _named_state_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str, bool]]:
        for module, local, full in self._named_param_slots(prefix):
            yield module, local, full, False


def pack_encoder_inputs(config: EncoderConfig, input_ids: Any, attention_mask: Any = None,
                        token_type_ids: Any = None) -> np.ndarray:
    """(batch, channels, T) int64: ids in [0, vocab_size), token types in [0, type_vocab_size)
    (default zeros; refused for a family without them), the right-padded 0/1 mask (default ones).
    RoBERTa: pad_token_id must not occur where the mask is 1 (its positions would differ)."""
    ids = _matrix(input_ids, "input_ids", None)
    if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
        raise ValueError(f"input_ids must be in [0, {config.vocab_size}), got values in [{ids.min()}, {ids.max()}]")
    mask = np.ones_like(ids) if attention_mask is None else check_attention_mask(attention_mask, ids.shape)
    rows = [ids]
    if config.type_vocab_size:
        types = np.zeros_like(ids) if token_type_ids is None else _matrix(token_type_ids, "token_type_ids", ids.shape)
        if types.size and (types.min() < 0 or types.max() >= config.type_vocab_size):
            raise ValueError(f"token_type_ids must be in [0, {config.type_vocab_size}), got values in "
                             f"[{types.min()}, {types.max()}]")
        rows.append(types)
    elif token_type_ids is not None:
        raise ValueError(f"token_type_ids: a {config.family} model has no token types")
    if config.position_offset and ((ids == config.pad_token_id) & (mask == 1)).any():
        row = int(np.flatnonzero(((ids == config.pad_token_id) & (mask == 1)).any(axis=1))[0])
        raise ValueError(f"input_ids: row {row} holds pad_token_id {config.pad_token_id} where attention_mask is 1; "
                         f"{config.family} numbers positions by skipping pad ids, and gputrain computes them for "
                         "right padding only (every pad id after the real tokens, masked)")
    rows.append(mask)
    return np.ascontiguousarray(np.stack(rows, axis=1))


def _matrix(value: Any, name: str, shape: tuple[int, ...] | None) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == bool:
        array = array.astype(np.int64)
    if array.ndim != 2 or array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 2-D integer array (batch, T), got dtype {array.dtype} and shape "
                         f"{array.shape}")
    if shape is not None and array.shape != shape:
        raise ValueError(f"{name} must have the shape of input_ids {shape}, got {array.shape}")
    return array.astype(np.int64, copy=False)


# -- the folder format: one Family per model_type ---------------------------------------------
def _linear(shapes: dict[str, tuple[int, ...]], name: str, n_in: int, n_out: int, bias: bool = True) -> None:
    shapes[name + ".weight"] = (n_out, n_in)
    if bias:
        shapes[name + ".bias"] = (n_out,)


def _layernorm(shapes: dict[str, tuple[int, ...]], name: str, size: int) -> None:
    shapes[name + ".weight"] = shapes[name + ".bias"] = (size,)


def _tensors(spec: tuple[EncoderConfig, dict[str, Any], type]) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint of this config and head holds (transformers' names and shapes)."""
    c, _, cls = spec
    e, i, distil = c.hidden_size, c.intermediate_size, c.family == "distilbert"
    base = "distilbert" if distil else "bert" if c.family == "bert" else "roberta"
    shapes: dict[str, tuple[int, ...]] = {f"{base}.embeddings.word_embeddings.weight": (c.vocab_size, e)}
    if c.type_vocab_size:
        shapes[f"{base}.embeddings.token_type_embeddings.weight"] = (c.type_vocab_size, e)
    shapes[f"{base}.embeddings.position_embeddings.weight"] = (c.max_position_embeddings, e)
    _layernorm(shapes, f"{base}.embeddings.LayerNorm", e)
    for layer in range(c.num_layers):
        p = f"{base}.{'transformer' if distil else 'encoder'}.layer.{layer}."
        names = (("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "sa_layer_norm",
                  "ffn.lin1", "ffn.lin2", "output_layer_norm") if distil else
                 ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                  "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"))
        for name in names[:4]:
            _linear(shapes, p + name, e, e)
        _layernorm(shapes, p + names[4], e)
        _linear(shapes, p + names[5], e, i)
        _linear(shapes, p + names[6], i, e)
        _layernorm(shapes, p + names[7], e)
    if issubclass(cls, EncoderForSequenceClassification):
        if c.family == "bert":
            _linear(shapes, "bert.pooler.dense", e, e)
            _linear(shapes, "classifier", e, c.num_labels)
        elif distil:
            _linear(shapes, "pre_classifier", e, e)
            _linear(shapes, "classifier", e, c.num_labels)
        else:
            _linear(shapes, "classifier.dense", e, e)
            _linear(shapes, "classifier.out_proj", e, c.num_labels)
    elif issubclass(cls, EncoderForTokenClassification):
        _linear(shapes, "classifier", e, c.num_labels)
    else:
        head = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                         "cls.predictions.decoder", "cls.predictions.bias"),
                "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector", "vocab_projector.bias")
                }.get(c.family, ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"))
        _linear(shapes, head[0], e, e)
        _layernorm(shapes, head[1], e)
        if not c.tie_word_embeddings:
            _linear(shapes, head[2], e, c.vocab_size, bias=False)
        shapes[head[3]] = (c.vocab_size,)
    return shapes


def _canonical_for(family: str):
    base = "distilbert" if family == "distilbert" else "bert" if family == "bert" else "roberta"

    def canonical(name: str, spec: tuple[EncoderConfig, dict[str, Any], type]) -> str | None:
        config, _, cls = spec
        if name.endswith("embeddings.position_ids") or name.endswith("embeddings.token_type_ids"):
            return None  # buffers older files saved
        if name in ("cls.predictions.decoder.bias", "lm_head.decoder.bias"):
            return None  # tied to cls.predictions.bias / lm_head.bias
        if config.tie_word_embeddings and name in ("cls.predictions.decoder.weight", "lm_head.decoder.weight",
                                                   "vocab_projector.weight"):
            return None  # the word embeddings
        if name.endswith(".gamma") or name.endswith(".beta"):  # LayerNorm names of TF-converted files
            name = name[:name.rindex(".")] + (".weight" if name.endswith(".gamma") else ".bias")
        if not name.startswith(base + ".") and name.split(".")[0] not in _HEAD_PREFIXES:
            name = base + "." + name  # a bare ...Model checkpoint's names
        if name.startswith("cls.seq_relationship.") or (
                name.startswith(f"{base}.pooler.") and not (cls.pooler and config.family == "bert")):
            return None  # heads this class does not have (BertForPreTraining's NSP head, BertModel's pooler)
        return name

    return canonical


_HEAD_PREFIXES = ("classifier", "cls", "lm_head", "pre_classifier", "vocab_transform", "vocab_layer_norm",
                  "vocab_projector")


def _register(family: str, classes: tuple[type, ...]) -> None:
    heads = {cls.__name__: cls for cls in classes}

    def parse(config: HFConfig) -> tuple[EncoderConfig, dict[str, Any], type]:
        names = config.raw("architectures", None) or [classes[0].__name__]
        if names[0] not in heads:
            raise ValueError(f"{config.path}: field 'architectures' = {names!r}: gputrain's {family} family builds "
                             f"{', '.join(heads)}")
        return parse_encoder_config(config), dict(config.values), heads[names[0]]

    def build(spec: tuple[EncoderConfig, dict[str, Any], type]) -> _EncoderHead:
        config, values, cls = spec
        model = cls(config, init_weights=False)
        model.hf_values = values
        return model

    hf_folder.register_family(hf_folder.Family(
        model_type=family, architectures=tuple(heads), parse=parse, tensors=_tensors,
        canonical=_canonical_for(family), build=build))


def _classes(prefix: str, family: str) -> tuple[type, type, type]:
    made = []
    for base in (EncoderForSequenceClassification, EncoderForTokenClassification, EncoderForMaskedLM):
        name = prefix + base.head
        made.append(type(name, (base,), {"__doc__": f"transformers' {name} (model_type {family!r}): see "
                                                    f"{base.__name__}.", "family": family,
                                         "__module__": __name__}))
    return tuple(made)


BertForSequenceClassification, BertForTokenClassification, BertForMaskedLM = _classes("Bert", "bert")
RobertaForSequenceClassification, RobertaForTokenClassification, RobertaForMaskedLM = _classes("Roberta", "roberta")
XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification, XLMRobertaForMaskedLM = \
    _classes("XLMRoberta", "xlm-roberta")
DistilBertForSequenceClassification, DistilBertForTokenClassification, DistilBertForMaskedLM = \
    _classes("DistilBert", "distilbert")
_register("bert", (BertForSequenceClassification, BertForTokenClassification, BertForMaskedLM))
_register("roberta", (RobertaForSequenceClassification, RobertaForTokenClassification, RobertaForMaskedLM))
_register("xlm-roberta", (XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification,
                          XLMRobertaForMaskedLM))
_register("distilbert", (DistilBertForSequenceClassification, DistilBertForTokenClassification,
                         DistilBertForMaskedLM))

__all__ = ["BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
           "DistilBertForMaskedLM", "DistilBertForSequenceClassification", "DistilBertForTokenClassification",
           "EncoderConfig", "EncoderForMaskedLM", "EncoderForSequenceClassification", "EncoderForTokenClassification",
           "RobertaForMaskedLM", "RobertaForSequenceClassification", "RobertaForTokenClassification",
           "XLMRobertaForMaskedLM", "XLMRobertaForSequenceClassification", "XLMRobertaForTokenClassification",
           "pack_encoder_inputs", "parse_encoder_config"]
