"""The ``deberta-v2`` family (issue 22): DeBERTa-v2 and DeBERTa-v3 checkpoints (model_type
"deberta-v2") as ``DebertaV2ForSequenceClassification``, ``DebertaV2ForTokenClassification`` and
``DebertaV2ForMaskedLM``, beside the BERT-like encoders of encoders.py (whose head classes these
extend: the call, the loss, weights by transformers' names, folders, ``from_pretrained(folder,
num_labels=)``).

transformers' modeling_deberta_v2.py is the map; the modules carry its names::

    deberta.embeddings.word_embeddings (+ token_type_embeddings, position_embeddings), embed_proj,
        LayerNorm
    deberta.encoder.layer.{i}.attention.self.query_proj, key_proj, value_proj
        (+ pos_key_proj, pos_query_proj without share_att_key)
    deberta.encoder.layer.{i}.attention.output.dense, LayerNorm
    deberta.encoder.layer.{i}.intermediate.dense, output.dense, output.LayerNorm
    deberta.encoder.rel_embeddings (+ deberta.encoder.LayerNorm with norm_rel_ebd "layer_norm")
    pooler.dense + classifier | classifier | cls.predictions.{transform.dense, transform.LayerNorm, bias}

Embeddings: word (+ absolute positions when position_biased_input; DeBERTa-v3: none) (+ token
types when type_vocab_size > 0), ``embed_proj`` when embedding_size differs from hidden_size,
LayerNorm, dropout. transformers then multiplies by the attention mask, which changes padded
positions only (never a real token's output: padded keys are masked), so gputrain leaves it out;
as for the other encoders, padded positions' own outputs are not transformers'.

Attention: the C layer kind ``disentangled_attention`` (csrc/nn/disentangled.c) after the fused
q | k | v projection: scores scale (q k + c2p + p2c), c2p = q . pos_key[r(i, j)] and
p2c = k . pos_query[r(i, j)] with r the log-bucketed relative position (position_buckets,
max_relative_positions), scale = 1 / sqrt(head_dim (1 + terms)). pos_key / pos_query are the
layer's key_proj / query_proj (share_att_key) or pos_key_proj / pos_query_proj applied to
LayerNorm(rel_embeddings) (after the position dropout); the layer computes them in every layer
from the shared table, so the table and its norm get the summed gradient of every layer.

Heads: ContextPooler (dropout pooler_dropout, pooler.dense, pooler_hidden_act on the first
token), dropout (cls_dropout, else hidden_dropout_prob), classifier; token classification:
dropout, classifier; masked LM: transformers' default (legacy) head ``cls.predictions``: dense
(hidden -> embedding_size), hidden_act, LayerNorm, the word embeddings transposed, bias.

Refused by name: relative_attention false, pos_att_type without c2p/p2c (or with another
entry), conv_kernel_size > 0 (DeBERTa-v2-xlarge's convolution; v3 has none), legacy false (the
newer ``lm_predictions`` MLM head), an untied MLM decoder, attention_head_size or
pooler_hidden_size other than transformers' defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gputrain.models.hf import encoders as enc
from gputrain.models.hf import folder as hf_folder
from gputrain.models.hf.config import HFConfig
from gputrain.nn.embedding import PositionEmbedding, TiedLinear
from gputrain.nn.layers import LayerNorm, Linear
from gputrain.nn.module import Module
from gputrain.nn.sequence import TokenEmbedding

FAMILY = "deberta-v2"
BASE = "deberta"


@dataclass(frozen=True)
class DebertaConfig:
    """What the arithmetic of a DeBERTa-v2/v3 encoder depends on (parse_deberta_config)."""

    family: str  # "deberta-v2"
    vocab_size: int
    hidden_size: int
    embedding_size: int  # the word (and position, type) embeddings' width; embed_proj maps it to hidden_size
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str  # gputrain's name of hidden_act (feed-forward and MLM transform)
    layer_norm_eps: float
    hidden_dropout: float
    attention_dropout: float
    max_position_embeddings: int
    type_vocab_size: int  # 0: no token types
    pad_token_id: int | None
    position_biased_input: bool  # absolute position embeddings added to the input
    span: int  # S: rel_embeddings has 2 S rows (position_buckets, else max_relative_positions)
    position_buckets: int  # 0: relative positions not bucketed
    max_relative_positions: int
    c2p: bool
    p2c: bool
    share_att_key: bool  # positions projected by key_proj / query_proj (else pos_key_proj / pos_query_proj)
    norm_rel_ebd: bool  # LayerNorm on rel_embeddings ("layer_norm")
    pooler_activation: str
    pooler_dropout: float
    seqcls_dropout: float  # cls_dropout, else hidden_dropout_prob
    num_labels: int
    problem_type: str | None
    tie_word_embeddings: bool

    position_offset = 0  # pack_encoder_inputs: positions need no pad-aware numbering

    @property
    def head_dim(self) -> int:
        """Features per attention head (hidden_size / num_attention_heads)."""
        return self.hidden_size // self.num_heads


def _pos_att_type(config: HFConfig) -> tuple[bool, bool]:
    value = config.raw("pos_att_type", None)
    if isinstance(value, str):
        value = [x.strip() for x in value.lower().split("|")]
    if value is None or not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{config.path}: field 'pos_att_type' = {value!r}: gputrain builds DeBERTa's relative "
                         "attention with 'c2p' and/or 'p2c' (e.g. \"p2c|c2p\")")
    other = [x for x in value if x not in ("c2p", "p2c")]
    if other or not value:
        raise ValueError(f"{config.path}: field 'pos_att_type' = {value!r}: gputrain implements 'c2p' and 'p2c' "
                         f"only{f', not {other[0]!r}' if other else ''}")
    return "c2p" in value, "p2c" in value


def _norm_rel_ebd(config: HFConfig) -> bool:
    value = config.raw("norm_rel_ebd", "none")
    parts = [x.strip() for x in value.lower().split("|")] if isinstance(value, str) else None
    if parts is None or any(x not in ("none", "layer_norm") for x in parts):
        raise ValueError(f"{config.path}: field 'norm_rel_ebd' = {value!r} is not supported (gputrain implements "
                         "'none' and 'layer_norm')")
    return "layer_norm" in parts


def _relative(config: HFConfig, max_positions: int) -> tuple[int, int, int]:
    """(span, position_buckets or 0, max_relative_positions) as transformers resolves them."""
    if not config.bool("relative_attention", False):
        raise ValueError(f"{config.path}: field 'relative_attention' is false (or missing): gputrain builds "
                         "DeBERTa-v2/v3 with relative attention only (their checkpoints set it true)")
    max_rel = config.int("max_relative_positions", -1, minimum=-(2**62))
    max_rel = max_positions if max_rel < 1 else max_rel
    buckets = config.int("position_buckets", -1, minimum=-(2**62))
    buckets = buckets if buckets > 0 else 0
    if buckets == 1 or (buckets and max_rel - 1 <= buckets // 2):
        raise ValueError(f"{config.path}: field 'position_buckets' = {buckets} with max_relative_positions "
                         f"{max_rel}: log buckets need position_buckets >= 2 and max_relative_positions - 1 > "
                         "position_buckets / 2 (transformers' make_log_bucket_position divides by both)")
    return (buckets or max_rel), buckets, max_rel


def parse_deberta_config(config: HFConfig) -> DebertaConfig:
    """Reads every field of a deberta-v2 config.json: implemented, refused (ValueError naming the
    field) or irrelevant to the arithmetic."""
    if config.raw("model_type") != FAMILY:
        raise ValueError(f"{config.path}: field 'model_type' = {config.raw('model_type')!r} is not {FAMILY!r}")
    config.irrelevant(*enc._IRRELEVANT)
    hidden, heads = config.int("hidden_size", 1536), config.int("num_attention_heads", 24)
    if hidden % heads:
        raise ValueError(f"{config.path}: field 'hidden_size' = {hidden} is not a multiple of field "
                         f"'num_attention_heads' = {heads}")
    config.at_default("attention_head_size", hidden // heads)
    config.at_default("pooler_hidden_size", hidden)
    if config.int("conv_kernel_size", 0, minimum=0):
        raise ValueError(f"{config.path}: field 'conv_kernel_size' = {config.raw('conv_kernel_size')} is not "
                         "supported: gputrain does not build DeBERTa-v2's convolution layer (v3 has none)")
    config.irrelevant("conv_groups", "conv_act")  # read only by the convolution layer
    config.at_default("legacy", True)
    pad = config.raw("pad_token_id", 0)
    if pad is not None:
        pad = config.int("pad_token_id", minimum=0)
    vocab = config.int("vocab_size", 128100)
    enc._check_pad(config, pad, vocab)
    max_positions = config.int("max_position_embeddings", 512)
    span, buckets, max_rel = _relative(config, max_positions)
    c2p, p2c = _pos_att_type(config)
    hidden_dropout = enc._dropout(config, "hidden_dropout_prob", 0.1)
    cls_dropout = config.raw("cls_dropout", None)
    cls_dropout = hidden_dropout if cls_dropout is None else enc._dropout(config, "cls_dropout", 0.1)
    return DebertaConfig(
        family=FAMILY, vocab_size=vocab, hidden_size=hidden, embedding_size=config.int("embedding_size", hidden),
        num_layers=config.int("num_hidden_layers", 24), num_heads=heads,
        intermediate_size=config.int("intermediate_size", 6144),
        activation=config.choice("hidden_act", "gelu", enc.ACTIVATIONS),
        layer_norm_eps=config.float("layer_norm_eps", 1e-7, low_open=True), hidden_dropout=hidden_dropout,
        attention_dropout=enc._dropout(config, "attention_probs_dropout_prob", 0.1),
        max_position_embeddings=max_positions, type_vocab_size=config.int("type_vocab_size", 0, minimum=0),
        pad_token_id=pad, position_biased_input=config.bool("position_biased_input", True), span=span,
        position_buckets=buckets, max_relative_positions=max_rel, c2p=c2p, p2c=p2c,
        share_att_key=config.bool("share_att_key", False), norm_rel_ebd=_norm_rel_ebd(config),
        pooler_activation=config.choice("pooler_hidden_act", "gelu", enc.ACTIVATIONS),
        pooler_dropout=enc._dropout(config, "pooler_dropout", 0.0), seqcls_dropout=cls_dropout,
        num_labels=enc._num_labels(config), problem_type=config.choice("problem_type", None, enc.PROBLEM_TYPES),
        tie_word_embeddings=config.bool("tie_word_embeddings", True))


def _norm(config: DebertaConfig, size: int | None = None) -> LayerNorm:
    return LayerNorm(size or config.hidden_size, eps=config.layer_norm_eps)


class DebertaEmbeddings(Module):
    """``embeddings``: LayerNorm(embed_proj(word + position + token type)), then dropout."""

    def __init__(self, config: DebertaConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.word_embeddings = TokenEmbedding(c.vocab_size, c.embedding_size, c.type_vocab_size, attention_mask=True)
        self.position_embeddings = (PositionEmbedding(c.max_position_embeddings, c.embedding_size, 0)
                                    if c.position_biased_input else None)
        self.embed_proj = Linear(c.embedding_size, c.hidden_size, bias=False) \
            if c.embedding_size != c.hidden_size else None
        self.LayerNorm = _norm(c)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "word_embeddings", self.word_embeddings
        if self.position_embeddings is not None:
            yield "position_embeddings", self.position_embeddings
        if self.embed_proj is not None:
            yield "embed_proj", self.embed_proj
        yield "LayerNorm", self.LayerNorm

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        return [module._spec_in(tied) for _, module in self.named_children()] + \
            enc._dropout_spec(self.config.hidden_dropout)


class DebertaLayer(Module):
    """One post-LN layer: LayerNorm(x + attention(x)), then LayerNorm(x + ffn(x)), with
    transformers' names (attention.self.query_proj, ..., intermediate.dense, output.dense)."""

    def __init__(self, config: DebertaConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        e, i = c.hidden_size, c.intermediate_size
        self.q, self.k, self.v = Linear(e, e), Linear(e, e), Linear(e, e)
        self.pos_k = Linear(e, e) if c.c2p and not c.share_att_key else None
        self.pos_q = Linear(e, e) if c.p2c and not c.share_att_key else None
        self.o, self.attention_norm = Linear(e, e), _norm(c)
        self.up, self.down, self.output_norm = Linear(e, i), Linear(i, e), _norm(c)
        own = [("query_proj", self.q), ("key_proj", self.k), ("value_proj", self.v)]
        own += [(n, m) for n, m in (("pos_key_proj", self.pos_k), ("pos_query_proj", self.pos_q)) if m is not None]
        self.attention = enc._Named(("self", enc._Named(*own)),
                                    ("output", enc._Named(("dense", self.o), ("LayerNorm", self.attention_norm))))
        self._tree = (("attention", self.attention), ("intermediate", enc._Named(("dense", self.up))),
                      ("output", enc._Named(("dense", self.down), ("LayerNorm", self.output_norm))))

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter(self._tree)

    def _param_slots(self, prefix: str, relative: list[tuple[Module, str, str]]) -> Iterator[tuple[Module, str, str]]:
        """The parameter uses in the order of the C layers: q, k, v, the relative table (and its
        norm, named by the encoder: `relative`), the position projections, then the rest."""
        at = prefix + "attention.self."
        for name, module in (("query_proj", self.q), ("key_proj", self.k), ("value_proj", self.v)):
            yield from module._named_param_slots(at + name + ".")
        yield from relative
        for name, module in (("pos_key_proj", self.pos_k), ("pos_query_proj", self.pos_q)):
            if module is not None:
                yield from module._named_param_slots(at + name + ".")
        for name, module in (("attention.output.dense", self.o), ("attention.output.LayerNorm", self.attention_norm),
                             ("intermediate.dense", self.up), ("output.dense", self.down),
                             ("output.LayerNorm", self.output_norm)):
            yield from module._named_param_slots(prefix + name + ".")

    def _spec_in_with(self, tied: dict[int, int], table: PositionEmbedding, norm: LayerNorm | None) -> tuple:
        c = self.config
        qkv = ("parallel", [self.q._spec_in(tied), self.k._spec_in(tied), self.v._spec_in(tied)])
        block = [table._spec_in(tied), *([norm._spec_in(tied)] if norm is not None else []),
                 *enc._dropout_spec(c.hidden_dropout)]
        # [pos_key | pos_query]: the layer's key/query projections again (share_att_key: tied uses) or its own
        pos_key = self.k if self.pos_k is None else self.pos_k
        pos_query = self.q if self.pos_q is None else self.pos_q
        projections = [pos_key] * c.c2p + [pos_query] * c.p2c
        block.append(("parallel", [m._spec_in(tied) for m in projections]))
        attention = ("disentangled_attention", c.hidden_size, c.num_heads, c.attention_dropout, c.span,
                     c.position_buckets, c.max_relative_positions, c.c2p, c.p2c, block)
        drop = enc._dropout_spec(c.hidden_dropout)
        return ("sequential", [
            ("residual", [qkv, attention, self.o._spec_in(tied), *drop]), self.attention_norm._spec_in(tied),
            ("residual", [self.up._spec_in(tied), ("activation", c.activation), self.down._spec_in(tied), *drop]),
            self.output_norm._spec_in(tied)])


class DebertaModel(Module):
    """``deberta``: embeddings, ``encoder.layer.{i}``, ``encoder.rel_embeddings`` and
    ``encoder.LayerNorm`` (norm_rel_ebd). The relative table and its norm are used by every
    layer: the C model lays them out at their first use (inside layer 0's attention), so the
    parameter walk lists them there, under the encoder's names."""

    def __init__(self, config: DebertaConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = DebertaEmbeddings(config)
        self.layers = [DebertaLayer(config) for _ in range(config.num_layers)]
        self.rel_embeddings = PositionEmbedding(2 * config.span, config.hidden_size, 0)
        self.rel_norm = _norm(config) if config.norm_rel_ebd else None

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "embeddings", self.embeddings
        for i, layer in enumerate(self.layers):
            yield f"encoder.layer.{i}", layer
        yield "encoder.rel_embeddings", self.rel_embeddings
        if self.rel_norm is not None:
            yield "encoder.LayerNorm", self.rel_norm

    def _named_param_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str]]:
        yield from self.embeddings._named_param_slots(prefix + "embeddings.")
        relative = list(self.rel_embeddings._named_param_slots(prefix + "encoder.rel_embeddings."))
        if self.rel_norm is not None:
            relative += list(self.rel_norm._named_param_slots(prefix + "encoder.LayerNorm."))
        for i, layer in enumerate(self.layers):
            yield from layer._param_slots(f"{prefix}encoder.layer.{i}.", relative)

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        return [*self.embeddings._layers(tied),
                *(layer._spec_in_with(tied, self.rel_embeddings, self.rel_norm) for layer in self.layers)]


