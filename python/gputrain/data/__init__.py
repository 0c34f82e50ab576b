"""gputrain.data: the DataLoader, its samplers, and text datasets.

    from gputrain.data import DataLoader, DistributedSampler, TokenDataset, bucket_by_length
"""

from __future__ import annotations

from gputrain.data._worker import WorkerInfo, get_worker_info
from gputrain.data.loader import DataLoader
from gputrain.data.sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

__all__ = [
    "BatchSampler",
    "DataLoader",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "WorkerInfo",
    "get_worker_info",
]
