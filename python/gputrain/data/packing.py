"""Packed sequences: several documents per row, so that short examples waste no compute on padding.

    docs = [tokenizer(text)["input_ids"] for text in texts]          # token-id sequences
    packed = gt.data.pack_sequences(docs, seq_len=1024)               # dict of (rows, 1024) int64 arrays
    loader = gt.DataLoader(packed, batch_size=8, shuffle=True)        # dict batches
    # {"input_ids", "attention_mask", "position_ids", "labels"}

    loader = gt.DataLoader(examples, batch_size=8,                     # or per batch, as Hugging Face's
                           collate_fn=gt.data.DataCollatorWithFlattening())  # padding-free collator

The conventions are Hugging Face's ``DataCollatorWithFlattening`` (transformers'
data/data_collator.py):

- a new document starts wherever ``position_ids == 0``: positions count 0, 1, 2, ... inside each
  document and restart at its successor's first token (a model reading position_ids attends
  within a document only -- transformers derives the block-diagonal mask from them, gputrain's
  tokens layer its key starts);
- ``labels`` are the input ids, NOT shifted (the model's causal-LM loss shifts them: position t is
  scored on labels[t + 1], as transformers' ForCausalLM loss does), with ``-100`` (ignored) at
  each document's FIRST token -- exactly ``[-100] + input_ids[1:]`` per document, as the collator
  writes them -- so no position is scored on the first token of the next document;
- padding (pack_sequences' last row only) has ``attention_mask`` 0, ``input_ids`` pad_token_id,
  ``position_ids`` 0 and ``labels`` -100.

With ``shift_labels=True`` pack_sequences gives the same targets already shifted, for a loss that
does not shift (gputrain's own GPT and CrossEntropyLoss): ``labels[t]`` is the next token of the
same document, -100 at each document's LAST token and on padding.
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

IGNORE_INDEX = -100  # labels that the loss skips (HF's and gputrain's CrossEntropyLoss default)
STRATEGIES = ("wrap", "best_fit")


def _document(value: Any, index: int) -> np.ndarray:
    """One document as a 1-D int64 array (TypeError / ValueError naming its index)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"documents[{index}] is a {type(value).__name__}: pass token ids (tokenize first)")
    array = np.asarray(value)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"documents[{index}] must hold integer token ids, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"documents[{index}] must be a 1-D sequence of token ids, got shape {array.shape}")
    if array.min() < 0:
        raise ValueError(f"documents[{index}] holds a negative token id ({array.min()})")
    return array.astype(np.int64)


def _documents(documents: Any) -> list[np.ndarray]:
    """The non-empty documents, in order (empty ones are dropped, as HF's collator drops them)."""
    if isinstance(documents, (str, bytes, np.ndarray)) and np.ndim(documents) < 2 or isinstance(documents, Mapping):
        raise TypeError("documents must be an iterable of token-id sequences (a list of lists or 1-D arrays, or a "
                        f"2-D array), not {type(documents).__name__}")
    if not isinstance(documents, Iterable):
        raise TypeError(f"documents must be an iterable of token-id sequences, not {type(documents).__name__}")
    docs = [_document(doc, i) for i, doc in enumerate(documents)]
    docs = [doc for doc in docs if len(doc)]
    if not docs:
        raise ValueError("documents holds no token (every document is empty, or there is none)")
    return docs


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _split(doc: np.ndarray, seq_len: int) -> list[np.ndarray]:
    """A document as pieces of at most seq_len tokens (one piece when it fits)."""
    return [doc[s:s + seq_len] for s in range(0, len(doc), seq_len)]


def _wrap_rows(docs: list[np.ndarray], seq_len: int) -> list[list[np.ndarray]]:
    """The documents end to end, cut every seq_len tokens: a document crossing a row's end (or
    longer than seq_len) continues at the next row's start as a new piece. Only the last row
    can be short."""
    rows: list[list[np.ndarray]] = [[]]
    free = seq_len
    for doc in docs:
        while len(doc):
            if free == 0:
                rows.append([])
                free = seq_len
            rows[-1].append(doc[:free])
            doc, free = doc[free:], free - min(free, len(doc))
    return rows


