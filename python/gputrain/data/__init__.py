"""gputrain.data: the DataLoader, its samplers, Dataset classes and collate functions, text
data (token windows, ragged rows, buckets, packed documents, texts tokenized into ragged columns) and
image folders (decoded with Pillow).

    from gputrain.data import DataLoader, Dataset, DistributedSampler, TokenDataset, default_collate
"""

from __future__ import annotations

from gputrain.data._ragged import RaggedArray
from gputrain.data._worker import WorkerInfo, get_worker_info
from gputrain.data.collate import DataCollatorWithPadding, Padded, default_collate, default_convert, pad_collate
from gputrain.data.dataset import Dataset, IterableDataset
from gputrain.data.image import ImageFolder, to_tensor
from gputrain.data.loader import DataLoader
from gputrain.data.packing import DataCollatorWithFlattening, pack_sequences
from gputrain.data.sampler import (
    BatchSampler,
    DistributedSampler,
    LengthGroupedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)
from gputrain.data.text import BucketBatchSampler, TokenDataset, bucket_by_length
from gputrain.data._tokenize import tokenize

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "DataCollatorWithFlattening",
    "DataCollatorWithPadding",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "LengthGroupedSampler",
    "ImageFolder",
    "IterableDataset",
    "Padded",
    "RaggedArray",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "TokenDataset",
    "WorkerInfo",
    "bucket_by_length",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "pack_sequences",
    "pad_collate",
    "to_tensor",
    "tokenize",
]
