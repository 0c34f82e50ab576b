"""The complete memory plan of a training run, per memory kind, before anything is allocated.

    plan = gt.memory_plan.plan_training(model, (32, 64), precision="bf16",
                                        optimizer=gt.memory_plan.OptimizerSpec("adamw", numels),
                                        ema=True, loader=gt.memory_plan.LoaderSpec((x, y), 128))
    print(plan)                       # every region, per kind, against the allocator's limits
    plan["cpu"]["total"]              # == the cpu pool's peak after the first step, to the byte

Every number comes from the C planner of the code that later allocates it (the model's arenas,
the model's step scratch, the optimizer's device and pinned arenas, the EMA
shadow, the loader's slots and, with its device=, its device batches), as the allocator reserves it (whole GT_ALIGN blocks); Python only
adds them up per memory kind: "cpu", "pinned", "cuda:N" and "sim:N", the pools of
gputrain.memory_stats.

A model too large for this machine's memory is planned by building it inside planning():

    with gt.memory_plan.planning():   # laid out, never allocated (it plans, it does not run)
        model = gt.models.LlamaForCausalLM(config, init_weights=False).to("sim")
    plan = gt.memory_plan.plan_training(model, (1, 3, 2048), precision="bf16", ...)

Its plans equal those of the same model built outside, to the byte.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain import _C
from gputrain._vocab import c_dtype, parse_precision
from gputrain.memory import format_bytes
from gputrain.nn.module import Module, planning
from gputrain.optim.optimizer import Optimizer
from gputrain.step import TrainStep

__all__ = ["LoaderSpec", "MemoryPlan", "OptimizerSpec", "available_memory", "describe_over", "fit",
           "micro_batch_sizes", "plan_step", "plan_training", "planning"]

_ACTIVATION_PARTS = ("activations", "recompute", "backward_scratch", "loss_buffers", "workspace")


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer before it is built: its kind ("adamw", "sgd" or "adamw8bit"), the element count of each
    parameter, its groups' hyperparameters (only amsgrad and momentum change its memory) and
    the share of its state offloaded to pinned host memory. zero_shards=N > 1 (ZeRO-1,
    AdamW(zero_stage=1) over N ranks): the plan is one rank's, whose state covers at most
    ceil(sum(numels) / N) elements (its offloaded share included)."""

    kind: str
    numels: tuple[int, ...]
    hparams: tuple[dict[str, Any], ...] = ({},)
    cpu_offload_fraction: float = 0.0
    offload_chunk_numel: int = 0
    zero_shards: int = 1
    min_8bit_size: int = 4096  # kind "adamw8bit": parameters with fewer elements keep float32 moments

    def per_rank_numels(self) -> list[int]:
        """The element counts of one rank's optimizer state: numels, or the largest ZeRO-1 shard."""
        if isinstance(self.zero_shards, bool) or not isinstance(self.zero_shards, int) or self.zero_shards < 1:
            raise ValueError(f"zero_shards must be an int >= 1, got {self.zero_shards!r}")
        if self.zero_shards == 1:
            return list(self.numels)
        return [-(-sum(self.numels) // self.zero_shards)]

    @classmethod
    def of(cls, optimizer: Optimizer, model: Module) -> OptimizerSpec:
        """The spec of a built optimizer: gputrain.optim.AdamW or SGD."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a gputrain optimizer, not {type(optimizer).__name__}")
        return cls(optimizer._kind, tuple(p.numel() for p in optimizer._params()),
                   tuple(optimizer._hparams(g) for g in optimizer.param_groups),
                   optimizer.cpu_offload_fraction, optimizer.offload_chunk_numel,
                   optimizer._shard.size if optimizer._shard is not None else 1,
                   getattr(optimizer, "min_8bit_size", 4096))


@dataclass(frozen=True)
class LoaderSpec:
    """A gputrain.DataLoader's C engine before it is built: the dataset's arrays, the rows of its
    largest batch and its workers, prefetch and pinning; and `device` (its device=, "cuda:N" or
    "sim:N"; None: host batches), where its transfer keeps device batches of a slot's layout in
    flight: the one handed out, the one copied ahead and the caller's previous one (still bound
    in a `for` loop while the next copy is queued), whatever prefetch_factor is."""

    arrays: tuple[Any, ...]
    max_rows: int
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    device: str | None = None

    @classmethod
    def of(cls, loader: Any, max_rows: int | None = None) -> LoaderSpec:
        """The spec of a DataLoader whose batches have at most `max_rows` rows (default: its batch_size)."""
        from gputrain.data._ragged import RaggedArray

        arrays = tuple(a.field() if isinstance(a, RaggedArray) else a for a in loader._arrays)
        rows = max_rows if max_rows is not None else (loader.batch_size or 1)
        return cls(arrays, rows, loader.num_workers, loader.prefetch_factor, loader.pin_memory,
                   getattr(loader, "device", None))


class MemoryPlan(dict):
    """{memory kind: {region: bytes, ..., "total": bytes}}, with the pools' limits.

    Attributes:
        device: the model's memory kind ("cpu" or "cuda:N").
        micro_batch_shape: the input shape of one micro-batch the activations are planned for.
        limits: {kind: the allocator's limit in bytes, or None}.
        alternatives: other settings' activation arenas, e.g. with gradient checkpointing on.
        settings: what the plan was made for (precision, checkpointing, offload, ...), for display.
        activation_arena: bytes of the activation arena (the only part a micro-batch size changes).
    """

    def __init__(self, regions: Mapping[str, Mapping[str, int]], *, device: str,
                 micro_batch_shape: tuple[int, ...], alternatives: Mapping[str, int],
                 settings: Mapping[str, Any], activation_arena: int) -> None:
        super().__init__({kind: {**parts, "total": sum(parts.values())} for kind, parts in regions.items()})
        self.device = device
        self.activation_arena = activation_arena
        self.micro_batch_shape = tuple(micro_batch_shape)
        self.alternatives = dict(alternatives)
        self.settings = dict(settings)
        self.limits = {kind: _C.memory_stats(device=kind)["limit_bytes"] for kind in self}

    def total(self, kind: str) -> int:
        """Planned bytes of `kind` (0 for a kind the run does not use)."""
        return self[kind]["total"] if kind in self else 0

    def over(self, available: Mapping[str, int | None]) -> dict[str, int]:
        """{kind: bytes over} for every kind whose total exceeds `available` bytes (None: no cap)."""
        return {kind: self.total(kind) - room for kind, room in available.items()
                if room is not None and self.total(kind) > room}

    def _label(self, kind: str) -> str:
        if kind == self.device:
            return f"{kind} (device)"
        return f"{kind} (pinned host)" if kind == "pinned" else f"{kind} (host)"

    def __str__(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        lines = [f"Memory plan for micro-batches of shape {self.micro_batch_shape} ({settings}):"]
        for kind, regions in self.items():
            limit = self.limits.get(kind)
            lines.append(f"  {self._label(kind)}: limit {format_bytes(limit)}")
            lines.extend(f"    {name:<20} {format_bytes(value):>12} ({value:,} bytes)"
                         for name, value in regions.items() if name != "total")
            total = regions["total"]
            verdict = "" if limit is None else (" -- fits" if total <= limit else
                                                f" -- OVER the limit by {total - limit:,} bytes")
            lines.append(f"    {'total':<20} {format_bytes(total):>12} ({total:,} bytes){verdict}")
        lines.extend(f"  {name}: {format_bytes(value)} ({value:,} bytes)" for name, value in self.alternatives.items())
        return "\n".join(lines)


def _add(regions: dict[str, dict[str, int]], kind: str, name: str, value: int) -> None:
    """regions[kind][name] += value; a region of 0 bytes is left out."""
    if value:
        bucket = regions.setdefault(kind, {})
        bucket[name] = bucket.get(name, 0) + int(value)


def _model_regions(regions: dict[str, dict[str, int]], compiled: Any, shape: tuple[int, ...], dt: str,
                   checkpointing: bool | str) -> int:
    """The model's arenas; the activation arena in its parts (their sum is the arena's size).
    Returns the activation arena's bytes."""
    device = compiled.device
    arenas = compiled.arena_plan(shape, checkpointing=checkpointing, precision=dt)
    parts = compiled.plan(shape, checkpointing=checkpointing, precision=dt)
    for name in ("parameters", "gradients", "half_parameters", "buffers"):
        _add(regions, device, name, arenas[name])
    if sum(parts[name] for name in _ACTIVATION_PARTS) != arenas["activations"]:
        _add(regions, device, "activation_arena", arenas["activations"])  # parts not whole blocks
    else:
        for name in _ACTIVATION_PARTS:
            _add(regions, device, name, parts[name])
    _add(regions, device, "backend_scratch", arenas["backend_scratch"])
    _add(regions, device, "step_scratch", arenas["step_scratch"])  # the step's records and scaler state (every device)
    _add(regions, "pinned", "checkpoint_offload", parts["checkpoint_offload"])  # checkpointing="offload"
    return arenas["activations"]


def plan_training(model: Module, micro_batch_shape: Sequence[int], *, precision: Any = "fp32",
                  checkpointing: bool | str = False, optimizer: OptimizerSpec | None = None, ema: bool = False,
                  ema_on_host: bool = False, scaler: bool = False, loader: LoaderSpec | None = None,
                  loss_chunk_rows: int | None = None) -> MemoryPlan:
    """The plan of a run of TrainStep over `model` with micro-batches of `micro_batch_shape`.

    precision: "fp32", "bf16" or "fp16" (or an alias such as "f16" or np.float16); checkpointing:
    gradient checkpointing (False, True or "offload", as TrainStep's gradient_checkpointing; the
    offloaded inputs are the pinned pool's "checkpoint_offload"); optimizer: the optimizer's spec
    (None: no optimizer state); ema: an EMA of every parameter (on the device, or in pinned memory with ema_on_host); scaler: a dynamic
    loss scaler (fp16); loader: the training DataLoader's spec (with its device=, its device
    batches too); loss_chunk_rows: the LM head + cross-entropy in blocks of that many rows
    (TrainStep's; None: the model's current setting, 0: whole logits). Shapes the model cannot take raise ValueError; sizes beyond any memory,
    gputrain.OutOfMemoryError.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model must be a gputrain.nn.Module, not {type(model).__name__}")
    precision = parse_precision(precision)
    compiled = model.compiled
    model._sync_frozen()  # parameters with requires_grad False have no gradient to plan
    if loss_chunk_rows is not None and loss_chunk_rows != compiled.loss_chunk_rows:
        previous = compiled.loss_chunk_rows
        compiled.loss_chunk_rows = loss_chunk_rows  # checked in C
        try:
            return plan_training(model, micro_batch_shape, precision=precision, checkpointing=checkpointing,
                                 optimizer=optimizer, ema=ema, ema_on_host=ema_on_host, scaler=scaler, loader=loader)
        finally:
            compiled.loss_chunk_rows = previous
    device, shape, dt = compiled.device, tuple(micro_batch_shape), c_dtype(precision)
    regions: dict[str, dict[str, int]] = {device: {}}
    activation_arena = _model_regions(regions, compiled, shape, dt, checkpointing)
    numels = [compiled.num_parameters]  # every parameter once, as EMA(model) averages them
    if optimizer is not None:
        memory = _C.optimizer_plan(optimizer.kind, optimizer.per_rank_numels(), list(optimizer.hparams), device=device,
                                   cpu_offload_fraction=optimizer.cpu_offload_fraction,
                                   offload_chunk_numel=optimizer.offload_chunk_numel,
                                   zero_shards=optimizer.zero_shards, min_8bit_size=optimizer.min_8bit_size)
        _add(regions, device, "optimizer_state", memory["device_bytes"])
        _add(regions, "pinned", "optimizer_offload", memory["pinned_bytes"])
    if ema:
        shadow = _C.ema_plan(numels, device=device, on_host=ema_on_host)
        _add(regions, shadow["pool"], "ema", shadow["bytes"])
    if loader is not None:
        slots = _C.loader_plan(loader.arrays, loader.max_rows, loader.num_workers,
                               max(loader.prefetch_factor or 0, 1), loader.pin_memory, device=loader.device)
        _add(regions, slots["pool"], "loader_slots", slots["bytes"])
        if slots["device_bytes"]:
            _add(regions, slots["device_pool"], "loader_device_batches", slots["device_bytes"])
        _add(regions, "cpu", "loader_indices", slots["index_bytes"])
    other_mode = not checkpointing
    other = compiled.arena_plan(shape, checkpointing=other_mode, precision=dt)["activations"]
    settings = {"precision": precision, "gradient_checkpointing": checkpointing,
                "cpu_offload_fraction": optimizer.cpu_offload_fraction if optimizer is not None else 0.0,
                "ema": ema, "loss_scaler": scaler}
    if compiled.loss_chunk_rows:
        settings["loss_chunk_rows"] = compiled.loss_chunk_rows
    if optimizer is not None and optimizer.zero_shards > 1:  # optimizer bytes are one rank's
        settings["zero_stage"] = 1
        settings["optimizer_shards"] = optimizer.zero_shards
    return MemoryPlan(regions, device=device, micro_batch_shape=shape,
                      alternatives={f"activation arena with gradient_checkpointing={other_mode}": other},
                      settings=settings, activation_arena=activation_arena)


def available_memory(model: Module) -> dict[str, int | None]:
    """{kind: bytes a run of `model` may still plan for, or None without a limit}, for every pool:
    its limit less what is reserved now, counting the model's own arenas (in a plan already)
    as free."""
    compiled = model.compiled
    live = sum(compiled.live_arenas().values())
    kinds = ["cpu", "pinned", *(f"cuda:{i}" for i in range(_C.cuda_device_count()))]
    if compiled.device not in kinds:  # a simulated device ("sim:N")
        kinds.append(compiled.device)
    available: dict[str, int | None] = {}
    for kind in kinds:
        stats = _C.memory_stats(device=kind)
        mine = live if kind == compiled.device else 0
        limit = stats["limit_bytes"]
        available[kind] = None if limit is None else limit - stats["reserved_bytes"] + mine
    return available


def describe_over(plan: MemoryPlan, available: Mapping[str, int | None]) -> str:
    """'cpu: needs 1,000 bytes, 200 more than the 800 available' for every kind over."""
    return "; ".join(f"{kind}: needs {plan.total(kind):,} bytes, {extra:,} more than the "
                     f"{available[kind]:,} available" for kind, extra in plan.over(available).items())


def micro_batch_sizes(group_rows: int, largest: int) -> list[int]:
    """Micro-batch sizes to try for steps of `group_rows` rows, largest first: the divisors of
    group_rows up to `largest`. With a divisor, every micro-batch of a full step has that size
    and no shorter step has a larger one, so the plan for it is the run's peak."""
    return [rows for rows in range(min(largest, group_rows), 0, -1) if group_rows % rows == 0]


def fit(make_plan: Callable[[int, float], MemoryPlan], available: Mapping[str, int | None], sizes: Sequence[int],
        offload: float, can_offload: bool) -> tuple[int, float, MemoryPlan] | None:
    """The first (micro-batch size, offload) that fits `available`: each of `sizes` in turn (see
    micro_batch_sizes), then again with cpu_offload_fraction raised to 0.25, 0.5, 0.75 and 1 (when
    can_offload). `make_plan(size, offload)` makes a plan. None when nothing fits."""
    fractions = [offload] + ([f for f in (0.25, 0.5, 0.75, 1.0) if f > offload] if can_offload else [])
    for fraction in fractions:
        for rows in sizes:
            plan = make_plan(rows, fraction)
            if not plan.over(available):
                return rows, fraction, plan
    return None


def plan_step(step: TrainStep, batch_shape: Sequence[int] | np.ndarray, *, ema: Any = None,
              loader: LoaderSpec | None = None) -> MemoryPlan:
    """The complete plan of `step` for batches of `batch_shape` (or of a batch array's shape),
    split into its micro_batches micro-batches: its model in its precision and
    checkpointing mode, its optimizer, its loss scaler, and `ema` (a gputrain.optim.EMA of the
    model) and the loader when given. TrainStep.memory_plan is the model's part of it."""
    if not isinstance(step, TrainStep):
        raise TypeError(f"step must be a gputrain.TrainStep, not {type(step).__name__}")
    step.memory_plan(batch_shape)  # the batch's checks: it splits into the micro-batches
    shape = tuple(batch_shape.shape if isinstance(batch_shape, np.ndarray) else batch_shape)
    micro = (shape[0] // step.micro_batches, *shape[1:])
    compiled = step.model.compiled
    precision = parse_precision(compiled.precision)
    optimizer = OptimizerSpec.of(step.optimizer, step.model) if step.optimizer is not None else None
    scaler = step.scaler is not None and step.scaler.is_enabled()
    return plan_training(step.model, micro, precision=precision, checkpointing=compiled.checkpointing,
                         optimizer=optimizer, ema=ema is not None,
                         ema_on_host=ema is not None and ema.location == "host", scaler=scaler, loader=loader)