def _best_fit_rows(docs: list[np.ndarray], seq_len: int) -> list[list[np.ndarray]]:
    """Best-fit decreasing: documents longer than seq_len split into seq_len pieces (the last one
    shorter); pieces, longest first (ties in document order), each go to the row with the least
    room that still holds it, else to a new row. No document shorter than seq_len is split; rows
    may be short (padded)."""
    pieces = [piece for doc in docs for piece in _split(doc, seq_len)]
    order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))  # stable: ties keep document order
    rows: list[list[np.ndarray]] = []
    rooms: list[tuple[int, int]] = []  # (free tokens, row index), sorted
    for i in order:
        piece = pieces[i]
        slot = bisect.bisect_left(rooms, (len(piece), -1))
        if slot < len(rooms):
            free, row = rooms.pop(slot)
        else:
            rows.append([])
            free, row = seq_len, len(rows) - 1
        rows[row].append(piece)
        if free - len(piece):
            bisect.insort(rooms, (free - len(piece), row))
    return rows


def _row_arrays(pieces: list[np.ndarray], seq_len: int, pad_token_id: int,
                shift_labels: bool) -> dict[str, np.ndarray]:
    """One packed row of pieces (each a document for the model), right-padded to seq_len."""
    ids = np.full(seq_len, pad_token_id, dtype=np.int64)
    mask = np.zeros(seq_len, dtype=np.int64)
    positions = np.zeros(seq_len, dtype=np.int64)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    start = 0
    for piece in pieces:
        end = start + len(piece)
        ids[start:end], mask[start:end], positions[start:end] = piece, 1, np.arange(len(piece))
        if shift_labels:
            labels[start:end - 1] = piece[1:]  # the next token of the same piece; -100 at its last
        else:
            labels[start + 1:end] = piece[1:]  # HF: [-100] + input_ids[1:]
        start = end
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "labels": labels}


def pack_sequences(documents: Iterable[Sequence[int]], seq_len: int, *, strategy: str = "wrap",
                   pad_token_id: int = 0, shift_labels: bool = False) -> dict[str, np.ndarray]:
    """Packs token-id ``documents`` (an iterable of 1-D integer sequences; empty ones are dropped)
    into rows of ``seq_len`` tokens: a dict of ``(rows, seq_len)`` int64 arrays ``input_ids``,
    ``attention_mask``, ``position_ids`` and ``labels`` in the module docstring's conventions,
    which ``gputrain.DataLoader(packed, batch_size=...)`` batches as dicts (and the Trainer takes
    as a mapping of columns).

    strategy "wrap" (default): the documents end to end, cut every seq_len tokens -- no padding
    but in the last row; a document that crosses a row's end (or is longer than seq_len) is split
    there, and its continuation starts the next row as a document of its own (positions from 0, its
    first label -100: the model cannot see the part before it). "best_fit": only documents longer
    than seq_len are split (into seq_len pieces); pieces are placed best-fit decreasing, each row
    padded at its end. Both are deterministic functions of the input."""
    seq_len = _positive_int(seq_len, "seq_len")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, numbers.Integral) or pad_token_id < 0:
        raise ValueError(f"pad_token_id must be an int >= 0, got {pad_token_id!r}")
    if not isinstance(shift_labels, (bool, np.bool_)):
        raise TypeError(f"shift_labels must be a bool, got {shift_labels!r}")
    docs = _documents(documents)
    rows = (_wrap_rows if strategy == "wrap" else _best_fit_rows)(docs, seq_len)
    built = [_row_arrays(pieces, seq_len, int(pad_token_id), bool(shift_labels)) for pieces in rows]
    return {key: np.stack([row[key] for row in built]) for key in built[0]}


