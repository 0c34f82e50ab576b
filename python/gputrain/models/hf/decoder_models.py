"""The Llama-like decoder families (issue 21): ``llama``, ``qwen2``, ``qwen3``, ``mistral``,
``gemma`` and ``gemma3_text``, each as ``...ForCausalLM`` and ``...ForSequenceClassification``.

transformers writes one modeling file per family, but the six differ only in what
:class:`~gputrain.models.hf.decoders.DecoderConfig` says (biases, QK-norm, Gemma's (1 + w) norms
and embedding scale, Gemma3's extra norms, windows, ropes, soft-capping), so one module tree
builds them all, under Hugging Face's names, so that ``state_dict()`` is transformers' and adapters
can target modules by name::

    model.embed_tokens                                   TokenEmbedding (ids | mask | position ids)
    model.layers.{i}.input_layernorm                     RMSNorm
    model.layers.{i}.self_attn.q_proj (.q_norm), k_proj (.k_norm), v_proj, o_proj
    model.layers.{i}.post_attention_layernorm            RMSNorm (Llama: before the MLP; Gemma3: after
                                                         the attention, then pre_feedforward_layernorm)
    model.layers.{i}.mlp.gate_proj, up_proj, down_proj
    model.layers.{i}.post_feedforward_layernorm          Gemma3 only
    model.norm
    lm_head (ForCausalLM; tied: the embedding's table) | score (ForSequenceClassification)

Each module lists its children in the order its layers run (so ``state_dict()`` has transformers'
names, in an order that may differ from transformers' where q_norm/k_norm sit). The C layers
behind them (csrc/nn): q/k/v projections run as one ``parallel`` layer whose output
[q | k | v] feeds ``rope`` and the grouped-query ``attention``; gate/up as one ``parallel``
feeding ``glu``. Fusing them is the kernels' business; the module tree stays transformers'.

The input: ``model(input_ids, attention_mask=None, position_ids=None)``. A row's tokens attend
causally within their segment: segments split where the mask changes and where position ids
restart at 0 (a packed document), so left padding, right padding and packed rows all work; a
missing mask is all ones, missing position ids 0..T-1 per row (transformers' defaults).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from gputrain import random
from gputrain.models.hf import folder as hf_folder
from gputrain.models.hf.config import HFConfig
from gputrain.models.hf.decoders import DecoderConfig, Rope, parse_decoder_config
from gputrain.models.hf.safetensors_io import checkpoint_tensors
from gputrain.nn.embedding import TiedLinear
from gputrain.nn.layers import Linear, RMSNorm
from gputrain.nn.module import Module, planning_active
from gputrain.nn.qlinear import LinearFactory, QLinear
from gputrain.nn.sequence import QTokenEmbedding, TokenEmbedding



def _rope_spec(rope: Rope, heads: int, kv_heads: int) -> tuple:
    return ("rope", heads, kv_heads, rope.head_dim, rope.rope_type, rope.theta, rope.factor, rope.low_freq_factor,
            rope.high_freq_factor, float(rope.original_max_position_embeddings), rope.attention_factor,
            rope.beta_fast, rope.beta_slow, rope.truncate)


def _norm(config: DecoderConfig, size: int, groups: int = 1) -> RMSNorm:
    return RMSNorm(size, eps=config.rms_norm_eps, plus_one=config.norm_plus_one, groups=groups)


class DecoderAttention(Module):
    """``self_attn``: q_proj (+ q_norm), k_proj (+ k_norm), v_proj, the rotary embedding,
    grouped-query attention (causal, within the layer's sliding window) and o_proj."""

    def __init__(self, config: DecoderConfig, layer: int, linear: LinearFactory = Linear) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.window = c.windows[layer]
        self.rope = c.ropes[layer]
        self.scale = c.attention_scale
        self.q_proj = linear(c.hidden_size, c.num_heads * c.head_dim, c.qkv_bias)
        self.k_proj = linear(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias)
        self.v_proj = linear(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias)
        self.o_proj = linear(c.num_heads * c.head_dim, c.hidden_size, c.o_bias)
        self.q_norm = _norm(c, c.head_dim, c.num_heads) if c.qk_norm else None
        self.k_norm = _norm(c, c.head_dim, c.num_kv_heads) if c.qk_norm else None

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "q_proj", self.q_proj
        if self.q_norm is not None:
            yield "q_norm", self.q_norm
        yield "k_proj", self.k_proj
        if self.k_norm is not None:
            yield "k_norm", self.k_norm
        yield "v_proj", self.v_proj
        yield "o_proj", self.o_proj

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        def projection(proj: Module, norm: RMSNorm | None) -> tuple:
            spec = proj._spec_in(tied)
            return spec if norm is None else ("sequential", [spec, norm._spec_in(tied)])

        qkv = ("parallel", [projection(self.q_proj, self.q_norm), projection(self.k_proj, self.k_norm),
                            self.v_proj._spec_in(tied)])
        heads, kv, dim = self.num_heads, self.num_kv_heads, self.head_dim
        attention = ("attention", heads * dim, heads, 0.0, True, kv, dim, self.window or 0, self.scale)
        return [qkv, _rope_spec(self.rope, heads, kv), attention, self.o_proj._spec_in(tied)]

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"window={self.window}, rope={self.rope.rope_type}")


