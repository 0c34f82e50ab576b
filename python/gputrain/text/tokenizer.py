"""A pretrained tokenizer from a Hugging Face folder, over the `tokenizers` package (Rust), called
as transformers' PreTrainedTokenizerFast is called:

    tok = gputrain.tokenizer_from_pretrained("bert-base-uncased/")
    batch = tok(premises, hypotheses, padding=True, truncation=True, max_length=128, return_tensors="np")
    batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]   # int64 arrays (batch, longest)
    tok.decode(batch["input_ids"][0], skip_special_tokens=True)

The folder's tokenizer.json is read with tokenizer_config.json / special_tokens_map.json (special
tokens, model_max_length, padding_side, truncation_side, add_special_tokens,
clean_up_tokenization_spaces); a folder with only vocab.txt (BERT) or spm.model (DeBERTa-v3) is
converted as transformers converts it. `save_pretrained` writes tokenizer.json and
tokenizer_config.json. The arguments, defaults and outputs follow transformers 5: padding False /
True / "longest" / "max_length", truncation False / True / "longest_first" / "only_first" /
"only_second", max_length (alone it turns truncation on), pad_to_multiple_of, padding_side,
return_token_type_ids / return_attention_mask (default: the family's model inputs; RoBERTa and
DistilBERT have no token_type_ids), return_tensors "np" (int64 arrays) or None (lists).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gputrain.text import _convert
from gputrain.text._files import LARGE_INTEGER, SPECIAL_NAMES, FolderSettings, read_settings

_PADDING = {False: None, "do_not_pad": None, True: "longest", "longest": "longest", "max_length": "max_length"}
_TRUNCATION = {None: None, False: None, "do_not_truncate": None, True: "longest_first",
               "longest_first": "longest_first", "only_first": "only_first", "only_second": "only_second"}
# transformers' clean_up_tokenization (decode with clean_up_tokenization_spaces on a non-BPE model)
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def import_tokenizers() -> Any:
    """The `tokenizers` package, or ImportError saying how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise ImportError("gputrain's tokenizers need Hugging Face's 'tokenizers' package: "
                          "pip install 'gputrain[text]' (or pip install tokenizers)") from None
    return tokenizers


