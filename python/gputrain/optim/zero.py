"""ZeRO-1 (stage 1 of DeepSpeed's Zero Redundancy Optimizer): AdamW's state sharded over the ranks.

With ``AdamW(..., zero_stage=1)`` after ``gputrain.distributed.init()`` over N > 1 processes, each
rank's C optimizer covers only its shard of the model's flattened parameters: chunk ``rank`` of
the model's parameter arena cut into N contiguous chunks, the layout of the communicator's
reduce-scatter and all-gather. Its state (exp_avg, exp_avg_sq, max_exp_avg_sq, and the pinned
master copy of the part offloaded by cpu_offload_fraction) is 1/N of the unsharded optimizer's.
The training step (TrainStep) reduce-scatters the gradients, checks for inf/NaN and takes the
gradient norm over the shards (combined over the ranks into the unsharded values, bit for bit),
updates the shard and all-gathers the parameters: the weights are bit-identical to unsharded
data parallelism. state_dict() gathers the whole state on every rank (a collective: every rank
calls it), so a checkpoint loads into any world size, one process included; load_state_dict()
keeps this rank's shard of it.

After a sharded step only this rank's shard of the model's gradients holds the summed gradients
(the rest keep this rank's own); the step's grad_norm is the global one. The update runs inside
TrainStep only: step(), clip_grad_norm_() and add_param_group() of a sharded optimizer raise.
On an accelerator (sim; cuda compiled, NOT YET RUN ON A GPU) the step all-reduces the gradients
on the device as unsharded data parallelism does (so the inf check and the norm are its own),
updates this rank's shard (its offloaded share in pinned host memory included) and all-gathers the
parameters on the device, with the step's one wait; the reduce-scatter of the gradients is the
cpu path's only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ZERO_STAGES", "Shard", "check_zero_stage", "shard_range"]

ZERO_STAGES = (0, 1)


def check_zero_stage(value: Any) -> int:
    """zero_stage as 0 or 1 (TypeError/ValueError naming it otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"zero_stage must be an int (0 or 1), not {type(value).__name__}")
    if int(value) not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be 0 (no sharding) or 1 (optimizer state sharded), got {value}; "
                         "stages 2 and 3 (gradients, parameters) are not implemented")
    return int(value)


def shard_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """[first, end) of rank's chunk of n elements cut into size chunks (csrc/dist gt_comm_chunk)."""
    first = n // size * rank + n % size * rank // size
    end = n // size * (rank + 1) + n % size * (rank + 1) // size
    return first, end


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


class Shard:
    """Where this rank's shard of a model's parameter arena cuts an optimizer's parameters."""

    def __init__(self, params: list[Any], comm: Any) -> None:
        owners = {id(p._owner): p._owner for p in params}
        if any(p._owner is None for p in params) or len(owners) != 1:
            raise ValueError("params: zero_stage=1 shards the parameters of one compiled model; build the "
                             "optimizer from model.parameters() after the model is built")
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.on_device = params[0]._device is not None  # the C optimizer cuts the shard (ModelOptimizer)
        model = next(iter(owners.values())).model
        self._model = model
        self.check_unfrozen()
        self._flat, self._flat_grads = (None, None) if self.on_device else model.parameter_arrays()
        self.n = int(model.num_parameters if self.on_device else self._flat.size)
        self.first, self.end = shard_range(self.n, self.size, self.rank)
        self._placed = [self._placement(p) for p in params]  # what the shard was cut from
        self.offsets: list[int] = []  # each parameter's first element in the arena
        self.bounds: list[tuple[int, int]] = []  # each parameter's [lo, hi) inside this shard
        for index, p in enumerate(params):
            offset = self._offset(p)
            if offset is None:
                raise ValueError(f"params[{index}]: not in its model's parameter arena; zero_stage=1 needs the "
                                 "model's own parameters")
            lo = min(max(self.first - offset, 0), p.numel())
            hi = max(min(self.end - offset, p.numel()), lo)
            self.offsets.append(offset)
            self.bounds.append((lo, hi))

    def _placement(self, p: Any) -> Any:
        """The object whose identity says where p lives: its array, or its DeviceSlot on a device."""
        return p._device if self.on_device else p.data

    def _offset(self, p: Any) -> int | None:
        """p's first element in the model's parameter arena; None when it is not in it."""
        if self.on_device:
            return int(p._device.offset)
        offset, rem = divmod(_address(p.data) - _address(self._flat), 4)
        return None if rem or offset < 0 or offset + p.numel() > self.n else offset

    def views(self, params: list[Any]) -> list[tuple[Any, Any]]:
        """(parameter slice, gradient slice or None) of each parameter's part in this shard; on a
        device (DeviceSlot, requires_grad), which the C optimizer cuts to the shard itself."""
        if self.on_device:
            return [(p._device, p.requires_grad) for p in params]
        out = []
        for p, offset, (lo, hi) in zip(params, self.offsets, self.bounds):
            grad = self._flat_grads[offset + lo:offset + hi] if p.requires_grad else None
            out.append((self._flat[offset + lo:offset + hi], grad))
        return out

    def check_unfrozen(self) -> None:
        """ValueError when the model has frozen parameters: its gradient arena then holds the trainable
        ones only, so it is not cut as the parameter arena (ZeRO-1 cuts both alike)."""
        if self._model.num_gradients != self._model.num_parameters:
            raise ValueError("zero_stage=1: the model has frozen parameters (requires_grad=False), whose gradient "
                             "arena is not laid out as its parameters; ZeRO-1 shards both alike: unfreeze them "
                             "or leave zero_stage at 0")

    def check_unmoved(self, params: list[Any]) -> None:
        """RuntimeError when a parameter moved since the shard was cut (its model was rebuilt);
        ValueError when the model has frozen parameters since (check_unfrozen)."""
        self.check_unfrozen()
        if any(self._placement(p) is not placed for p, placed in zip(params, self._placed)):
            raise RuntimeError("zero_stage=1: a parameter moved to another arena after the optimizer was built; "
                               "build the optimizer after the model")

    def local(self, index: int, array: np.ndarray) -> np.ndarray:
        """This shard's part of parameter `index`'s flat array."""
        lo, hi = self.bounds[index]
        return np.ascontiguousarray(array[lo:hi])

    def gather(self, core: Any, numels: list[int]) -> list[dict[str, Any]]:
        """Every parameter's whole state, as core.get_state gives it unsharded, from every rank's
        shard (all-gathers: every rank calls it)."""
        local = [core.get_state(i) for i in range(len(numels))]
        steps = np.full((self.size, len(numels)), -1.0)
        for i, state in enumerate(local):
            if self.bounds[i][1] > self.bounds[i][0]:
                steps[self.rank, i] = state["step"]
        self.comm.allgather(steps.reshape(-1))
        step_of = np.maximum(steps.max(axis=0), 0.0)  # a parameter in no shard (no elements) never stepped
        names = [name for name in local[0] if name != "step"] if local else []
        gathered = {}
        for name in names:
            flat = np.zeros(self.n, np.float32)
            for i, state in enumerate(local):
                lo, hi = self.bounds[i]
                flat[self.offsets[i] + lo:self.offsets[i] + hi] = state[name]
            self.comm.allgather(flat)
            gathered[name] = flat
        return [{"step": int(step_of[i]), **{name: gathered[name][o:o + numel].copy() for name in names}}
                for i, (o, numel) in enumerate(zip(self.offsets, numels))]
