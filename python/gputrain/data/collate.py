"""Collating samples of a Dataset object into batches (PyTorch's collate_fn protocol: a list of
samples in, one batch out), with NumPy arrays instead of tensors.

`default_collate(samples)` builds the batch leaf by leaf, recursing into the samples' structure:

- NumPy arrays (and NumPy scalars) of one shape: stacked, shape (batch, *shape). Dtypes are
  promoted with np.result_type when they differ.
- NumPy arrays whose shapes differ only in the first dimension (ragged sequences): a `Padded`
  pair (values, lengths): values has shape (batch, longest, *rest), padded with 0 after each
  sequence; lengths is int64 (batch,). A batch whose sequences all have the same length is
  stacked as above; `pad_collate` returns `Padded` for every array of >= 1 dimension instead,
  so that the batch structure does not depend on the lengths.
- Python bool / int / float / complex: an array (batch,) of bool / int64 / float64 / complex128
  (PyTorch's default tensor types).
- str and bytes: the list of them, unchanged.
- Mappings: the same mapping type (dict if it cannot be built from pairs) collated per key.
- Named tuples: the same type, collated per field. Tuples and lists: a tuple / list collated per
  position (all samples need the same length, as in PyTorch).
- Array-likes that are not NumPy arrays (a torch.Tensor, a JAX array): converted once to NumPy by
  duck typing (`.detach()`, `.cpu()`, `.numpy()`, else `__array__`), without importing torch.
Anything else (None included) is a TypeError naming the type, as in PyTorch.

`DataCollatorWithPadding(pad_token_id)` is Hugging Face's default collator for examples: it pads
input_ids with pad_token_id (attention_mask, token_type_ids and other integer sequences with 0) to
the longest example of the batch and renames label / label_ids to labels.

The batch's arrays are allocated by an allocator: fresh NumPy arrays in the calling process, or
straight inside a shared-memory slot in a worker process (gputrain.data._procs), so a worker's
batch reaches the main process without being pickled or copied again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, NamedTuple

import numpy as np

Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]


class Padded(NamedTuple):
    """Ragged sequences of a batch: values (batch, longest, *rest) padded with 0, lengths (batch,)."""

    values: np.ndarray
    lengths: np.ndarray


class _Leaf:
    """One array of the batch: its shape and dtype, and how to fill it once allocated."""

    __slots__ = ("shape", "dtype", "fill")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, fill: Callable[[np.ndarray], None]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.fill = fill


def _fill_stack(arrays: list[np.ndarray]) -> Callable[[np.ndarray], None]:
    def fill(out: np.ndarray) -> None:
        for i, a in enumerate(arrays):
            out[i] = a

    return fill


def _fill_padded(arrays: list[np.ndarray]) -> Callable[[np.ndarray], None]:
    def fill(out: np.ndarray) -> None:
        for i, a in enumerate(arrays):
            out[i, :len(a)] = a
            out[i, len(a):] = 0

    return fill


def _array_spec(samples: list[Any], pad: bool) -> Any:
    arrays = [np.asarray(s) for s in samples]
    dtype = np.result_type(*arrays) if len({a.dtype for a in arrays}) > 1 else arrays[0].dtype
    if dtype.hasobject:
        raise TypeError("default_collate: arrays of Python objects (dtype object) cannot be batched")
    shapes = {a.shape for a in arrays}
    ndim = arrays[0].ndim
    if len(shapes) == 1 and not (pad and ndim >= 1):
        return _Leaf((len(arrays),) + arrays[0].shape, dtype, _fill_stack(arrays))
    if ndim == 0 or any(a.ndim != ndim or a.shape[1:] != arrays[0].shape[1:] for a in arrays):
        raise RuntimeError("default_collate: arrays in a batch must have the same shape, or differ only in the "
                           f"first dimension (ragged sequences); got shapes {sorted(shapes)}")
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    longest = int(lengths.max())
    values = _Leaf((len(arrays), longest) + arrays[0].shape[1:], dtype, _fill_padded(arrays))
    return Padded(values, _Leaf(lengths.shape, lengths.dtype, _copy_into(lengths)))


_PY_SCALARS = ((bool, np.bool_), (int, np.int64), (float, np.float64), (complex, np.complex128))


def _is_array_like(value: Any) -> bool:
    return not isinstance(value, (np.ndarray, np.generic, str, bytes, Mapping, Sequence)) and (
        hasattr(value, "__array__") or callable(getattr(value, "numpy", None)))


def to_numpy(value: Any) -> Any:
    """`value` as a NumPy array when it is an array-like of another library (a torch.Tensor: its
    .detach().cpu().numpy(); else np.asarray through __array__); anything else unchanged. Nothing
    is imported: the conversion is duck-typed."""
    if not _is_array_like(value):
        return value
    for method in ("detach", "cpu"):
        if callable(getattr(value, method, None)):
            value = getattr(value, method)()
    if callable(getattr(value, "numpy", None)):
        return np.asarray(value.numpy())
    return np.asarray(value)


def _spec(samples: list[Any], pad: bool) -> Any:
    """The batch of `samples` with each array replaced by a _Leaf (nothing allocated yet)."""
    first = samples[0]
    if _is_array_like(first):
        samples = [to_numpy(s) for s in samples]
        first = samples[0]
    if isinstance(first, (np.ndarray, np.generic)):
        return _array_spec(samples, pad)
    for kind, dtype in _PY_SCALARS:
        if isinstance(first, kind):
            values = np.array(samples, dtype=dtype)
            return _Leaf(values.shape, values.dtype, _copy_into(values))
    if isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, Mapping):
        keys = list(first.keys())
        parts = [(k, _spec([s[k] for s in samples], pad)) for k in keys]
        return _Node(type(first), keys, [p for _, p in parts], "mapping")
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return _Node(type(first), None, [_spec(list(f), pad) for f in zip(*samples)], "namedtuple")
    if isinstance(first, Sequence):
        size = len(first)
        if any(len(s) != size for s in samples):
            raise RuntimeError("each element in list of batch should be of equal size")
        kind = tuple if isinstance(first, tuple) else list
        return _Node(kind, None, [_spec(list(f), pad) for f in zip(*samples)], "sequence")
    raise TypeError("default_collate: batch must contain NumPy arrays, numbers, str, dicts or lists; "
                    f"found {type(first).__name__}")


def _copy_into(values: np.ndarray) -> Callable[[np.ndarray], None]:
    def fill(out: np.ndarray) -> None:
        out[...] = values

    return fill


class _Node:
    """A container of the batch (mapping, named tuple, tuple or list) around its parts."""

    __slots__ = ("kind", "keys", "parts", "form")

    def __init__(self, kind: type, keys: list[Any] | None, parts: list[Any], form: str) -> None:
        self.kind = kind
        self.keys = keys
        self.parts = parts
        self.form = form

    def build(self, items: list[Any]) -> Any:
        if self.form == "mapping":
            try:
                return self.kind(zip(self.keys, items))
            except TypeError:  # a Mapping type that cannot be built from pairs
                return dict(zip(self.keys, items))
        if self.form == "namedtuple":
            return self.kind(*items)
        return self.kind(items)


def _leaves(spec: Any) -> list[_Leaf]:
    if isinstance(spec, _Leaf):
        return [spec]
    if isinstance(spec, Padded):
        return [spec.values, spec.lengths]
    if isinstance(spec, _Node):
        return [leaf for part in spec.parts for leaf in _leaves(part)]
    return []


def _materialize(spec: Any, alloc: Allocator) -> Any:
    if isinstance(spec, _Leaf):
        out = alloc(spec.shape, spec.dtype)
        spec.fill(out)
        return out
    if isinstance(spec, Padded):
        return Padded(_materialize(spec.values, alloc), _materialize(spec.lengths, alloc))
    if isinstance(spec, _Node):
        return spec.build([_materialize(part, alloc) for part in spec.parts])
    return spec


def _heap(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def plan_batch(samples: list[Any], pad: bool = False) -> Any:
    """The batch of `samples` as a spec: its structure, each array's shape, dtype and filling,
    nothing allocated yet."""
    if not isinstance(samples, (list, tuple)) or len(samples) == 0:
        raise ValueError("collate: samples must be a non-empty list")
    return _spec(list(samples), pad)


def spec_arrays(spec: Any) -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of each array of a plan_batch spec, in the order build_batch allocates them."""
    return [(leaf.shape, leaf.dtype) for leaf in _leaves(spec)]


