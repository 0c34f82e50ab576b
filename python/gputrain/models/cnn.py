"""SimpleCNN: a small configurable convolutional classifier for (N, C, H, W) images.

    model = gt.models.SimpleCNN(in_channels=1, num_classes=10, channels=(32, 64), image_size=8)
    logits = model(x)                      # x float32 (N, 1, 8, 8) -> (N, 10)
    trainer = gt.Trainer(model, args, train_dataset=(x, y))

Each stage is Conv2d 3x3 (padding 1) [+ BatchNorm2d] + ReLU + MaxPool2d(2); a stage's pool halves
only the dimensions of at least 2 (a 1-pixel dimension is left as it is, and a 1x1 map is not
pooled). Then global average pooling (AdaptiveAvgPool2d(1)) or a Flatten of the whole map,
optional dropout, and a Linear head. With batch_norm the convolutions have no bias (the
normalisation's shift replaces it), as in torchvision's models.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gputrain.nn.layers import (
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU, Sequential, _positive_int,
)
from gputrain.nn.module import Module


def _image_size(value: object) -> tuple[int, int]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2:
        raise ValueError(f"image_size must be an int or a pair (height, width), got {value!r}")
    return _positive_int(items[0], "image_size"), _positive_int(items[1], "image_size")


def _channels(value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"channels must be a non-empty sequence of ints (one per stage), got {value!r}")
    return tuple(_positive_int(c, "channels") for c in value)


def _dropout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {value!r}")
    return float(value)


class SimpleCNN(Module):
    """``len(channels)`` stages of Conv3x3(pad 1) [+ BatchNorm2d] + ReLU + MaxPool2d over
    (N, in_channels, H, W) float32 images of ``image_size`` (int or (H, W)), then
    ``global_pool`` (AdaptiveAvgPool2d(1)) or the flattened map, ``dropout`` and a Linear head to
    ``num_classes`` logits. ``feature_size`` is the (H, W) of the last stage's map.

    state_dict (PyTorch's names, as torch.nn.Sequential would give them): ``features.{i}.weight``
    for the convolutions and BatchNorms (``.bias``, ``.running_mean``, ``.running_var``,
    ``.num_batches_tracked``), ``head.weight`` and ``head.bias``."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, channels: Sequence[int] = (32, 64),
                 image_size: int | tuple[int, int] = 32, batch_norm: bool = True, dropout: float = 0.0,
                 global_pool: bool = True) -> None:
        super().__init__()
        self.in_channels = _positive_int(in_channels, "in_channels")
        self.num_classes = _positive_int(num_classes, "num_classes")
        self.channels = _channels(channels)
        self.image_size = _image_size(image_size)
        self.batch_norm = bool(batch_norm)
        self.dropout = _dropout(dropout)
        self.global_pool = bool(global_pool)
        layers, (h, w) = self._features()
        self.feature_size = (h, w)
        self.features = Sequential(*layers)
        self.pool = AdaptiveAvgPool2d(1) if self.global_pool else None
        self.flatten = Flatten()
        self.head_dropout = Dropout(self.dropout) if self.dropout > 0 else None
        features = self.channels[-1] * (1 if self.global_pool else h * w)
        self.head = Linear(features, self.num_classes)
        self._compile()

    def _features(self) -> tuple[list[Module], tuple[int, int]]:
        """The stages' layers and the (H, W) of their output."""
        layers: list[Module] = []
        (h, w), previous = self.image_size, self.in_channels
        for out in self.channels:
            layers.append(Conv2d(previous, out, 3, padding=1, bias=not self.batch_norm))
            if self.batch_norm:
                layers.append(BatchNorm2d(out))
            layers.append(ReLU())
            kernel = (2 if h >= 2 else 1, 2 if w >= 2 else 1)
            if kernel != (1, 1):
                layers.append(MaxPool2d(kernel))
                h, w = h // kernel[0], w // kernel[1]
            previous = out
        return layers, (h, w)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        children = (("features", self.features), ("pool", self.pool), ("flatten", self.flatten),
                    ("head_dropout", self.head_dropout), ("head", self.head))
        return ((name, child) for name, child in children if child is not None)

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        return ("sequential", [child._spec_in(tied) for _, child in self.named_children()])

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, num_classes={self.num_classes}, channels={self.channels}, "
                f"image_size={self.image_size}, batch_norm={self.batch_norm}, dropout={self.dropout}, "
                f"global_pool={self.global_pool}")
