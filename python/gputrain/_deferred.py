"""The link between a GradScaler or an optimizer and the TrainStep(sync=False) whose steps in flight
will still change its state (the scale, the step counts): the step binds itself when its first step
goes in flight and unbinds when the last one is resolved; reading the state (state_dict()) resolves
those steps first."""

from __future__ import annotations

from collections.abc import Callable


class DeferredSteps:
    """Mixin of gputrain.amp.GradScaler and gputrain.optim.Optimizer (no state of its own: the
    class that mixes it in provides the `_deferred_resolver` attribute, None when unbound)."""

    __slots__ = ()
    _deferred_resolver: Callable[[], None] | None

    def _bind_deferred(self, resolve: Callable[[], None] | None) -> None:
        """TrainStep(sync=False) with a scaler: `resolve` resolves its steps in flight (None: none left)."""
        self._deferred_resolver = resolve

    def _resolve_deferred(self) -> None:
        """Resolves the bound TrainStep's steps in flight, if any (before the state is read)."""
        resolve = self._deferred_resolver
        if resolve is not None:
            resolve()
