"""Errors raised in worker threads, carried to the caller with their original traceback text
(the shape of PyTorch's ExceptionWrapper: "Caught X in DataLoader worker thread N.")."""

from __future__ import annotations

import sys
import traceback
from typing import NoReturn


class WorkerError:
    """An exception caught in a worker thread, to be raised again in the consumer."""

    __slots__ = ("exc_type", "text", "where")

    def __init__(self, exc: BaseException, where: str) -> None:
        self.exc_type = type(exc)
        self.text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.where = where

    @classmethod
    def current(cls, where: str) -> "WorkerError":
        """The exception being handled."""
        exc = sys.exc_info()[1]
        assert exc is not None
        return cls(exc, where)

    def reraise(self) -> NoReturn:
        """Raises an exception of the original type whose message holds the original traceback."""
        message = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.text}"
        if self.exc_type is KeyError:  # KeyError repr()s its message; keep the newlines readable
            message = _KeyErrorMessage(message)
        try:
            exception = self.exc_type(message)
        except Exception:
            raise RuntimeError(message) from None
        raise exception


class _KeyErrorMessage(str):
    """A str whose repr is itself, so KeyError shows a multi-line message as it is."""

    def __repr__(self) -> str:
        return self


def raise_delivered_error(error: object) -> NoReturn:
    """Raises what a worker delivered in place of a batch."""
    if isinstance(error, WorkerError):
        error.reraise()
    if isinstance(error, BaseException):
        raise error
    raise RuntimeError(f"DataLoader worker delivered an error of unexpected type {type(error).__name__}")


__all__ = ["WorkerError", "raise_delivered_error"]
