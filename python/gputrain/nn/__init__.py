"""gputrain.nn: layers composing into models trained by one C call per step."""

from gputrain.nn.parameter import Parameter

__all__ = ["Parameter"]
