"""A column of texts (or two, for sentence pairs) tokenized once into the ragged input_ids /
attention_mask / token_type_ids columns that the DataLoader pads per batch:

    tok = gt.tokenizer_from_pretrained("bert-base-uncased/")
    columns = gt.data.tokenize(tok, ds["premise"], ds["hypothesis"], max_length=128)
    loader = gt.DataLoader({**columns, "labels": np.asarray(ds["label"])}, batch_size=32, shuffle=True)
    for batch in loader:   # batch["input_ids"]: (32, longest of the batch rounded up to a multiple of 8)
        ...

The column goes through the `tokenizers` package's batch encoding (Rust threads) in chunks of
8192 examples, the ids of one chunk copied into flat int64 arrays while the next is encoded. A
column is a list or tuple of str, a NumPy array, a pandas Series, a pyarrow Array or
ChunkedArray, or a `datasets` column (duck-typed: `to_pylist()`, `tolist()`, else iterated
once); nothing is imported for them.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from gputrain.data._ragged import RaggedArray

_LARGE_INTEGER = int(1e20)  # a model_max_length above this means "no limit" (transformers' LARGE_INTEGER)
_TRUNCATION = {True: "longest_first", "longest_first": "longest_first", "only_first": "only_first",
               "only_second": "only_second"}


def _column(values: Any, name: str) -> list[Any]:
    """A column as a list of its items (not yet checked to be str)."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a column of texts (a list, array or dataset column), not one "
                        f"{type(values).__name__}")
    if isinstance(values, list):
        return values
    if isinstance(values, tuple):
        return list(values)
    for method in ("to_pylist", "tolist"):  # pyarrow arrays; NumPy arrays and pandas Series
        if callable(getattr(values, method, None)):
            items = getattr(values, method)()
            if not isinstance(items, list):
                raise TypeError(f"{name}: {type(values).__name__}.{method}() gave {type(items).__name__}, "
                                "not a list of texts (a 2-D array?)")
            return items
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{name} must be a column of texts (a list, array or dataset column), not "
                        f"{type(values).__name__}") from None


def _label(values: Any, name: str) -> str:
    """`name`, with the column's own name when it has one (a pandas Series, a datasets column)."""
    own = getattr(values, "name", None) or getattr(values, "column_name", None)
    return f"{name} (column {own!r})" if isinstance(own, str) else name


def _not_text_error(columns: list[tuple[list[Any], str]]) -> TypeError:
    for items, name in columns:
        for index, item in enumerate(items):
            if not isinstance(item, str):
                return TypeError(f"{name}[{index}] is {type(item).__name__} ({item!r:.60}), not str; every text "
                                 "must be a str (empty strings are allowed; fill missing values first)")
    return TypeError("the texts could not be tokenized")


def _configure(backend: Any, tokenizer: Any, truncation: Any, max_length: int | None) -> None:
    """The backend without padding, truncating as asked (max_length default: model_max_length)."""
    backend.no_padding()
    if truncation is False or truncation is None:
        backend.no_truncation()
        return
    if truncation not in _TRUNCATION:
        raise ValueError(f"truncation must be True, False, 'longest_first', 'only_first' or 'only_second', "
                         f"got {truncation!r}")
    if max_length is None:
        model_max = getattr(tokenizer, "model_max_length", None)
        if model_max is None or model_max > _LARGE_INTEGER:
            backend.no_truncation()  # no limit known: as transformers does
            return
        max_length = int(model_max)
    elif isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
    backend.enable_truncation(int(max_length), stride=0, strategy=_TRUNCATION[truncation],
                              direction=getattr(tokenizer, "truncation_side", "right"))


#: Examples per encode_batch call: while tokenizers encodes one chunk (in Rust, without the GIL)
#: the ids of the previous one are copied out here, so the copying hides behind the encoding.
CHUNK = 8192


def _flat(encodings: list[Any], attribute: str, total: int) -> np.ndarray:
    return np.fromiter(chain.from_iterable(map(attrgetter(attribute), encodings)), dtype=np.int64, count=total)