class DecoderMLP(Module):
    """``mlp``: down_proj(act(gate_proj(x)) * up_proj(x)), act SiLU (SwiGLU) or tanh-GELU (GeGLU)."""

    def __init__(self, config: DecoderConfig, linear: LinearFactory = Linear) -> None:
        super().__init__()
        c = config
        self.activation = c.activation
        self.gate_proj = linear(c.hidden_size, c.intermediate_size, c.mlp_bias)
        self.up_proj = linear(c.hidden_size, c.intermediate_size, c.mlp_bias)
        self.down_proj = linear(c.intermediate_size, c.hidden_size, c.mlp_bias)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter((("gate_proj", self.gate_proj), ("up_proj", self.up_proj), ("down_proj", self.down_proj)))

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        return [("parallel", [self.gate_proj._spec_in(tied), self.up_proj._spec_in(tied)]),
                ("glu", self.activation), self.down_proj._spec_in(tied)]

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


class DecoderLayer(Module):
    """x + attention(input_layernorm(x)), then x + mlp(post_attention_layernorm(x)); Gemma3
    (sandwich norms): x + post_attention_layernorm(attention(input_layernorm(x))), then
    x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))."""

    def __init__(self, config: DecoderConfig, layer: int, linear: LinearFactory = Linear) -> None:
        super().__init__()
        size = config.hidden_size
        self.sandwich = config.sandwich_norms
        self.input_layernorm = _norm(config, size)
        self.self_attn = DecoderAttention(config, layer, linear)
        self.post_attention_layernorm = _norm(config, size)
        self.pre_feedforward_layernorm = _norm(config, size) if self.sandwich else None
        self.mlp = DecoderMLP(config, linear)
        self.post_feedforward_layernorm = _norm(config, size) if self.sandwich else None

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "input_layernorm", self.input_layernorm
        yield "self_attn", self.self_attn
        yield "post_attention_layernorm", self.post_attention_layernorm
        if self.sandwich:
            yield "pre_feedforward_layernorm", self.pre_feedforward_layernorm
        yield "mlp", self.mlp
        if self.sandwich:
            yield "post_feedforward_layernorm", self.post_feedforward_layernorm

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        attention = [self.input_layernorm._spec_in(tied), *self.self_attn._layers(tied)]
        if self.sandwich:
            attention.append(self.post_attention_layernorm._spec_in(tied))
            mlp = [self.pre_feedforward_layernorm._spec_in(tied), *self.mlp._layers(tied),
                   self.post_feedforward_layernorm._spec_in(tied)]
        else:
            mlp = [self.post_attention_layernorm._spec_in(tied), *self.mlp._layers(tied)]
        # One unit of gradient checkpointing, as transformers checkpoints a decoder layer: only its
        # input is kept, and both residual blocks are recomputed in backward (not each its own input).
        return ("checkpoint", [("residual", attention), ("residual", mlp)])