def build_batch(spec: Any, alloc: Allocator = _heap) -> Any:
    """The batch of a plan_batch spec, its arrays allocated by `alloc` (in the order planned)."""
    return _materialize(spec, alloc)


def default_collate(samples: Sequence[Any]) -> Any:
    """Stacks a list of samples into a batch (see the module docstring for each sample type)."""
    return build_batch(plan_batch(list(samples)))


def pad_collate(samples: Sequence[Any]) -> Any:
    """As default_collate, but every array leaf of >= 1 dimension becomes a Padded pair (values,
    lengths), equal lengths or not, so that every batch has the same structure."""
    return build_batch(plan_batch(list(samples), pad=True))


def default_convert(sample: Any) -> Any:
    """What a loader with batch_size=None yields per sample by default: the sample unchanged."""
    return sample


class DataCollatorWithPadding:
    """Hugging Face's DataCollatorWithPadding for examples that are dicts of columns: each
    sequence column is padded to the batch's longest (input_ids with pad_token_id, every other
    one with 0), other columns are stacked as default_collate does, and `label` / `label_ids`
    become `labels`. Batches are dicts of NumPy arrays."""

    def __init__(self, pad_token_id: int = 0) -> None:
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
            raise TypeError(f"pad_token_id must be an int, not {type(pad_token_id).__name__}")
        self.pad_token_id = int(pad_token_id)

    def __repr__(self) -> str:
        return f"DataCollatorWithPadding(pad_token_id={self.pad_token_id})"

    def __call__(self, examples: Sequence[Any]) -> Any:
        examples = list(examples)
        if not examples:
            raise ValueError("DataCollatorWithPadding: no examples")
        if not isinstance(examples[0], Mapping):
            return default_collate(examples)
        batch: dict[str, Any] = {}
        for key in examples[0]:
            values = [to_numpy(e[key]) for e in examples]
            name = "labels" if key in ("label", "label_ids") else key
            arrays = [np.asarray(v) for v in values]
            if arrays[0].ndim == 1 and arrays[0].dtype.kind in "iub" and name != "labels":
                batch[name] = self._pad(key, arrays)
            else:
                batch[name] = default_collate(values)
        return batch

    def _pad(self, key: str, arrays: list[np.ndarray]) -> np.ndarray:
        if any(a.ndim != 1 for a in arrays):
            raise ValueError(f"DataCollatorWithPadding: {key!r} must be a 1-D sequence in every example")
        longest = max(len(a) for a in arrays)
        fill = self.pad_token_id if key == "input_ids" else 0
        out = np.full((len(arrays), longest), fill, dtype=np.result_type(*arrays))
        for i, a in enumerate(arrays):
            out[i, :len(a)] = a
        return out


__all__ = ["DataCollatorWithPadding", "Padded", "default_collate", "default_convert", "pad_collate", "to_numpy"]