class _MLMTransform(Module):
    """``cls.predictions.transform``: dense (hidden -> embedding_size), hidden_act, LayerNorm."""

    def __init__(self, config: DebertaConfig) -> None:
        super().__init__()
        self.activation = config.activation
        self.dense = Linear(config.hidden_size, config.embedding_size)
        self.LayerNorm = _norm(config, config.embedding_size)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "dense", self.dense
        yield "LayerNorm", self.LayerNorm

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        return [self.dense._spec_in(tied), ("activation", self.activation), self.LayerNorm._spec_in(tied)]


class _DebertaHead:
    """What the three DeBERTa heads replace in encoders._EncoderHead (a mixin placed before it)."""

    family = FAMILY
    _config_type = DebertaConfig

    @staticmethod
    def _parse_config(config: HFConfig) -> DebertaConfig:
        return parse_deberta_config(config)

    @staticmethod
    def _base_prefix(family: str) -> str:
        return BASE

    def _build_encoder(self, config: DebertaConfig) -> Module:
        return DebertaModel(config)

    @staticmethod
    def _folder_tensors(spec: tuple[DebertaConfig, dict[str, Any], type]) -> dict[str, tuple[int, ...]]:
        return _tensors(spec)

    @staticmethod
    def _folder_canonical(family: str) -> Any:
        return _canonical

    @property
    def _table_width(self) -> int:
        return self.config.embedding_size

    def extra_repr(self) -> str:
        """The family, sizes, relative-position span and buckets, for repr(model)."""
        c = self.config
        return (f"{c.family}: layers={c.num_layers}, hidden={c.hidden_size}, heads={c.num_heads}, "
                f"vocab={c.vocab_size}, span={c.span}, buckets={c.position_buckets}")


