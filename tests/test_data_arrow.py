"""DataLoader over pyarrow Tables and (duck-typed) Hugging Face datasets: columns converted once
into arrays and RaggedArrays, batches equal to the NumPy loader's."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest

import gputrain as gt
from gputrain.data import RaggedArray
from gputrain.data.arrow import arrow_columns

pa = pytest.importorskip("pyarrow")

ROWS = 37
RNG = np.random.default_rng(0)
X = RNG.standard_normal((ROWS, 3)).astype(np.float32)
LABEL = RNG.integers(0, 5, ROWS).astype(np.int64)
LENGTHS = RNG.integers(0, 9, ROWS)
TOKENS = [RNG.integers(1, 1000, n).astype(np.int32) for n in LENGTHS]


def _table() -> "pa.Table":
    return pa.table({
        "label": pa.array(LABEL),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(X.ravel()), 3),
        "input_ids": pa.array(TOKENS, type=pa.list_(pa.int32())),
        "weight": pa.array(X[:, 0].astype(np.float64)),
        "flag": pa.array(LABEL > 2),
    })


def _numpy_data() -> dict:
    return {"label": LABEL, "x": X, "input_ids": RaggedArray.from_sequences(TOKENS, dtype=np.int32),
            "weight": X[:, 0].astype(np.float64), "flag": LABEL > 2}


def _batches(data, **kwargs) -> list[dict]:
    loader = gt.DataLoader(data, batch_size=8, shuffle=True, seed=3, **kwargs)
    return [{k: np.array(v) for k, v in batch.items()} for batch in loader]


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert list(a) == list(b)
        for key in a:
            assert a[key].dtype == b[key].dtype, key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_table_batches_equal_numpy_loader(num_workers):
    _assert_same(_batches(_table(), num_workers=num_workers), _batches(_numpy_data(), num_workers=num_workers))


def test_multi_chunk_table_equals_single_chunk():
    table = _table()
    chunked = pa.concat_tables([table.slice(0, 10), table.slice(10, 5), table.slice(15)])
    assert chunked.column("input_ids").num_chunks == 3
    _assert_same(_batches(chunked), _batches(table))


def test_sliced_list_column_uses_its_offsets():
    table = _table().slice(5, 20)  # offsets of the list column no longer start at 0
    data = {k: (v[5:25] if isinstance(v, np.ndarray) else RaggedArray.from_sequences(TOKENS[5:25], dtype=np.int32))
            for k, v in _numpy_data().items()}
    _assert_same(_batches(table), _batches(data))


def test_single_chunk_numeric_column_is_zero_copy():
    table = _table()
    arrays = arrow_columns(table)
    buffer = np.frombuffer(table.column("weight").chunk(0).buffers()[1], dtype=np.float64)
    assert np.shares_memory(arrays["weight"], buffer)
    tokens = np.frombuffer(table.column("input_ids").chunk(0).values.buffers()[1], dtype=np.int32)
    assert np.shares_memory(arrays["input_ids"].values, tokens)
    assert isinstance(arrays["input_ids"], RaggedArray) and arrays["x"].shape == (ROWS, 3)


def test_columns_selects_and_orders_and_skips_strings():
    table = _table().append_column("text", pa.array([f"row {i}" for i in range(ROWS)]))
    got = _batches(table, columns=["input_ids", "label"])
    want = _batches({"input_ids": _numpy_data()["input_ids"], "label": LABEL})
    _assert_same(got, want)


def test_string_column_is_a_clear_error():
    table = _table().append_column("text", pa.array([f"row {i}" for i in range(ROWS)]))
    with pytest.raises(TypeError, match="column 'text' has type string"):
        gt.DataLoader(table, batch_size=4)


@pytest.mark.parametrize("column, values", [
    ("weight", pa.array([1.0, None] * 2)),
    ("input_ids", pa.array([[1, 2], None, [3], []], type=pa.list_(pa.int32()))),
    ("input_ids", pa.array([[1, None], [2], [3], []], type=pa.list_(pa.int32()))),
])
def test_nulls_are_a_clear_error(column, values):
    with pytest.raises(ValueError, match=f"column '{column}'.* null value"):
        gt.DataLoader(pa.table({column: values}), batch_size=2)


def test_bad_columns_argument():
    with pytest.raises(KeyError, match="nope"):
        gt.DataLoader(_table(), columns=["label", "nope"])
    with pytest.raises(TypeError, match="list of column names"):
        gt.DataLoader(_table(), columns="label")
    with pytest.raises(TypeError, match="columns= selects columns of a pyarrow Table"):
        gt.DataLoader(X, columns=["x"])


class _DatasetsTable:
    """datasets.table.Table's shape: the pyarrow Table as `.table`."""

    def __init__(self, table: "pa.Table") -> None:
        self.table = table


class _HFDataset:
    """A stand-in for datasets.Dataset: `.data.table`, `_indices` from select/shuffle, and a
    __getitem__/__len__ that would otherwise send it down the per-row Dataset path."""

    def __init__(self, table: "pa.Table", indices: np.ndarray | None = None) -> None:
        self.data = _DatasetsTable(table)
        self._indices = None if indices is None else _DatasetsTable(pa.table({"indices": pa.array(indices)}))

    def __len__(self) -> int:
        raise AssertionError("the loader must not fall back to per-row access")

    def __getitem__(self, index):
        raise AssertionError("the loader must not fall back to per-row access")


def test_duck_typed_hf_dataset():
    try:
        import datasets
    except ImportError:
        dataset = _HFDataset(_table())
    else:
        dataset = datasets.Dataset(_table())
    _assert_same(_batches(dataset, columns=["label", "input_ids"]),
                 _batches({"label": LABEL, "input_ids": _numpy_data()["input_ids"]}))


def test_duck_typed_hf_dataset_applies_its_indices():
    picked = np.array([4, 0, 30, 7, 7, 12], dtype=np.uint64)
    got = _batches(_HFDataset(_table(), picked), columns=["label", "x"])
    _assert_same(got, _batches({"label": LABEL[picked.astype(np.int64)], "x": X[picked.astype(np.int64)]}))


def test_loader_over_table_pickles_and_copies():
    loader = gt.DataLoader(_table(), batch_size=8, shuffle=True, seed=1, columns=["input_ids", "label"])
    clones = (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader))
    want = [{k: np.array(v) for k, v in b.items()} for b in loader]
    for clone in clones:
        assert clone.columns == ["input_ids", "label"]
        _assert_same([{k: np.array(v) for k, v in b.items()} for b in clone], want)


def test_import_gputrain_does_not_import_pyarrow():
    code = "import sys, gputrain, gputrain.data; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
