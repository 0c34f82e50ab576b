"""gputrain.data.ImageFolder through gputrain.DataLoader: images/s of one shuffled epoch over a
generated folder of JPEGs (IMAGES files of 256x256, 8 classes, quality 90), each decoded with
Pillow, resized to 224x224 (bilinear) and turned into CHW float32 by to_tensor, batch 32, at
num_workers 0 and 2 (worker processes, persistent, prefetch_factor 2).

Baseline in the same run, when /work/venv-torch (or GPUTRAIN_TORCH_VENV) can import torch and
Pillow: PyTorch's DataLoader with the same settings over torchvision's ImageFolder with
Resize((224, 224)) + ToTensor when torchvision is installed, otherwise over a torchvision-style
dataset written here (PIL open, convert("RGB"), resize bilinear, from_numpy().permute().div(255),
as torchvision's default loader and transforms do). Its main process runs torch ops on
GPUTRAIN_BENCH_TORCH_THREADS threads (default 1, as in its worker processes; 0 keeps PyTorch's
default, which on this loaded 2-vCPU VM made its 0-worker run 6-11x slower: benchmarks/README.md).
It runs in a subprocess right after ours; Pillow reaches it through the inherited PYTHONPATH when
that venv has none.

    PYTHONPATH=<build>/lib.linux-x86_64-cpython-311:<pillow> python -m pytest -p no:cacheprovider \\
        benchmarks/bench_imagefolder.py --benchmark-only
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain as gt
from _loader_bench import TIMED_EPOCHS, epoch_of, torch_epochs
from _timing import pedantic
from gputrain.data import ImageFolder, to_tensor

Image = pytest.importorskip("PIL.Image", reason="ImageFolder decodes with Pillow (pip install pillow)")

ROUNDS = 3
IMAGES = 512
CLASSES = 8
SIDE = 256
SIZE = (224, 224)
BATCH = 32
TORCH_THREADS = int(os.environ.get("GPUTRAIN_BENCH_TORCH_THREADS", "1"))  # 0: PyTorch's default

TORCH_SCRIPT = '''
import json, sys, time
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
root, batch, workers, rounds, side, threads = sys.argv[1], *map(int, sys.argv[2:7])
if threads:
    torch.set_num_threads(threads)
try:
    from torchvision import datasets, transforms
    data = datasets.ImageFolder(root, transform=transforms.Compose(
        [transforms.Resize((side, side)), transforms.ToTensor()]))
    kind = "torchvision " + __import__("torchvision").__version__
except ImportError:
    import os

    class Folder(torch.utils.data.Dataset):
        """torchvision's ImageFolder + Resize((side, side)) + ToTensor, written out."""

        def __init__(self, root):
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
                            for f in sorted(os.listdir(os.path.join(root, c)))]

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, target = self.samples[i]
            with open(path, "rb") as f:
                image = Image.open(f).convert("RGB")
            image = image.resize((side, side), Image.BILINEAR)
            x = torch.from_numpy(np.array(image, np.uint8, copy=True)).permute(2, 0, 1).contiguous()
            return x.float().div(255), target

    data = Folder(root)
    kind = "torchvision-style dataset (torchvision not installed)"
loader = DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers,
                    persistent_workers=workers > 0, prefetch_factor=2 if workers else None)
''' + TIMED_EPOCHS + '''
print(json.dumps({"seconds": times[1:], "torch": torch.__version__, "dataset": kind,
                  "threads": torch.get_num_threads()}))
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    ramp = np.add.outer(np.arange(SIDE), np.arange(SIDE))[..., None]
    for i in range(IMAGES):
        path = root / f"class{i % CLASSES}" / f"{i:05d}.jpg"
        path.parent.mkdir(exist_ok=True)
        pixels = (ramp * rng.integers(1, 4, 3) + rng.integers(0, 40, (SIDE, SIDE, 3))) % 256
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_imagefolder_epoch(benchmark, gputrain_benchmark, folder, workers):
    loader = gt.DataLoader(ImageFolder(folder, size=SIZE, transform=to_tensor), batch_size=BATCH, shuffle=True,
                           seed=0, num_workers=workers, persistent_workers=workers > 0,
                           prefetch_factor=2 if workers else None)

    epoch = epoch_of(loader)
    epoch()  # warm-up: workers started, slots sized, files in the page cache
    seconds = pedantic(benchmark, epoch, rounds=ROUNDS, warmup_rounds=0).median
    # no torch or no Pillow in that venv: the baseline columns stay null
    torch = torch_epochs(TORCH_SCRIPT, [folder, BATCH, workers, ROUNDS, SIZE[0], TORCH_THREADS], check=False)
    gputrain_benchmark.record(
        images=IMAGES, side=SIDE, size=list(SIZE), batch_size=BATCH, num_workers=workers,
        epoch_seconds_median=seconds, images_per_s=IMAGES / seconds,
        torch_images_per_s=IMAGES / torch["median"] if torch else None,
        ratio_torch=torch["median"] / seconds if torch else None,
        torch_version=torch["torch"] if torch else None, torch_dataset=torch["dataset"] if torch else None,
        torch_main_threads=torch["threads"] if torch else None,
    )
