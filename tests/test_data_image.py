"""gputrain.data.ImageFolder: torchvision's folder semantics, Pillow's decoded bytes, the same
batches at any num_workers, and clear errors for a bad root, an empty class or an unreadable file."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image  # a test extra (pyproject's [test]): ImageFolder decodes with Pillow

import gputrain as gt
from gputrain.data import ImageFolder, to_tensor


def picture(seed: int, size: tuple[int, int] = (12, 16)) -> np.ndarray:
    """An (H, W, 3) uint8 image with smooth content (JPEG keeps it recognisable)."""
    rng = np.random.default_rng(seed)
    h, w = size
    ramp = np.add.outer(np.arange(h) * 9, np.arange(w) * 5)[..., None] + rng.integers(0, 60, 3)
    return (ramp % 256).astype(np.uint8)


@pytest.fixture
def folder(tmp_path):
    """root/{bird,cat,dog}: PNG and JPEG images, a subfolder, and a text file that is skipped."""
    layout = {"cat": ["b.png", "a.jpg", "sub/c.PNG"], "dog": ["x.jpeg", "y.png"], "bird": ["z.png"]}
    for seed, (name, files) in enumerate(layout.items()):
        for k, file in enumerate(files):
            path = tmp_path / name / file
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(picture(10 * seed + k)).save(path, format="JPEG" if "jp" in file else "PNG")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    return tmp_path


def test_classes_and_samples_follow_torchvision(folder):
    data = ImageFolder(folder)
    assert data.classes == ["bird", "cat", "dog"]
    assert data.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    relative = [(os.path.relpath(p, folder), c) for p, c in data.samples]
    assert relative == [("bird/z.png", 0), ("cat/a.jpg", 1), ("cat/b.png", 1), ("cat/sub/c.PNG", 1),
                        ("dog/x.jpeg", 2), ("dog/y.png", 2)]
    assert data.targets == [0, 1, 1, 1, 2, 2] and data.imgs is data.samples and len(data) == 6
    assert [p[-5:] for p, _ in ImageFolder(folder, extensions=(".PNG",)).samples] == ["z.png", "b.png", "c.PNG",
                                                                                       "y.png"]
    assert len(ImageFolder(folder, is_valid_file=lambda p: p.endswith(".txt"), allow_empty=True)) == 1


def test_decoded_bytes_equal_pillows(folder):
    data = ImageFolder(folder)
    for path, target in data.samples:
        image, label = data[data.samples.index((path, target))]
        with Image.open(path) as reference:
            expected = np.asarray(reference.convert("RGB"))
        assert image.dtype == np.uint8 and image.shape == (12, 16, 3) and label == target
        np.testing.assert_array_equal(image, expected)
    png = next(p for p, _ in data.samples if p.endswith("b.png"))
    np.testing.assert_array_equal(data.load(png), picture(0))  # cat/b.png, PNG is lossless
    gray, _ = ImageFolder(folder, mode="L")[0]
    with Image.open(data.samples[0][0]) as reference:
        np.testing.assert_array_equal(gray, np.asarray(reference.convert("L")))


def test_size_resizes_with_pillow_and_to_tensor_makes_chw_floats(folder):
    data = ImageFolder(folder, size=(6, 8), transform=to_tensor)
    path = data.samples[2][0]  # cat/b.png
    image, _ = data[2]
    with Image.open(path) as reference:
        expected = np.asarray(reference.convert("RGB").resize((8, 6), Image.BILINEAR))
    assert image.dtype == np.float32 and image.shape == (3, 6, 8) and image.flags.c_contiguous
    np.testing.assert_array_equal(image, expected.transpose(2, 0, 1).astype(np.float32) / np.float32(255))
    assert ImageFolder(folder, size=(5, 7))[1][0].shape == (5, 7, 3)  # a JPEG: draft, then resize
    assert to_tensor(np.zeros((2, 3), np.uint8)).shape == (1, 2, 3)
    with pytest.raises(TypeError, match="uint8"):
        to_tensor(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_the_same_at_any_num_workers(folder, workers):
    data = ImageFolder(folder, transform=to_tensor)
    reference = [(data[i][0], data[i][1]) for i in range(len(data))]
    loader = gt.DataLoader(data, batch_size=4, shuffle=True, seed=3, num_workers=workers)
    order = list(gt.DataLoader(np.arange(len(data)), batch_size=4, shuffle=True, seed=3))
    batches = list(loader)
    assert [len(b[1]) for b in batches] == [4, 2]
    for (images, labels), indices in zip(batches, order):
        assert images.shape == (len(indices), 3, 12, 16) and labels.dtype == np.int64
        np.testing.assert_array_equal(images, np.stack([reference[i][0] for i in indices]))
        np.testing.assert_array_equal(labels, [reference[i][1] for i in indices])


def test_bad_root_empty_class_and_bad_arguments_are_clear(folder, tmp_path_factory):
    with pytest.raises(FileNotFoundError, match="root .*missing.* is not a directory"):
        ImageFolder(folder / "missing")
    with pytest.raises(FileNotFoundError, match="no class folder"):
        ImageFolder(tmp_path_factory.mktemp("flat"))
    (folder / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no valid image file in the class folder.* empty"):
        ImageFolder(folder)
    assert ImageFolder(folder, allow_empty=True).classes == ["bird", "cat", "dog", "empty"]
    with pytest.raises(ValueError, match="extensions or is_valid_file"):
        ImageFolder(folder, extensions=(".png",), is_valid_file=str.isalpha)
    with pytest.raises(ValueError, match="mode"):
        ImageFolder(folder, mode="CMYK")
    with pytest.raises(ValueError, match="size"):
        ImageFolder(folder, size=(0, 4), allow_empty=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unreadable_image_is_named_in_the_main_process(folder, workers):
    (folder / "dog" / "x.jpeg").write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(OSError, match=r"cannot decode image file .*x\.jpeg") as caught:
        list(gt.DataLoader(ImageFolder(folder), batch_size=2, num_workers=workers))
    assert ("in DataLoader worker process" in str(caught.value)) == (workers > 0)
    buffer = io.BytesIO()
    Image.fromarray(picture(1, (64, 64))).save(buffer, format="PNG")
    (folder / "cat" / "b.png").write_bytes(buffer.getvalue()[:200])  # truncated: batch 1, before x.jpeg
    with pytest.raises(OSError, match=r"cannot decode image file .*b\.png"):
        list(gt.DataLoader(ImageFolder(folder), batch_size=2, num_workers=workers))


def test_a_missing_pillow_is_named():
    script = ("import sys; sys.modules['PIL'] = None\n"
              "from gputrain.data import ImageFolder\n"
              "try:\n    ImageFolder('.')\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "pip install pillow" in done.stdout


def test_pickles_for_spawned_workers(folder):
    data = ImageFolder(folder, extensions=".png", size=(6, 8), transform=to_tensor)
    copy = pickle.loads(pickle.dumps(data))  # what multiprocessing_context="spawn" sends each worker
    assert copy.samples == data.samples and copy.class_to_idx == data.class_to_idx
    np.testing.assert_array_equal(copy[1][0], data[1][0])