class DecoderModel(Module):
    """``model``: embed_tokens (times sqrt(hidden_size) in Gemma), the layers, the final norm."""

    def __init__(self, config: DecoderConfig, linear: LinearFactory = Linear) -> None:
        super().__init__()
        c = config
        self.embed_tokens = TokenEmbedding(c.vocab_size, c.hidden_size, 0, attention_mask=True, position_ids=True,
                                           pad_token_id=c.pad_token_id)
        self.embed_scale = c.embed_scale
        self.layers = [DecoderLayer(c, i, linear) for i in range(c.num_layers)]
        self.norm = _norm(c, c.hidden_size)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "embed_tokens", self.embed_tokens
        for i, layer in enumerate(self.layers):
            yield f"layers.{i}", layer
        yield "norm", self.norm

    def _layers(self, tied: dict[int, int]) -> list[tuple]:
        scale = [("scale", self.embed_scale)] if self.embed_scale != 1.0 else []
        return [self.embed_tokens._spec_in(tied), *scale, *(layer._spec_in(tied) for layer in self.layers),
                self.norm._spec_in(tied)]


class _DecoderHead(Module):
    """What both heads share: the config, the call, weights by HF names, folders."""

    family = ""  # model_type, set by each family's subclass

    def __init__(self, config: DecoderConfig | Mapping[str, Any], *, init_weights: bool = True,
                 linear: LinearFactory = Linear) -> None:
        """config: a config.json mapping (as transformers' ...Config fields) or a parsed
        DecoderConfig. init_weights=False skips transformers' initialisation (from_pretrained,
        which writes every parameter next, builds so). linear builds the decoder blocks' Linear
        layers (quantized_linears(...): QLinear with frozen 4-bit weights; the embedding and the
        head stay float)."""
        super().__init__()
        if isinstance(config, Mapping):
            config, values = _parse_values(dict(config), self.family)
        elif isinstance(config, DecoderConfig):
            values = None
        else:
            raise TypeError(f"config must be a DecoderConfig or a config.json mapping, not {type(config).__name__}")
        if self.family and config.family != self.family:
            raise ValueError(f"config: model_type {config.family!r} is not {type(self).__name__}'s {self.family!r}")
        self.config = config
        self.hf_values = values  # config.json's fields as read (None: built from a DecoderConfig)
        self.model = DecoderModel(config, linear)
        self._build_head()
        self._compile()
        if init_weights:
            self._init_weights(random.next_seed())

    def _build_head(self) -> None:
        raise NotImplementedError

    def _spec_list(self, tied: dict[int, int] | None = None) -> list[tuple]:
        tied = {} if tied is None else tied
        return [*self.model._layers(tied), *self._head_layers(tied)]

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("sequential", self._spec_list(tied))

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        raise NotImplementedError

    def _init_weights(self, seed: int, std: float = 0.02) -> None:
        """transformers' _init_weights: N(0, std) matrices and embeddings, zero biases, RMSNorm
        weights 1 (Gemma's (1 + w) norms: 0)."""
        rng = np.random.default_rng(seed)
        values = {}
        quantized = {name: module for name, module in self.named_modules() if isinstance(module, QLinear)}
        for name, module in quantized.items():  # N(0, std), quantized
            module.quantize_(rng.normal(0.0, std, (module.out_features, module.in_features)).astype(np.float32))
        for name, value in self.state_dict().items():
            if name.split(".weight")[0] in quantized:  # written above: its weight and absmax (nested too)
                continue
            if name.endswith("bias"):
                values[name] = np.zeros_like(value)
            elif value.ndim == 1:  # a norm's weight
                values[name] = np.full_like(value, 0.0 if self.config.norm_plus_one else 1.0)
            else:
                values[name] = rng.normal(0.0, std, value.shape).astype(np.float32)
        self.load_state_dict(values, strict=not quantized)  # quantized layers: written above

    def __call__(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None) -> np.ndarray:
        """The logits: (batch, T, vocab_size) for a causal LM, (batch, num_labels) for a
        classifier, of input_ids (batch, T) with an optional 0/1 attention_mask and position ids
        (defaults: ones, and 0..T-1 per row); (batch, 3, T) rows packed by
        gputrain.nn.sequence.pack_for are taken as they are."""
        return super().__call__(input_ids, attention_mask, None, position_ids)

    def quantize_embeddings_(self, quant_type: str = "nf4", blocksize: int = 64, *,
                             double_quant: bool = False) -> _DecoderHead:
        """Holds the token table and an untied LM head frozen in 4 bits (NF4 or FP4, absmax blocks of
        `blocksize`, bitsandbytes' layouts): the table as a QTokenEmbedding (its lookup dequantizes the
        rows it reads), the head as a QLinear -- the embeddings transformers + bitsandbytes keep in 16
        bits, about 2 bytes a weight, now half a byte. Returns the model, compiled anew on its device
        with its precision, seed and step; a layer already quantized stays as it is. Refused, with
        nothing changed: a tied head (tie_word_embeddings: its GEMMs read a float32 or half table, not 4 bits),
        hidden_size not a multiple of blocksize, a model inside another (quantize before
        gputrain.peft.get_peft_model). The values are quantized from the float32 ones (under
        gputrain.memory_plan.planning(): the configuration only). double_quant: the head's absmax
        held double-quantized (QLinear's); the table's stays float32, which its lookup reads."""
        return self._quantize_embeddings(quant_type, blocksize, with_values=not planning_active(),
                                         double_quant=double_quant)

    def _quantize_embeddings(self, quant_type: str, blocksize: int, with_values: bool = False,
                             double_quant: bool = False) -> _DecoderHead:
        """See quantize_embeddings_; with_values False builds the layers with zero codes (from_pretrained
        quantizes the stored values into them as it reads them)."""
        if self._owner is not None:
            raise ValueError("quantize_embeddings_: this model is inside another (e.g. a PeftModel); quantize the "
                             "embeddings before gputrain.peft.get_peft_model")
        head = getattr(self, "lm_head", None)
        if isinstance(head, TiedLinear):
            raise ValueError("quantize_embeddings_: the LM head is tied to the token table (tie_word_embeddings), "
                             "which it reads as a float32 parameter; only an untied model's embeddings are quantized")
        table, new_table, new_head = self.model.embed_tokens, self.model.embed_tokens, head
        with random.sequence_kept():  # building layers draws no seed from the user's sequence
            if not isinstance(table, QTokenEmbedding):
                new_table = (QTokenEmbedding.from_token_embedding(table, quant_type, blocksize) if with_values else
                             QTokenEmbedding(table.num_embeddings, table.embedding_dim, attention_mask=True,
                                             position_ids=True, pad_token_id=table.pad_token_id, quant_type=quant_type,
                                             blocksize=blocksize))
            if type(head) is Linear:
                new_head = (QLinear.from_linear(head, quant_type, blocksize, double_quant=double_quant) if with_values
                            else QLinear(head.in_features, head.out_features, head.has_bias, quant_type, blocksize,
                                         double_quant=double_quant))
        old = self._compiled.model
        self.model.embed_tokens = new_table
        if new_head is not head:
            self.lm_head = new_head
        try:
            self._compile(old.device, seed=old.seed, precision=old.precision)
        except BaseException:  # e.g. out of memory: the model is left as it was
            self.model.embed_tokens = table
            if new_head is not head:
                self.lm_head = head
            raise
        self._compiled.model.step, self._compiled.model.checkpointing = old.step, old.checkpointing
        return self

    # -- the folder format (gputrain.models.hf.folder) --------------------------------------
    def _hf_targets(self) -> tuple[dict[str, Any], dict[str, QLinear | QTokenEmbedding]]:
        """(parameters by name, quantized layers (QLinear, QTokenEmbedding) by their weight's name),
        kept while loading."""
        if "_hf_slots" not in self.__dict__:
            self._hf_slots = dict(self.named_parameters())
            self._hf_quantized = {n + ".weight": m for n, m in self.named_modules()
                                  if isinstance(m, (QLinear, QTokenEmbedding))}
        return self._hf_slots, self._hf_quantized

    def _hf_load_tensor(self, name: str, array: np.ndarray) -> None:
        slots, quantized = self._hf_targets()
        if name in quantized:  # quantized as it loads: one float weight in memory at a time
            quantized[name].quantize_(array)
            return
        slots[name].data = array

    def _hf_load_quantized(self, name: str, packed: np.ndarray, state: Any) -> None:
        """A bitsandbytes weight (packed 4-bit bytes and its QuantState, or int8 codes and their SCB)
        into the QLinear `name` names."""
        self._hf_targets()[1][name].load_quantized(packed, state)

    def _hf_loaded(self) -> None:
        self.__dict__.pop("_hf_slots", None)
        self.__dict__.pop("_hf_quantized", None)
        self.compiled.refresh_half_parameters()

    def _hf_config(self) -> dict[str, Any]:
        if any((isinstance(m, QLinear) and not m.is_half) or isinstance(m, QTokenEmbedding) for m in self.modules()):
            raise ValueError("save_pretrained: this model holds quantized (QLinear, QTokenEmbedding) layers; gputrain "
                             "saves float folders only (dequantize the layers into a float model to save it)")
        if self.hf_values is None:
            raise ValueError("save_pretrained: this model was built from a DecoderConfig; build it from a "
                             "config.json mapping (e.g. LlamaForCausalLM({...})) to save it as a folder")
        values = {k: v for k, v in self.hf_values.items() if k != "torch_dtype"}
        values.update(architectures=[type(self).__name__], dtype="float32")
        return values

    def save_pretrained(self, folder: Any, max_shard_size: int | str = hf_folder.DEFAULT_MAX_SHARD_SIZE) -> None:
        """See gputrain.models.hf.save_pretrained."""
        hf_folder.save_pretrained(self, folder, max_shard_size)

    def extra_repr(self) -> str:
        c = self.config
        return (f"{c.family}: layers={c.num_layers}, hidden={c.hidden_size}, heads={c.num_heads}/{c.num_kv_heads}, "
                f"head_dim={c.head_dim}, vocab={c.vocab_size}")


