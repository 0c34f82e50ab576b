"""A user's benchmark file: my model's training step in fp32 vs bf16, fed by 0 vs 2 loader workers.

    pip install "gputrain[test]"       # pytest-benchmark; gputrain's pytest plugin comes with gputrain
    pytest --benchmark-only examples/bench_my_model.py --benchmark-json=bench.json

Each result carries samples/s, the memory plan, the allocator's peaks and the machine facts in
its extra_info; --benchmark-compare shows a change against a saved run (--benchmark-autosave).
"""

import numpy as np
import pytest

import gputrain as gt
from gputrain.testing import assert_memory_within

X = np.random.default_rng(0).standard_normal((4096, 784), dtype=np.float32)
Y = np.arange(4096) % 10


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_train_step(gputrain_benchmark, gputrain_seed, precision, workers):
    model = gt.nn.Sequential(gt.nn.Linear(784, 512), gt.nn.GELU(), gt.nn.Linear(512, 10))
    optimizer = gt.optim.AdamW(model.parameters(), lr=1e-3)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)
    loader = gt.DataLoader((X, Y), batch_size=256, shuffle=True, drop_last=True, num_workers=workers,
                           persistent_workers=workers > 0)
    result = gputrain_benchmark.train_step(step, loader=loader)
    assert_memory_within(result, {"cpu": 64 << 20})
