"""Reading a Hugging Face tokenizer folder's settings: tokenizer_config.json, special_tokens_map.json
and config.json (for the model type when no tokenizer class is named). JSON only; nothing is
unpickled. Every error names the file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: transformers' largest "no limit" model_max_length (int(1e30)) and the threshold above which it
#: means "no limit" (LARGE_INTEGER, int(1e20)).
VERY_LARGE_INTEGER = int(1e30)
LARGE_INTEGER = int(1e20)

SPECIAL_NAMES = ("cls", "sep", "pad", "unk", "mask", "bos", "eos")

# The model inputs a tokenizer class returns by default (its `model_input_names` in transformers);
# any other class gets transformers' default (PreTrainedTokenizerBase).
_DEFAULT_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
_NO_TYPE_IDS = ("input_ids", "attention_mask")
_INPUTS_BY_FAMILY = {
    "bert": _DEFAULT_INPUTS, "distilbert": _NO_TYPE_IDS, "roberta": _NO_TYPE_IDS, "xlmroberta": _NO_TYPE_IDS,
    "camembert": _NO_TYPE_IDS, "debertav2": ("input_ids", "attention_mask", "token_type_ids"),
    "deberta": ("input_ids", "attention_mask", "token_type_ids"), "electra": _DEFAULT_INPUTS,
    "gpt2": _NO_TYPE_IDS, "llama": _NO_TYPE_IDS, "qwen2": _NO_TYPE_IDS,
}


@dataclass
class FolderSettings:
    """What a tokenizer folder asks for besides its vocabulary."""

    folder: Path
    tokenizer_class: str | None  # tokenizer_config.json's tokenizer_class, e.g. "BertTokenizer"
    model_type: str | None  # config.json's model_type, e.g. "bert" (None without config.json)
    special_tokens: dict[str, str | None]  # "cls" ... "eos" -> token text (None: not set)
    special_token_flags: dict[str, dict[str, bool]]  # token text -> AddedToken flags given in the files
    model_max_length: int  # VERY_LARGE_INTEGER when the files give none
    padding_side: str  # "right" or "left"
    truncation_side: str  # "right" or "left"
    add_special_tokens: bool  # the default of a call's add_special_tokens
    clean_up_tokenization_spaces: bool
    do_lower_case: bool | None  # as tokenizer_config.json says (None: not said)
    model_input_names: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)  # tokenizer_config.json as read

    @property
    def family(self) -> str | None:
        """The tokenizer family ("bert", "debertav2", ...) from the class name, else the model type."""
        if self.tokenizer_class:
            name = self.tokenizer_class.lower().removesuffix("fast").removesuffix("tokenizer")
            return name or None
        return self.model_type.replace("-", "").replace("_", "") if self.model_type else None


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`; ValueError naming the file when it does not parse or is no object."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error}); expected the {what} as JSON") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: does not parse as JSON ({error.msg} at line {error.lineno} column "
                         f"{error.colno}); expected the {what}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: the {what} must be a JSON object, got {type(value).__name__}")
    return value


def _token_text(value: Any, where: str) -> tuple[str | None, dict[str, bool]]:
    """A special token given as a string or as an AddedToken dict ({"content": ..., flags})."""
    if value is None:
        return None, {}
    if isinstance(value, str):
        return value, {}
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        flags = {k: bool(value[k]) for k in ("single_word", "lstrip", "rstrip", "normalized") if k in value}
        return value["content"], flags
    raise ValueError(f"{where} must be a string or an object with a string 'content', got {value!r}")


def _choice(config: dict[str, Any], key: str, allowed: tuple[str, ...], default: str, path: Path) -> str:
    value = config.get(key, default)
    if value not in allowed:
        raise ValueError(f"{path}: {key} must be one of {allowed}, got {value!r}")
    return value


def _flag(config: dict[str, Any], key: str, default: bool | None, path: Path) -> bool | None:
    value = config.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{path}: {key} must be true or false, got {value!r}")
    return value


def _max_length(config: dict[str, Any], path: Path) -> int:
    value = config.get("model_max_length")
    if value is None:
        return VERY_LARGE_INTEGER
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # transformers writes int(1e30) as 1e+30 in some versions
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: model_max_length must be a positive integer, got {value!r}")
    return value


def read_settings(folder: Path) -> FolderSettings:
    """The folder's tokenizer settings (every file optional; defaults as transformers' own)."""
    config_path = folder / "tokenizer_config.json"
    config = read_json(config_path, "tokenizer configuration") if config_path.is_file() else {}
    model_path = folder / "config.json"
    model_type = read_json(model_path, "model configuration").get("model_type") if model_path.is_file() else None
    special: dict[str, str | None] = {name: None for name in SPECIAL_NAMES}
    flags: dict[str, dict[str, bool]] = {}
    for name in SPECIAL_NAMES:
        text, token_flags = _token_text(config.get(f"{name}_token"), f"{config_path}: {name}_token")
        special[name] = text
        if text is not None and token_flags:
            flags[text] = token_flags
    map_path = folder / "special_tokens_map.json"
    if map_path.is_file():  # fills what tokenizer_config.json leaves unset, as transformers does
        mapping = read_json(map_path, "special tokens map")
        for name in SPECIAL_NAMES:
            if special[name] is None and mapping.get(f"{name}_token") is not None:
                text, token_flags = _token_text(mapping[f"{name}_token"], f"{map_path}: {name}_token")
                special[name] = text
                if text is not None and token_flags:
                    flags.setdefault(text, token_flags)
    tokenizer_class = config.get("tokenizer_class")
    if tokenizer_class is not None and not isinstance(tokenizer_class, str):
        raise ValueError(f"{config_path}: tokenizer_class must be a string, got {tokenizer_class!r}")
    settings = FolderSettings(
        folder=folder, tokenizer_class=tokenizer_class,
        model_type=model_type if isinstance(model_type, str) else None, special_tokens=special,
        special_token_flags=flags, model_max_length=_max_length(config, config_path),
        padding_side=_choice(config, "padding_side", ("right", "left"), "right", config_path),
        truncation_side=_choice(config, "truncation_side", ("right", "left"), "right", config_path),
        add_special_tokens=bool(_flag(config, "add_special_tokens", True, config_path)),
        clean_up_tokenization_spaces=bool(_flag(config, "clean_up_tokenization_spaces", False, config_path)),
        do_lower_case=_flag(config, "do_lower_case", None, config_path),
        model_input_names=(), config=config)
    names = config.get("model_input_names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{config_path}: model_input_names must be a list of strings, got {names!r}")
        settings.model_input_names = tuple(names)
    else:
        settings.model_input_names = _INPUTS_BY_FAMILY.get(settings.family or "", _DEFAULT_INPUTS)
    return settings


__all__ = ["FolderSettings", "LARGE_INTEGER", "SPECIAL_NAMES", "VERY_LARGE_INTEGER", "read_json", "read_settings"]