class DecoderForCausalLM(_DecoderHead):
    """A decoder with its LM head: logits (batch, T, vocab_size); Gemma3 soft-caps them
    (cap * tanh(logits / cap)). Labels for HF-style batches are the input ids: :meth:`shift_labels`
    makes the (batch, T) targets of position t the token t + 1 (-100 at the end)."""

    def _build_head(self) -> None:
        c = self.config
        embed = self.model.embed_tokens
        self.lm_head = TiedLinear(embed) if c.tie_word_embeddings else Linear(c.hidden_size, c.vocab_size, bias=False)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "model", self.model
        yield "lm_head", self.lm_head

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        cap = self.config.final_logit_softcapping
        capping = [("scale", 1.0 / cap), ("activation", "tanh"), ("scale", cap)] if cap else []
        return [self.lm_head._spec_in(tied), *capping]

    @staticmethod
    def shift_labels(labels: Any, ignore_index: int = -100) -> np.ndarray:
        """transformers' causal-LM targets: position t predicts labels[t + 1]; the last position
        and ignored labels give ignore_index."""
        labels = np.asarray(labels)
        if labels.ndim != 2 or labels.dtype.kind not in "iu":
            raise ValueError(f"labels must be a 2-D integer array (batch, T), got {labels.dtype} {labels.shape}")
        targets = np.full(labels.shape, ignore_index, np.int64)
        targets[:, :-1] = labels[:, 1:]
        return targets

    def generate(self, input_ids: Any, max_new_tokens: int, **kwargs: Any) -> np.ndarray:
        """See gputrain.models.hf.generation.generate: the prompt followed by the new tokens,
        greedy unless do_sample=True (transformers' default). Its NumPy loop reads float32
        weights: a quantized or half layer's (QLinear, HalfTokenEmbedding) are widened for it (held
        while it runs)."""
        from gputrain.models.hf.generation import generate

        return generate(self.config, hf_folder.float_state_dict(self), input_ids, max_new_tokens, **kwargs)