class DebertaV2ForSequenceClassification(_DebertaHead, enc.EncoderForSequenceClassification):
    """transformers' DebertaV2ForSequenceClassification: logits (batch, num_labels) from the first
    token: dropout (pooler_dropout), ``pooler.dense``, pooler_hidden_act, dropout (cls_dropout),
    ``classifier``. Losses as EncoderForSequenceClassification's."""

    pooler = False  # BERT's pooler inside the encoder: DeBERTa's ContextPooler is the head's

    def _build_head(self) -> None:
        c = self.config
        self.pooler_dense = Linear(c.hidden_size, c.hidden_size)
        self.context_pooler = enc._Named(("dense", self.pooler_dense))
        self.classifier = Linear(c.hidden_size, c.num_labels)

    def _head(self) -> Iterator[tuple[str, Module]]:
        yield "pooler", self.context_pooler
        yield "classifier", self.classifier

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        c = self.config
        return [("pool", "cls"), *enc._dropout_spec(c.pooler_dropout), self.pooler_dense._spec_in(tied),
                ("activation", c.pooler_activation), *enc._dropout_spec(c.seqcls_dropout),
                self.classifier._spec_in(tied)]


class DebertaV2ForTokenClassification(_DebertaHead, enc.EncoderForTokenClassification):
    """transformers' DebertaV2ForTokenClassification: logits (batch, T, num_labels): dropout
    (hidden_dropout_prob) and ``classifier`` on every token."""

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        return [*enc._dropout_spec(self.config.hidden_dropout), self.classifier._spec_in(tied)]