class BatchEncoding(dict):
    """The output of a tokenizer call: a dict of input_ids / token_type_ids / attention_mask (int64
    arrays with return_tensors="np", else lists), whose keys also read as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _texts(value: Any, name: str) -> tuple[list[str] | str, bool]:
    """(texts, batched) from a str or a list/tuple of str."""
    if isinstance(value, str):
        return value, False
    if isinstance(value, (list, tuple)):
        return value if isinstance(value, list) else list(value), True
    raise TypeError(f"{name} must be a str or a list of str, not {type(value).__name__}")


def _first_non_text(texts: Sequence[Any]) -> int | None:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            return index
    return None


def text_type_error(texts: Sequence[Any], name: str) -> TypeError | None:
    """A TypeError naming the first item of `texts` that is not a str (None when all are)."""
    index = _first_non_text(texts)
    if index is None:
        return None
    return TypeError(f"{name}[{index}] is {type(texts[index]).__name__} ({texts[index]!r:.60}), not str; "
                     "every text must be a str (empty strings are allowed)")


class PretrainedTokenizer:
    """A tokenizer folder's `tokenizers.Tokenizer` with its settings (see the module docstring)."""

    def __init__(self, backend: Any, settings: FolderSettings) -> None:
        self._backend = backend
        self.name_or_path = str(settings.folder)
        self.tokenizer_class = settings.tokenizer_class
        self.model_max_length = settings.model_max_length
        self.padding_side = settings.padding_side
        self.truncation_side = settings.truncation_side
        self.add_special_tokens = settings.add_special_tokens
        self.clean_up_tokenization_spaces = settings.clean_up_tokenization_spaces
        self.model_input_names = list(settings.model_input_names)
        self.pad_token_type_id = 0
        self._special = dict(settings.special_tokens)
        self._init_config = {k: v for k, v in settings.config.items() if k in _SAVED_CONFIG_KEYS}

    # ---- vocabulary and special tokens -------------------------------------------------------

    @property
    def backend_tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer` (its padding and truncation are set by each call)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Tokens of the base vocabulary (without added tokens), as transformers' vocab_size."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        """{token: id} of the whole vocabulary, added tokens included."""
        return self._backend.get_vocab(with_added_tokens=True)

    def _special_id(self, name: str) -> int | None:
        token = self._special[name]
        return None if token is None else self.convert_tokens_to_ids(token)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """The id of a token (a list of ids for a list), unk_token_id for one not in the vocabulary."""
        if isinstance(tokens, str):
            token_id = self._backend.token_to_id(tokens)
            if token_id is None:
                unk = self._special["unk"]
                return None if unk is None else self._backend.token_to_id(unk)
            return token_id
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> Any:
        """The token of an id (a list of tokens for a list of ids, special ones left out if asked)."""
        if isinstance(ids, (int, np.integer)):
            return self._backend.id_to_token(int(ids))
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens (cls, sep, pad, unk, mask, bos, eos), each once."""
        return list(dict.fromkeys(t for t in self._special.values() if t is not None))

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of all_special_tokens."""
        return [self.convert_tokens_to_ids(t) for t in self.all_special_tokens]

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """{"cls_token": "[CLS]", ...}: the special tokens that are set, as transformers names them."""
        return {f"{name}_token": token for name, token in self._special.items() if token is not None}

    # ---- encoding ----------------------------------------------------------------------------

    def _strategies(self, padding: Any, truncation: Any, max_length: int | None,
                    pad_to_multiple_of: int | None) -> tuple[str | None, str | None, int | None]:
        """(padding, truncation, max_length) resolved as transformers' _get_padding_truncation_strategies."""
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer))
                                       or max_length < 1):
            raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
        if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or not isinstance(
                pad_to_multiple_of, (int, np.integer)) or pad_to_multiple_of < 1):
            raise ValueError(f"pad_to_multiple_of must be a positive int or None, got {pad_to_multiple_of!r}")
        if max_length is not None and padding is False and truncation is None:
            truncation = "longest_first"  # max_length alone turns truncation on
        if not isinstance(padding, (bool, str)) or padding not in _PADDING:
            raise ValueError(f"padding must be False, True, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")
        if not isinstance(truncation, (bool, str, type(None))) or truncation not in _TRUNCATION:
            raise ValueError("truncation must be False, True, 'longest_first', 'only_first', 'only_second' or "
                             f"'do_not_truncate', got {truncation!r}")
        pad, cut = _PADDING[padding], _TRUNCATION[truncation]
        if max_length is None:
            unlimited = self.model_max_length > LARGE_INTEGER
            if pad == "max_length":
                pad, max_length = (None, None) if unlimited else (pad, self.model_max_length)
            if cut is not None:
                cut, max_length = (None, max_length) if unlimited else (cut, self.model_max_length)
        if pad is not None and (self._special["pad"] is None or self.pad_token_id is None or self.pad_token_id < 0):
            raise ValueError("Asking to pad but the tokenizer has no padding token (pad_token in "
                             f"{self.name_or_path}/tokenizer_config.json); set tok.pad_token = tok.eos_token, "
                             "for example")
        if cut is not None and pad is not None and pad_to_multiple_of and max_length is not None \
                and max_length % pad_to_multiple_of:
            raise ValueError(f"Truncation and padding are both activated but truncation length ({max_length}) is "
                             f"not a multiple of pad_to_multiple_of ({pad_to_multiple_of}).")
        return pad, cut, None if max_length is None else int(max_length)

    def _configure(self, pad: str | None, cut: str | None, max_length: int | None, pad_to_multiple_of: int | None,
                   padding_side: str | None) -> None:
        """Sets the backend's truncation and padding for one call."""
        backend = self._backend
        if cut is None:
            if backend.truncation is not None:
                backend.no_truncation()
        else:
            target = {"max_length": max_length, "stride": 0, "strategy": cut, "direction": self.truncation_side}
            current = backend.truncation
            if current is None or {k: current.get(k) for k in target} != target:
                backend.enable_truncation(**target)
        if pad is None:
            if backend.padding is not None:
                backend.no_padding()
            return
        side = padding_side if padding_side is not None else self.padding_side
        if side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {side!r}")
        target = {"length": max_length if pad == "max_length" else None, "direction": side,
                  "pad_id": self.pad_token_id, "pad_token": self._special["pad"],
                  "pad_type_id": self.pad_token_type_id,
                  "pad_to_multiple_of": None if pad_to_multiple_of is None else int(pad_to_multiple_of)}
        if backend.padding != target:
            backend.enable_padding(**target)

    def encode_batch(self, inputs: list[Any], add_special_tokens: bool, what: str = "text") -> list[Any]:
        """The backend's encode_batch, its errors turned into exceptions naming the input."""
        try:
            return self._backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        except TypeError:
            raise _input_error(inputs, what) from None
        except Exception as error:  # the Rust side raises plain Exception (truncation, lengths)
            raise ValueError(f"tokenizing failed: {error}") from None

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None, *,
                 add_special_tokens: bool | None = None, padding: bool | str = False,
                 truncation: bool | str | None = None, max_length: int | None = None,
                 pad_to_multiple_of: int | None = None, padding_side: str | None = None,
                 return_tensors: str | None = None, return_token_type_ids: bool | None = None,
                 return_attention_mask: bool | None = None) -> BatchEncoding:
        """Tokenizes one text or pair (lists of ints per key) or a batch (list per example)."""
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors must be 'np' (int64 NumPy arrays) or None (lists), got "
                             f"{return_tensors!r}")
        texts, batched = _texts(text, "text")
        pairs = None
        if text_pair is not None:
            pairs, pair_batched = _texts(text_pair, "text_pair")
            if batched != pair_batched:
                raise TypeError("text and text_pair must both be one str or both lists of str, got "
                                f"{type(text).__name__} and {type(text_pair).__name__}")
            if batched and len(pairs) != len(texts):
                raise ValueError(f"batch length of `text`: {len(texts)} does not match batch length of "
                                 f"`text_pair`: {len(pairs)}.")
        if batched:
            inputs = texts if pairs is None else list(zip(texts, pairs))
        else:
            inputs = [texts if not pairs else (texts, pairs)]  # transformers: an empty single pair is none
        pad, cut, length = self._strategies(padding, truncation, max_length, pad_to_multiple_of)
        self._configure(pad, cut, length, pad_to_multiple_of, padding_side)
        special = self.add_special_tokens if add_special_tokens is None else bool(add_special_tokens)
        encodings = self.encode_batch(inputs, special) if inputs else []
        keys = self._output_keys(return_token_type_ids, return_attention_mask)
        out = BatchEncoding()
        for key, attribute in keys:
            rows = [getattr(e, attribute) for e in encodings]
            out[key] = _as_output(rows, key, return_tensors, batched)
        return out

    def _output_keys(self, return_token_type_ids: bool | None,
                     return_attention_mask: bool | None) -> list[tuple[str, str]]:
        types = "token_type_ids" in self.model_input_names if return_token_type_ids is None else return_token_type_ids
        mask = "attention_mask" in self.model_input_names if return_attention_mask is None else return_attention_mask
        keys = [("input_ids", "ids")]
        if types:
            keys.append(("token_type_ids", "type_ids"))
        if mask:
            keys.append(("attention_mask", "attention_mask"))
        return keys

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool | None = None,
               padding: bool | str = False, truncation: bool | str | None = None, max_length: int | None = None,
               return_tensors: str | None = None) -> Any:
        """The input ids of one text or pair (a list; a (1, n) array with return_tensors="np")."""
        return self(text, text_pair, add_special_tokens=add_special_tokens, padding=padding, truncation=truncation,
                    max_length=max_length, return_tensors=return_tensors,
                    return_token_type_ids=False, return_attention_mask=False)["input_ids"]

    # ---- decoding ----------------------------------------------------------------------------

    def _clean(self, text: str, clean_up_tokenization_spaces: bool | None) -> str:
        clean = clean_up_tokenization_spaces
        if clean is None:
            clean = self.clean_up_tokenization_spaces
        if clean and type(self._backend.model).__name__ != "BPE":  # transformers 5 skips it for BPE
            for old, new in _CLEAN_UP:
                text = text.replace(old, new)
        return text

    def decode(self, token_ids: Any, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str | list[str]:
        """The text of a sequence of ids (int, list, 1-D array); a list of texts for a batch."""
        ids = token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids
        if isinstance(ids, int):
            ids = [ids]
        if isinstance(ids, (list, tuple)) and ids and isinstance(ids[0], (list, tuple)):
            return self.batch_decode(ids, skip_special_tokens, clean_up_tokenization_spaces)
        text = self._backend.decode(_ids(ids, "token_ids"), skip_special_tokens=skip_special_tokens)
        return self._clean(text, clean_up_tokenization_spaces)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:
        """The texts of a batch of id sequences (a list of lists or a 2-D array)."""
        rows = sequences.tolist() if hasattr(sequences, "tolist") else [
            s.tolist() if hasattr(s, "tolist") else list(s) for s in sequences]
        if rows and not isinstance(rows[0], (list, tuple)):
            raise TypeError("batch_decode takes a batch of id sequences; use decode for one sequence")
        texts = self._backend.decode_batch([_ids(row, f"sequences[{i}]") for i, row in enumerate(rows)],
                                           skip_special_tokens=skip_special_tokens)
        return [self._clean(text, clean_up_tokenization_spaces) for text in texts]

    # ---- saving ------------------------------------------------------------------------------

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> tuple[str, str]:
        """Writes tokenizer.json (without padding/truncation) and tokenizer_config.json into the
        folder (made if missing); returns their paths."""
        from tokenizers import Tokenizer

        folder = Path(save_directory)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"save_pretrained: {folder} exists and is not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        clean = Tokenizer.from_str(self._backend.to_str())
        clean.no_padding()
        clean.no_truncation()
        config = dict(self._init_config)
        config.update({
            "tokenizer_class": self.tokenizer_class or "PreTrainedTokenizerFast",
            "model_max_length": self.model_max_length, "padding_side": self.padding_side,
            "truncation_side": self.truncation_side, "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            "model_input_names": self.model_input_names, **self.special_tokens_map})
        if not self.add_special_tokens:
            config["add_special_tokens"] = False
        paths = (folder / "tokenizer.json", folder / "tokenizer_config.json")
        clean.save(str(paths[0]))
        paths[1].write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return str(paths[0]), str(paths[1])

    def __repr__(self) -> str:
        return (f"PretrainedTokenizer({self.name_or_path!r}, class={self.tokenizer_class}, "
                f"vocab_size={self.vocab_size}, "
                f"model_max_length={self.model_max_length}, padding_side={self.padding_side!r}, "
                f"truncation_side={self.truncation_side!r}, special_tokens={self.special_tokens_map})")


_SAVED_CONFIG_KEYS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "add_prefix_space", "split_by_punct",
                      "vocab_type", "unk_id")


def _special_property(name: str) -> tuple[property, property]:
    def token(self: PretrainedTokenizer) -> str | None:
        return self._special[name]

    def set_token(self: PretrainedTokenizer, value: str | None) -> None:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name}_token must be a str or None, not {type(value).__name__}")
        self._special[name] = value

    def token_id(self: PretrainedTokenizer) -> int | None:
        return self._special_id(name)

    return property(token, set_token, doc=f"The {name} token's text (None: none)."), property(
        token_id, doc=f"The {name} token's id (None: none).")


for _name in SPECIAL_NAMES:
    _token_property, _id_property = _special_property(_name)
    setattr(PretrainedTokenizer, f"{_name}_token", _token_property)
    setattr(PretrainedTokenizer, f"{_name}_token_id", _id_property)


def _ids(values: Any, what: str) -> list[int]:
    """Token ids as a list of ints in [0, 2**32); TypeError/ValueError naming `what` otherwise."""
    try:
        ids = [int(i) for i in values]
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} must be a sequence of int token ids, got {values!r:.80} ({error})") from None
    if ids and (min(ids) < 0 or max(ids) >= 2**32):
        bad = min(ids) if min(ids) < 0 else max(ids)
        raise ValueError(f"{what}: token id {bad} is not an id (ids are in [0, 2**32); remove label padding "
                         "such as -100 before decoding)")
    return ids


def _input_error(inputs: list[Any], what: str) -> Exception:
    """The exception for an encode_batch input that is not text: names the item and its part
    (`what` for a text or a pair's first, text_pair for a pair's second)."""
    for index, item in enumerate(inputs):
        parts = item if isinstance(item, tuple) else (item,)
        for part, value in enumerate(parts):
            if not isinstance(value, str):
                name = (what, "text_pair")[part]
                return TypeError(f"{name}[{index}] is {type(value).__name__} ({value!r:.60}), not str; every text "
                                 "must be a str (empty strings are allowed)")
    return TypeError(f"{what}: the texts could not be tokenized")


def _as_output(rows: list[list[int]], key: str, return_tensors: str | None, batched: bool) -> Any:
    if return_tensors is None:
        return rows if batched else rows[0]
    lengths = {len(r) for r in rows}
    if len(lengths) > 1:
        raise ValueError(f"Unable to create an array of {key}: the sequences have different lengths "
                         f"({min(lengths)} to {max(lengths)}); use padding=True or truncation=True with padding "
                         "'max_length' to have batched arrays of the same length")
    if not rows:
        return np.zeros((0, 0), dtype=np.int64)
    return np.array(rows, dtype=np.int64)


def _backend_from_folder(folder: Path, settings: FolderSettings) -> tuple[Any, list[str]]:
    """The folder's tokenizers.Tokenizer and, for a converted one, the extra special tokens."""
    tokenizers = import_tokenizers()
    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            return tokenizers.Tokenizer.from_file(str(path)), []
        except Exception as error:  # tokenizers raises a plain Exception
            raise ValueError(f"{path}: not a tokenizer the 'tokenizers' package can load ({error})") from None
    if (folder / "vocab.txt").is_file():
        return _convert.wordpiece_from_vocab(folder / "vocab.txt", settings), []
    if (folder / "spm.model").is_file():
        return _convert.unigram_from_spm(folder / "spm.model", settings)
    present = sorted(p.name for p in folder.iterdir())[:12]
    raise FileNotFoundError(f"{folder}: no tokenizer.json, vocab.txt or spm.model (found {present}); a tokenizer "
                            "folder needs one of them (pickled and other vocabulary files are not read)")


def _add_special_tokens(backend: Any, settings: FolderSettings, extra: list[str]) -> None:
    """Adds the named special tokens that are not yet added tokens (as transformers does on load)."""
    from tokenizers import AddedToken

    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    order = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")  # transformers' SPECIAL_TOKENS_ATTRIBUTES
    new = []
    for token in [settings.special_tokens[n] for n in order] + extra:
        if token is not None and token not in added:
            flags = settings.special_token_flags.get(token, {})
            new.append(AddedToken(token, special=True, normalized=flags.get("normalized", False),
                                  lstrip=flags.get("lstrip", False), rstrip=flags.get("rstrip", False),
                                  single_word=flags.get("single_word", False)))
            added.add(token)
    if new:
        backend.add_special_tokens(new)


def tokenizer_from_pretrained(folder: str | os.PathLike[str]) -> PretrainedTokenizer:
    """The tokenizer of a Hugging Face folder (see gputrain.text.tokenizer's docstring): its
    tokenizer.json, or vocab.txt / spm.model converted as transformers converts them, with the
    settings of tokenizer_config.json and special_tokens_map.json. Needs the `tokenizers` package
    (pip install 'gputrain[text]'); spm.model also `sentencepiece` and `protobuf`."""
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer_from_pretrained: {path} is not a folder"
                                + (" (give the folder that holds it)" if path.is_file() else ""))
    settings = read_settings(path)
    converted = not (path / "tokenizer.json").is_file()
    family = settings.family
    if family is None and converted:  # a bare vocab.txt is BERT's, a bare spm.model DeBERTa-v3's
        family = "bert" if (path / "vocab.txt").is_file() else "debertav2"
    defaults = _convert.FAMILY_DEFAULTS.get(family or "", {})
    for name, token in defaults.items():
        if settings.special_tokens[name] is None:
            settings.special_tokens[name] = token
    backend, extra = _backend_from_folder(path, settings)
    if settings.special_tokens["pad"] is None and backend.padding is not None:  # padding baked in tokenizer.json
        settings.special_tokens["pad"] = backend.padding.get("pad_token")
    _add_special_tokens(backend, settings, extra)
    if converted:
        backend.post_processor = _convert.cls_sep_template(backend, settings.special_tokens["cls"],
                                                           settings.special_tokens["sep"], path)
    backend.no_padding()  # set by each call
    backend.no_truncation()
    _check_special_ids(backend, path / ("tokenizer.json" if not converted else ""))
    return PretrainedTokenizer(backend, settings)


def _check_special_ids(backend: Any, where: Path) -> None:
    """The ids the post-processor adds (a pair of empty texts) must be in the vocabulary."""
    size = backend.get_vocab_size(with_added_tokens=True)
    try:
        ids = backend.encode("", "", add_special_tokens=True).ids
    except Exception as error:  # a post-processor that cannot build a pair
        raise ValueError(f"{where}: the post-processor fails on a pair of texts ({error})") from None
    bad = [i for i in ids if i >= size]
    if bad:
        raise ValueError(f"{where}: the post-processor adds token id {bad[0]} but the vocabulary has {size} "
                         f"tokens (ids 0 to {size - 1}); its special_tokens ids do not match the vocabulary")


__all__ = ["BatchEncoding", "PretrainedTokenizer", "tokenizer_from_pretrained"]