class DecoderForSequenceClassification(_DecoderHead):
    """A decoder with transformers' classification head: ``score`` (no bias) on the last token
    that is not ``pad_token_id`` (the last one when no id is set), logits (batch, num_labels)."""

    def _build_head(self) -> None:
        c = self.config
        self.score = Linear(c.hidden_size, c.num_labels, bias=False)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield "model", self.model
        yield "score", self.score

    def _head_layers(self, tied: dict[int, int]) -> list[tuple]:
        return [("pool", "last"), self.score._spec_in(tied)]

    @classmethod
    def from_pretrained(cls, folder: Any, *, num_labels: int | None = None, problem_type: str | None = None,
                        dtype: Any = None, device: str | None = None) -> DecoderForSequenceClassification:
        """This classifier over the decoder of any checkpoint of its family (transformers'
        ``AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3)``): a causal-LM
        checkpoint gives ``model.*``, its LM head is left out, and ``score`` starts at
        transformers' init (N(0, 0.02)) unless the folder holds one of this shape. num_labels /
        problem_type replace config.json's. Every tensor is checked before the model is built."""
        folder = os.fspath(folder)
        config = HFConfig.load(folder)
        values = dict(config.values)
        if values.get("model_type") != cls.family:
            raise ValueError(f"{config.path}: field 'model_type' = {values.get('model_type')!r}: {cls.__name__} "
                             f"loads {cls.family!r} checkpoints")
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
        parsed = parse_decoder_config(hf)
        precision = hf_folder._precision(dtype, hf)
        spec = (parsed, values, cls)
        expected = _tensors(spec)
        found = {}
        for name, ref in checkpoint_tensors(folder).items():
            key = _canonical(name, spec)
            if key is None or (key == "score.weight" and ref.shape != expected[key]):
                continue  # the LM head, a buffer, or another task's classifier
            if key not in expected:
                raise ValueError(f"{ref.path}: unexpected tensor {name!r} (a {cls.family} checkpoint of this "
                                 "config.json does not have it)")
            if ref.shape != expected[key]:
                raise ValueError(f"{ref.path}: tensor {name!r} has shape {ref.shape}, config.json implies "
                                 f"{expected[key]}")
            found[key] = ref
        missing = [k for k in expected if k not in found and k != "score.weight"]
        if missing:
            raise ValueError(f"{folder}: tensor {missing[0]!r} is missing from the checkpoint "
                             f"({len(missing)} missing in all)")
        model = cls(values)  # transformers' init for the score when the folder has none
        return hf_folder.load_tensors(model, found, precision, device)