def _arrays(encodings: list[Any], types: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(lengths, flat ids, flat type ids or None) of a list of unpadded Encodings."""
    lengths = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
    total = int(lengths.sum())
    return lengths, _flat(encodings, "ids", total), _flat(encodings, "type_ids", total) if types else None


def _encode_chunks(backend: Any, inputs: list[Any], add_special_tokens: bool, types: bool) -> list[tuple[Any, ...]]:
    """_arrays of every CHUNK of `inputs`, chunk k + 1 encoded on a thread while chunk k is copied.
    encode_batch_fast (tokenizers >= 0.20: the same ids, no character offsets) when there is one."""
    from concurrent.futures import ThreadPoolExecutor

    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    chunks = [inputs[i:i + CHUNK] for i in range(0, len(inputs), CHUNK)]
    if len(chunks) <= 1:
        return [_arrays(encode(inputs, add_special_tokens=add_special_tokens), types)]
    parts = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gputrain-tokenize") as pool:
        pending = pool.submit(encode, chunks[0], add_special_tokens=add_special_tokens)
        for k in range(len(chunks)):
            encodings = pending.result()
            if k + 1 < len(chunks):
                pending = pool.submit(encode, chunks[k + 1], add_special_tokens=add_special_tokens)
            parts.append(_arrays(encodings, types))
    return parts


def tokenize(tokenizer: Any, texts: Any, text_pairs: Any = None, *, truncation: bool | str = True,
             max_length: int | None = None, add_special_tokens: bool | None = None,
             return_token_type_ids: bool | None = None, return_attention_mask: bool | None = None,
             pad_to_multiple_of: int = 8) -> dict[str, RaggedArray]:
    """{"input_ids", "attention_mask", "token_type_ids"}: RaggedArrays (int64) of a column of texts
    or of text pairs, for a DataLoader. `tokenizer` is gputrain.tokenizer_from_pretrained's (or
    any object with a `backend_tokenizer` and transformers' pad_token_id / model_input_names /
    model_max_length / truncation_side, as transformers' fast tokenizers have). Truncation
    (default longest_first, to max_length or model_max_length) is the tokenizer's; padding is
    left to the loader: input_ids with pad_token_id, the others with 0, each batch to its
    longest row rounded up to a multiple of `pad_to_multiple_of` (8 by default; 1: none), on the
    right. token_type_ids and attention_mask are returned when the tokenizer's model inputs name
    them, or as asked."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode_batch", None)):
        raise TypeError("tokenizer must be gputrain.tokenizer_from_pretrained(...) (or a tokenizer with a "
                        f"`tokenizers` backend_tokenizer), not {type(tokenizer).__name__}")
    if (isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, (int, np.integer))
            or not 1 <= pad_to_multiple_of <= 65536):
        raise ValueError(f"pad_to_multiple_of must be an int in [1, 65536], got {pad_to_multiple_of!r}")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError("the tokenizer has no pad token (pad_token); the loader pads input_ids with its id")
    first = _column(texts, "texts")
    columns = [(first, _label(texts, "texts"))]
    inputs: list[Any] = first
    if text_pairs is not None:
        second = _column(text_pairs, "text_pairs")
        if len(second) != len(first):
            raise ValueError(f"texts has {len(first)} rows but text_pairs has {len(second)}")
        columns.append((second, _label(text_pairs, "text_pairs")))
        inputs = list(zip(first, second))
    _configure(backend, tokenizer, truncation, max_length)
    if add_special_tokens is None:  # the tokenizer's default (transformers' tokenizers: a method, so True)
        default = getattr(tokenizer, "add_special_tokens", True)
        add_special_tokens = default if isinstance(default, bool) else True
    names = list(getattr(tokenizer, "model_input_names", ("input_ids", "token_type_ids", "attention_mask")))
    types = "token_type_ids" in names if return_token_type_ids is None else bool(return_token_type_ids)
    mask = "attention_mask" in names if return_attention_mask is None else bool(return_attention_mask)
    try:
        parts = _encode_chunks(backend, inputs, bool(add_special_tokens), types)
    except TypeError:
        raise _not_text_error(columns) from None
    except Exception as error:  # tokenizers' Rust errors (a truncation that cannot be done)
        raise ValueError(f"tokenizing failed: {error}") from None
    finally:
        backend.no_truncation()
    lengths = np.concatenate([p[0] for p in parts])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    ids = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    out = {"input_ids": RaggedArray(ids, offsets, int(pad_id), pad_to_multiple_of)}
    if mask:  # unpadded encodings attend to every token
        out["attention_mask"] = RaggedArray(np.ones(total, dtype=np.int64), offsets, 0, pad_to_multiple_of)
    if types:
        type_ids = np.concatenate([p[2] for p in parts]) if len(parts) > 1 else parts[0][2]
        out["token_type_ids"] = RaggedArray(type_ids, offsets, int(getattr(tokenizer, "pad_token_type_id", 0)),
                                            pad_to_multiple_of)
    return out


__all__ = ["tokenize"]