class DataCollatorWithFlattening:
    """Hugging Face's DataCollatorWithFlattening (padding-free batches): the batch's examples
    (dicts with ``input_ids``, optionally ``labels``; empty ones dropped) concatenated into ONE row,
    a dict of ``(1, total_tokens)`` int64 arrays: ``input_ids``; ``labels`` = per example
    ``[separator_id] + labels[1:]`` (its own labels when it has them, else its input_ids);
    ``position_ids`` (with return_position_ids) restarting at ``position_ids_start`` for every
    example; ``seq_idx`` (with return_seq_idx: the example's index in the batch, int32); with
    return_flash_attn_kwargs ``cu_seq_lens_q`` = ``cu_seq_lens_k`` (int32 cumulative lengths from
    0) and ``max_length_q`` = ``max_length_k`` (Python ints). No attention_mask, as HF's: the
    documents are told apart by their position ids."""

    def __init__(self, *, return_position_ids: bool = True, separator_id: int = IGNORE_INDEX,
                 return_flash_attn_kwargs: bool = False, return_seq_idx: bool = False,
                 position_ids_start: int = 0) -> None:
        for name, flag in (("return_position_ids", return_position_ids),
                           ("return_flash_attn_kwargs", return_flash_attn_kwargs),
                           ("return_seq_idx", return_seq_idx)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        for name, value in (("separator_id", separator_id), ("position_ids_start", position_ids_start)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {value!r}")
        self.return_position_ids = bool(return_position_ids)
        self.separator_id = int(separator_id)
        self.return_flash_attn_kwargs = bool(return_flash_attn_kwargs)
        self.return_seq_idx = bool(return_seq_idx)
        self.position_ids_start = int(position_ids_start)

    def __repr__(self) -> str:
        return (f"DataCollatorWithFlattening(return_position_ids={self.return_position_ids}, "
                f"separator_id={self.separator_id}, return_flash_attn_kwargs={self.return_flash_attn_kwargs}, "
                f"return_seq_idx={self.return_seq_idx}, position_ids_start={self.position_ids_start})")

    def _example(self, example: Any, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, labels) of one example, checked."""
        if not isinstance(example, Mapping) or "input_ids" not in example:
            raise TypeError(f"DataCollatorWithFlattening: example {index} must be a dict with 'input_ids', "
                            f"got {type(example).__name__}")
        ids = _document(example["input_ids"], index)
        if "labels" not in example:
            return ids, ids
        labels = np.asarray(example["labels"])
        if labels.dtype.kind not in "iu" or labels.shape != ids.shape:
            raise ValueError(f"DataCollatorWithFlattening: example {index}'s labels must be integers of its "
                             f"input_ids' shape {ids.shape}, got {labels.dtype} {labels.shape}")
        return ids, labels.astype(np.int64)

    def __call__(self, examples: Sequence[Any]) -> dict[str, Any]:
        checked = [self._example(example, i) for i, example in enumerate(examples)]
        has_labels = bool(examples) and isinstance(examples[0], Mapping) and "labels" in examples[0]
        if any(isinstance(e, Mapping) and ("labels" in e) != has_labels for e in examples):
            raise ValueError("DataCollatorWithFlattening: either every example has 'labels' or none has")
        checked = [(ids, labels) for ids, labels in checked if len(ids)]
        if not checked:
            raise ValueError("DataCollatorWithFlattening received a batch where every example is empty.")
        lengths = [len(ids) for ids, _ in checked]
        labels = [np.concatenate([[self.separator_id], lab[1:]]) for _, lab in checked]
        batch: dict[str, Any] = {"input_ids": np.concatenate([ids for ids, _ in checked])[None],
                                 "labels": np.concatenate(labels).astype(np.int64)[None]}
        if self.return_position_ids:
            batch["position_ids"] = np.concatenate([np.arange(n) + self.position_ids_start for n in lengths])[None]
        if self.return_seq_idx:
            batch["seq_idx"] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)[None]
        if self.return_flash_attn_kwargs:
            cumulative = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = cumulative
            batch["max_length_q"] = batch["max_length_k"] = max(lengths)
        return batch


__all__ = ["DataCollatorWithFlattening", "IGNORE_INDEX", "pack_sequences"]