def _parse_values(values: dict[str, Any], family: str) -> tuple[DecoderConfig, dict[str, Any]]:
    if family:
        values.setdefault("model_type", family)
    return parse_decoder_config(HFConfig(values, "config")), values


# -- one family per model_type: the two head classes, and the folder format -------------------
def _tensors(spec: tuple[DecoderConfig, dict[str, Any], type]) -> dict[str, tuple[int, ...]]:
    c, _, cls = spec
    e, d = c.hidden_size, c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, e)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (e,)
        for proj, rows in (("q_proj", c.num_heads * d), ("k_proj", c.num_kv_heads * d), ("v_proj", c.num_kv_heads * d)):
            shapes[f"{p}self_attn.{proj}.weight"] = (rows, e)
            if c.qkv_bias:
                shapes[f"{p}self_attn.{proj}.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (e, c.num_heads * d)
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (e,)
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (e,)
        if c.sandwich_norms:
            shapes[p + "pre_feedforward_layernorm.weight"] = shapes[p + "post_feedforward_layernorm.weight"] = (e,)
        for proj, shape in (("gate_proj", (c.intermediate_size, e)), ("up_proj", (c.intermediate_size, e)),
                            ("down_proj", (e, c.intermediate_size))):
            shapes[f"{p}mlp.{proj}.weight"] = shape
            if c.mlp_bias:
                shapes[f"{p}mlp.{proj}.bias"] = (shape[0],)
    shapes["model.norm.weight"] = (e,)
    if issubclass(cls, DecoderForSequenceClassification):
        shapes["score.weight"] = (c.num_labels, e)
    elif not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, e)
    return shapes


def _canonical(name: str, spec: tuple[DecoderConfig, dict[str, Any], type]) -> str | None:
    c, _, cls = spec
    if name == "lm_head.weight" and (c.tie_word_embeddings or issubclass(cls, DecoderForSequenceClassification)):
        return None  # the embedding's table, or a head this class does not have
    if name.endswith(".rotary_emb.inv_freq"):
        return None  # a buffer older files saved
    if name in ("lm_head.weight", "score.weight") or name.startswith("model."):
        return name
    return "model." + name  # a bare ...Model checkpoint's names


