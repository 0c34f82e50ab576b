"""gputrain.data: the DataLoader, its samplers, and text data (token windows, ragged rows, buckets).

    from gputrain.data import DataLoader, DistributedSampler, TokenDataset, bucket_by_length
"""

from __future__ import annotations

from gputrain.data._ragged import RaggedArray
from gputrain.data._worker import WorkerInfo, get_worker_info
from gputrain.data.loader import DataLoader
from gputrain.data.sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)
from gputrain.data.text import BucketBatchSampler, TokenDataset, bucket_by_length

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "DataLoader",
    "DistributedSampler",
    "RaggedArray",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "TokenDataset",
    "WorkerInfo",
    "bucket_by_length",
    "get_worker_info",
]
