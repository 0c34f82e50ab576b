"""Image folders: torchvision's ImageFolder layout and semantics, decoded with Pillow into NumPy
arrays (in the worker processes when the DataLoader has num_workers > 0).

    root/cat/001.jpg        classes = ["cat", "dog"] (sorted subdirectory names)
    root/cat/sub/002.png    class_to_idx = {"cat": 0, "dog": 1}
    root/dog/003.jpeg       samples = [(path, class_index), ...] (sorted per class, subfolders too)

    data = ImageFolder("root", size=(224, 224), transform=to_tensor)
    loader = gt.DataLoader(data, batch_size=64, shuffle=True, num_workers=4)
    for images, labels in loader:   # images (64, 3, 224, 224) float32 in [0, 1], labels (64,) int64
        ...

A sample is (image, class_index): the image an HWC uint8 array (HW for mode "L"), after the
optional `size` resize and `transform`. Pillow (PyPI `pillow`) is imported when a dataset is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gputrain.data.dataset import Dataset

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _pillow() -> Any:
    """The PIL.Image module, or an ImportError saying which package to install."""
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError("gputrain.data.ImageFolder decodes images with Pillow, which is not installed: "
                          "pip install pillow") from error
    return Image


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """The sorted subdirectory names of `root` and their indices (torchvision's find_classes)."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"ImageFolder: no class folder in root {root!r}")
    return classes, {name: i for i, name in enumerate(classes)}


def make_samples(root: str, class_to_idx: dict[str, int], is_valid_file: Callable[[str], bool],
                 allow_empty: bool = False) -> list[tuple[str, int]]:
    """(path, class index) of every valid file under root/<class>/, subfolders included, in
    sorted order per class; a FileNotFoundError naming the classes without any, unless allow_empty."""
    samples = []
    empty = []
    for name in sorted(class_to_idx, key=class_to_idx.__getitem__):
        found = 0
        for folder, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for file in sorted(files):
                path = os.path.join(folder, file)
                if is_valid_file(path):
                    samples.append((path, class_to_idx[name]))
                    found += 1
        if found == 0:
            empty.append(name)
    if empty and not allow_empty:
        raise FileNotFoundError(f"ImageFolder: no valid image file in the class folder(s) {', '.join(empty)} "
                                f"of root {root!r}")
    return samples


class _HasExtension:
    """A picklable is_valid_file: the lower-cased name ends with one of `extensions`."""

    def __init__(self, extensions: tuple[str, ...]) -> None:
        self.extensions = extensions

    def __call__(self, path: str) -> bool:
        return path.lower().endswith(self.extensions)


class ImageFolder(Dataset[tuple[Any, int]]):
    """Images in root/<class>/... as torchvision's ImageFolder finds them: classes, class_to_idx,
    samples (= imgs) and targets as there. `extensions` (default IMG_EXTENSIONS) or
    `is_valid_file(path)` (not both) choose the files. Each image is decoded with Pillow and
    converted to `mode` ("RGB": (H, W, 3) uint8; "L": (H, W) uint8), resized to `size`
    (height, width) with bilinear filtering when given, then passed to `transform`;
    `target_transform` gets the class index."""

    def __init__(self, root: str | os.PathLike, transform: Callable[[np.ndarray], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, extensions: Sequence[str] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None, mode: str = "RGB",
                 size: tuple[int, int] | None = None, allow_empty: bool = False) -> None:
        _pillow()
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"ImageFolder: root {root!r} is not a directory")
        if extensions is not None and is_valid_file is not None:
            raise ValueError("ImageFolder: pass extensions or is_valid_file, not both")
        if mode not in ("RGB", "L"):
            raise ValueError(f"ImageFolder: mode must be 'RGB' or 'L', got {mode!r}")
        if size is not None and (not isinstance(size, (tuple, list)) or len(size) != 2
                                 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)):
            raise ValueError(f"ImageFolder: size must be (height, width) of positive ints, got {size!r}")
        if is_valid_file is None:
            if isinstance(extensions, str):
                extensions = (extensions,)
            is_valid_file = _HasExtension(tuple(e.lower() for e in (extensions or IMG_EXTENSIONS)))
        self.root = root
        self.transform = transform
        self.target_transform = target_transform
        self.mode = mode
        self.size = None if size is None else (int(size[0]), int(size[1]))
        self.classes, self.class_to_idx = find_classes(root)
        self.samples = make_samples(root, self.class_to_idx, is_valid_file, allow_empty)
        self.imgs = self.samples
        self.targets = [target for _, target in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, path: str) -> np.ndarray:
        """The image at `path` decoded, converted to `mode` and resized to `size`; an OSError
        naming the file when Pillow cannot read it."""
        image_module = _pillow()
        try:
            with image_module.open(path) as image:
                if self.size is not None and image.format == "JPEG":
                    image.draft(self.mode, (self.size[1], self.size[0]))  # DCT scaling, never below size
                image = image.convert(self.mode)
                if self.size is not None and image.size != (self.size[1], self.size[0]):
                    image = image.resize((self.size[1], self.size[0]), image_module.BILINEAR)
                return np.asarray(image)
        except (OSError, ValueError, SyntaxError) as error:  # Pillow's decoders raise all three
            raise OSError(f"ImageFolder: cannot decode image file {path!r}: {error}") from error

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        image = self.load(path)
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __repr__(self) -> str:
        return (f"ImageFolder({self.root!r}, {len(self.samples)} images, {len(self.classes)} classes, "
                f"mode={self.mode!r}, size={self.size})")


def to_tensor(image: np.ndarray) -> np.ndarray:
    """torchvision's to_tensor for decoded images: HWC (or HW) uint8 -> CHW (or 1HW) float32 in [0, 1]."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise TypeError(f"to_tensor: image must be an (H, W) or (H, W, C) uint8 array, got {image.dtype} "
                        f"with shape {image.shape}")
    chw = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
    out = np.empty(chw.shape, np.float32)
    return np.divide(chw, np.float32(255), out=out)  # x / 255 as torchvision, not x * (1 / 255)


__all__ = ["IMG_EXTENSIONS", "ImageFolder", "find_classes", "make_samples", "to_tensor"]