def _quantizable(spec: tuple[DecoderConfig, dict[str, Any], type]) -> list[str]:
    """The weights of the decoder blocks' Linear layers (what quantization= quantizes; the
    embedding, the norms and the head stay float, as bitsandbytes' default skips lm_head)."""
    c = spec[0]
    return [f"model.layers.{i}.{proj}.weight" for i in range(c.num_layers)
            for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


def _register(model_type: str, causal: type, classify: type, bare: str) -> None:
    heads = {cls.__name__: cls for cls in (causal, classify)}

    def parse(config: HFConfig) -> tuple[DecoderConfig, dict[str, Any], type]:
        names = config.raw("architectures", None) or [causal.__name__]
        cls = heads.get(names[0], causal)  # the bare model's checkpoint builds the causal LM
        return parse_decoder_config(config), dict(config.values), cls

    def build(spec: tuple[DecoderConfig, dict[str, Any], type], linear: LinearFactory = Linear) -> _DecoderHead:
        config, values, cls = spec
        model = cls(config, init_weights=False, linear=linear)
        model.hf_values = values
        return model

    hf_folder.register_family(hf_folder.Family(
        model_type=model_type, architectures=(causal.__name__, classify.__name__, bare), parse=parse,
        tensors=_tensors, canonical=_canonical, build=build, quantizable=_quantizable))


class LlamaForCausalLM(DecoderForCausalLM):
    """transformers' LlamaForCausalLM (model_type 'llama'): see DecoderForCausalLM."""

    family = "llama"


class LlamaForSequenceClassification(DecoderForSequenceClassification):
    """transformers' LlamaForSequenceClassification (model_type 'llama'): see DecoderForSequenceClassification."""

    family = "llama"


_register("llama", LlamaForCausalLM, LlamaForSequenceClassification, "LlamaModel")


class Qwen2ForCausalLM(DecoderForCausalLM):
    """transformers' Qwen2ForCausalLM (model_type 'qwen2'): see DecoderForCausalLM."""

    family = "qwen2"


class Qwen2ForSequenceClassification(DecoderForSequenceClassification):
    """transformers' Qwen2ForSequenceClassification (model_type 'qwen2'): see DecoderForSequenceClassification."""

    family = "qwen2"


_register("qwen2", Qwen2ForCausalLM, Qwen2ForSequenceClassification, "Qwen2Model")


class Qwen3ForCausalLM(DecoderForCausalLM):
    """transformers' Qwen3ForCausalLM (model_type 'qwen3'): see DecoderForCausalLM."""

    family = "qwen3"


class Qwen3ForSequenceClassification(DecoderForSequenceClassification):
    """transformers' Qwen3ForSequenceClassification (model_type 'qwen3'): see DecoderForSequenceClassification."""

    family = "qwen3"


_register("qwen3", Qwen3ForCausalLM, Qwen3ForSequenceClassification, "Qwen3Model")


class MistralForCausalLM(DecoderForCausalLM):
    """transformers' MistralForCausalLM (model_type 'mistral'): see DecoderForCausalLM."""

    family = "mistral"


class MistralForSequenceClassification(DecoderForSequenceClassification):
    """transformers' MistralForSequenceClassification (model_type 'mistral'): see DecoderForSequenceClassification."""

    family = "mistral"


_register("mistral", MistralForCausalLM, MistralForSequenceClassification, "MistralModel")


class GemmaForCausalLM(DecoderForCausalLM):
    """transformers' GemmaForCausalLM (model_type 'gemma'): see DecoderForCausalLM."""

    family = "gemma"


class GemmaForSequenceClassification(DecoderForSequenceClassification):
    """transformers' GemmaForSequenceClassification (model_type 'gemma'): see DecoderForSequenceClassification."""

    family = "gemma"


_register("gemma", GemmaForCausalLM, GemmaForSequenceClassification, "GemmaModel")


class Gemma3ForCausalLM(DecoderForCausalLM):
    """transformers' Gemma3ForCausalLM (model_type 'gemma3_text'): see DecoderForCausalLM."""

    family = "gemma3_text"


class Gemma3TextForSequenceClassification(DecoderForSequenceClassification):
    """transformers' Gemma3TextForSequenceClassification (model_type 'gemma3_text'): see
    DecoderForSequenceClassification."""

    family = "gemma3_text"


_register("gemma3_text", Gemma3ForCausalLM, Gemma3TextForSequenceClassification, "Gemma3TextModel")

__all__ = ["DecoderForCausalLM", "DecoderForSequenceClassification", "Gemma3ForCausalLM",
           "Gemma3TextForSequenceClassification", "GemmaForCausalLM", "GemmaForSequenceClassification",
           "LlamaForCausalLM", "LlamaForSequenceClassification", "MistralForCausalLM",
           "MistralForSequenceClassification", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification",
           "Qwen3ForCausalLM", "Qwen3ForSequenceClassification"]