class DebertaV2ForMaskedLM(_DebertaHead, enc.EncoderForMaskedLM):
    """transformers' DebertaV2ForMaskedLM with its default (legacy) head: logits (batch, T,
    vocab_size) = ``cls.predictions``: transform (dense to embedding_size, hidden_act,
    LayerNorm), the word embeddings transposed, ``bias``. Labels: token ids, -100 ignored."""

    def _build_head(self) -> None:
        c = self.config
        if not c.tie_word_embeddings:
            raise ValueError("config: field 'tie_word_embeddings' = False: gputrain builds DeBERTa's MLM head with "
                             "the decoder tied to the word embeddings only")
        transform = _MLMTransform(c)
        self.predictions = enc._OutputBias(TiedLinear(self.encoder.embeddings.word_embeddings), c.vocab_size,
                                           (("transform", transform),))
        self._tree = (("cls", enc._Named(("predictions", self.predictions))),)

    def _head(self) -> Iterator[tuple[str, Module]]:
        return iter(self._tree)

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        return self.predictions._layers(tied)


# -- the folder format --------------------------------------------------------------------
def _tensors(spec: tuple[DebertaConfig, dict[str, Any], type]) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint of this config and head holds (transformers' names and shapes)."""
    c, _, cls = spec
    e, emb, i = c.hidden_size, c.embedding_size, c.intermediate_size
    lin, norm = enc._linear, enc._layernorm
    p = f"{BASE}.embeddings."
    shapes: dict[str, tuple[int, ...]] = {p + "word_embeddings.weight": (c.vocab_size, emb)}
    if c.type_vocab_size:
        shapes[p + "token_type_embeddings.weight"] = (c.type_vocab_size, emb)
    if c.position_biased_input:
        shapes[p + "position_embeddings.weight"] = (c.max_position_embeddings, emb)
    if emb != e:
        lin(shapes, p + "embed_proj", emb, e, bias=False)
    norm(shapes, p + "LayerNorm", e)
    for layer in range(c.num_layers):
        p = f"{BASE}.encoder.layer.{layer}."
        names = ["query_proj", "key_proj", "value_proj"]
        if not c.share_att_key:
            names += ["pos_key_proj"] * c.c2p + ["pos_query_proj"] * c.p2c
        for name in names:
            lin(shapes, p + "attention.self." + name, e, e)
        lin(shapes, p + "attention.output.dense", e, e)
        norm(shapes, p + "attention.output.LayerNorm", e)
        lin(shapes, p + "intermediate.dense", e, i)
        lin(shapes, p + "output.dense", i, e)
        norm(shapes, p + "output.LayerNorm", e)
    shapes[f"{BASE}.encoder.rel_embeddings.weight"] = (2 * c.span, e)
    if c.norm_rel_ebd:
        norm(shapes, f"{BASE}.encoder.LayerNorm", e)
    if issubclass(cls, enc.EncoderForSequenceClassification):
        lin(shapes, "pooler.dense", e, e)
        lin(shapes, "classifier", e, c.num_labels)
    elif issubclass(cls, enc.EncoderForTokenClassification):
        lin(shapes, "classifier", e, c.num_labels)
    else:
        lin(shapes, "cls.predictions.transform.dense", e, emb)
        norm(shapes, "cls.predictions.transform.LayerNorm", emb)
        shapes["cls.predictions.bias"] = (c.vocab_size,)
    return shapes


_HEADS = ("pooler", "classifier", "cls", "lm_predictions", "mask_predictions")


def _canonical(name: str, spec: tuple[DebertaConfig, dict[str, Any], type]) -> str | None:
    config, _, cls = spec
    if name.endswith("embeddings.position_ids"):
        return None  # a buffer older files saved
    if name.split(".")[0] not in _HEADS and not name.startswith(BASE + "."):
        name = BASE + "." + name  # a bare DebertaV2Model checkpoint's names
    if name == f"{BASE}.embeddings.position_embeddings.weight" and not config.position_biased_input:
        return None  # transformers ignores it too (_keys_to_ignore_on_load_unexpected)
    if name in ("cls.predictions.decoder.bias", "cls.predictions.decoder.weight"):
        return None  # tied to cls.predictions.bias and the word embeddings
    if name.startswith("mask_predictions.") or name.startswith("lm_predictions."):
        return None  # DeBERTa-v3's pretraining heads (replaced token detection, the newer MLM head): not built
    if name.startswith("pooler.") and not issubclass(cls, enc.EncoderForSequenceClassification):
        return None
    return name


def _register() -> None:
    classes = (DebertaV2ForSequenceClassification, DebertaV2ForTokenClassification, DebertaV2ForMaskedLM)
    heads = {cls.__name__: cls for cls in classes}

    def parse(config: HFConfig) -> tuple[DebertaConfig, dict[str, Any], type]:
        names = config.raw("architectures", None) or [classes[0].__name__]
        if names[0] not in heads:
            raise ValueError(f"{config.path}: field 'architectures' = {names!r}: gputrain's {FAMILY} family builds "
                             f"{', '.join(heads)}")
        parsed = parse_deberta_config(config)
        if heads[names[0]] is DebertaV2ForMaskedLM and not parsed.tie_word_embeddings:
            raise ValueError(f"{config.path}: field 'tie_word_embeddings' = false: gputrain builds DeBERTa's MLM "
                             "head with the decoder tied to the word embeddings only")
        return parsed, dict(config.values), heads[names[0]]

    def build(spec: tuple[DebertaConfig, dict[str, Any], type]) -> Module:
        config, values, cls = spec
        model = cls(config, init_weights=False)
        model.hf_values = values
        return model

    hf_folder.register_family(hf_folder.Family(
        model_type=FAMILY, architectures=tuple(heads), parse=parse, tensors=_tensors,
        canonical=_canonical, build=build))


_register()

__all__ = ["DebertaConfig", "DebertaV2ForMaskedLM", "DebertaV2ForSequenceClassification",
           "DebertaV2ForTokenClassification", "parse_deberta_config"]
