"""config.json of a Hugging Face model folder, read so that no field is silently ignored.

A family reads its fields through :class:`HFConfig`: a field it implements with a typed getter
(``int``, ``float``, ``bool``, ``choice``), one it supports only at transformers' default with
``at_default`` (another value raises ValueError naming the field), and one that cannot change the
arithmetic of the model it builds with ``irrelevant``. ``finish`` then refuses any field nobody
read: a field gputrain does not know might change the result.

Spellings that changed between transformers versions are read in one place: ``dtype`` (written
by transformers >= 5) and ``torch_dtype`` (older files) through :data:`ALIASES`; the rotary
embedding's ``rope_parameters`` (transformers >= 5) and ``rope_theta`` + ``rope_scaling`` (older)
through :meth:`HFConfig.rope_parameters`. Both spellings with different values are refused.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

# field -> its older spellings (same meaning)
ALIASES: dict[str, tuple[str, ...]] = {"dtype": ("torch_dtype",)}

# PretrainedConfig's own fields that no family's arithmetic depends on: bookkeeping, token ids
# (used by tokenizers and generation, not by the forward pass), labels of heads gputrain does not
# build, what the forward returns, and generation defaults older transformers wrote into config.json.
GENERIC_IRRELEVANT = (
    "architectures", "model_type", "transformers_version", "_name_or_path", "_commit_hash",
    "_attn_implementation_autoset", "attn_implementation", "_attn_implementation",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "output_hidden_states", "output_attentions", "return_dict", "torchscript", "use_bfloat16",
    "id2label", "label2id", "_num_labels", "num_labels", "problem_type", "finetuning_task", "prefix",
    "task_specific_params", "tokenizer_class", "initializer_range", "tie_encoder_decoder",
    "chunk_size_feed_forward", "tf_legacy_loss", "output_scores", "return_dict_in_generate",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
)

# transformers' dtype names -> gputrain's precision names
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

_REQUIRED = object()


class HFConfig:
    """The fields of one config.json, with a record of which ones were read."""

    def __init__(self, values: dict[str, Any], path: str) -> None:
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(values).__name__}")
        self.values = values
        self.path = path
        self.read: set[str] = set()

    @classmethod
    def load(cls, folder: str) -> HFConfig:
        """Reads ``folder/config.json`` (FileNotFoundError without it, ValueError if it is not JSON)."""
        path = os.path.join(folder, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no config.json (a Hugging Face model folder has one)")
        try:
            with open(path, encoding="utf-8") as file:
                values = json.load(file)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        return cls(values, path)

    def _error(self, name: str, message: str) -> ValueError:
        return ValueError(f"{self.path}: field {name!r} {message}")

    def has(self, name: str) -> bool:
        """True when config.json holds `name` or one of its older spellings."""
        return any(n in self.values for n in (name, *ALIASES.get(name, ())))

    def raw(self, name: str, default: Any = _REQUIRED) -> Any:
        """The value under `name` or one of its older spellings (both present must agree)."""
        spellings = [n for n in (name, *ALIASES.get(name, ())) if n in self.values]
        self.read.update(spellings)
        if not spellings:
            if default is _REQUIRED:
                raise self._error(name, "is missing")
            return default
        values = [self.values[n] for n in spellings]
        if any(v != values[0] for v in values[1:]):
            raise self._error(name, f"disagrees with {spellings[1]!r}: {values[0]!r} and {values[1]!r}")
        return values[0]

    def int(self, name: str, default: Any = _REQUIRED, minimum: int = 1) -> int:
        """The field `name` (or `default` when absent) as an int >= `minimum`; ValueError naming the field
        otherwise."""
        value = self.raw(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._error(name, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def float(self, name: str, default: Any = _REQUIRED, low: float = 0.0, high: float = math.inf,
              low_open: bool = False) -> float:
        """The field `name` (or `default`) as a finite number in [low, high] ((low, high] with low_open);
        ValueError naming the field otherwise."""
        value = self.raw(name, default)
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not ok or not (low < value if low_open else low <= value) or not value <= high:
            bound = f"in ({low}, {high}]" if low_open else f"in [{low}, {high}]"
            raise self._error(name, f"must be a number {bound}, got {value!r}")
        return float(value)

    def bool(self, name: str, default: Any = _REQUIRED) -> bool:
        """The field `name` (or `default`) as true/false; ValueError naming the field otherwise."""
        value = self.raw(name, default)
        if not isinstance(value, bool):
            raise self._error(name, f"must be true or false, got {value!r}")
        return value

    def choice(self, name: str, default: Any, allowed: dict[Any, Any]) -> Any:
        """allowed[value]: the values gputrain implements, mapped to what it builds."""
        value = self.raw(name, default)
        if not isinstance(value, (str, int, float, bool, type(None))) or value not in allowed:
            raise self._error(name, f"= {value!r} is not supported (gputrain implements "
                                    f"{', '.join(map(repr, allowed))})")
        return allowed[value]

    def at_default(self, name: str, default: Any) -> None:
        """Accepts the field only at transformers' default: gputrain does not implement the others."""
        value = self.raw(name, default)
        if value != default or type(value) is not type(default):
            raise self._error(name, f"= {value!r} is not supported: gputrain implements only {default!r}")

    def irrelevant(self, *names: str) -> None:
        """Fields that cannot change the arithmetic of the model being built."""
        for name in names:
            self.read.update(n for n in (name, *ALIASES.get(name, ())) if n in self.values)

    def dtype(self) -> str | None:
        """The precision the weights were saved in (gputrain's name), or None when not given."""
        value = self.raw("dtype", None)
        if value is None:
            return None
        if value not in DTYPES:
            raise self._error("dtype", f"= {value!r} is not a dtype gputrain knows ({', '.join(DTYPES)})")
        return DTYPES[value]

    def rope_parameters(self) -> dict[str, Any] | None:
        """The rotary embedding's parameters in transformers >= 5's form (``{"rope_type": ...,
        "rope_theta": ..., ...}``), from ``rope_parameters`` or from the older ``rope_theta`` and
        ``rope_scaling`` (whose ``type`` is ``rope_type``); None when the file has neither."""
        new = self.raw("rope_parameters", None)
        theta, scaling = self.raw("rope_theta", None), self.raw("rope_scaling", None)
        if new is not None and not isinstance(new, dict):
            raise self._error("rope_parameters", f"must be an object, got {new!r}")
        if scaling is not None and not isinstance(scaling, dict):
            raise self._error("rope_scaling", f"must be an object or null, got {scaling!r}")
        if new is None and theta is None and scaling is None:
            return None
        old: dict[str, Any] = dict(scaling or {})
        if "type" in old:
            old.setdefault("rope_type", old.pop("type"))
        old.setdefault("rope_type", "default")
        if theta is not None:
            old["rope_theta"] = theta
        if new is None:
            return old
        merged = {"rope_type": "default", **new}
        for key, value in old.items():
            if (theta is not None or scaling is not None) and key in merged and merged[key] != value:
                raise self._error("rope_parameters", f"disagrees with rope_theta/rope_scaling on {key!r}: "
                                                     f"{merged[key]!r} and {value!r}")
        return merged

    def finish(self, family: str) -> None:
        """Refuses the fields nobody read (ValueError naming them)."""
        self.irrelevant(*GENERIC_IRRELEVANT)
        unread = sorted(set(self.values) - self.read)
        if unread:
            raise ValueError(f"{self.path}: field {unread[0]!r} is not known to gputrain's {family} family "
                             f"({len(unread)} unknown field(s): {', '.join(unread)}); it might change the "
                             "arithmetic, so the checkpoint is refused rather than loaded without it")
