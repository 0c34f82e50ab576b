"""ZeRO-1 (AdamW(zero_stage=1)) as one rank of `mpiexec -n N`, against unsharded data parallelism
in the same job, and its checkpoints across world sizes. test_zero.py runs it.

    compare OUT             every configuration: ZeRO-1 == zero_stage=0 bit for bit (weights,
                            step results, gathered optimizer state), and its memory plan
    device OUT              ZeRO-1 of models on sim:0 == their zero_stage=0 == ZeRO-1 on the cpu,
                            one wait per step
    checkpoint OUT          2 ZeRO-1 steps; rank 0 writes OUT.ckpt.pkl (the gathered state)
    resume OUT              loads OUT.ckpt.pkl into ZeRO-1 and unsharded optimizers, checks the
                            gathered state, trains on and compares; rank 0 writes OUT.resumed.npz
    resume OUT --reference  the same checkpoint continued by one process (world micro-batches)
    errors OUT              the refusals of a sharded optimizer
"""

from __future__ import annotations

import argparse
import pickle
import sys

import numpy as np
from _dist_worker import ROWS, model_and_batches

import gputrain as gt
from gputrain import distributed as dist
from gputrain.memory_plan import plan_step
from gputrain.optim.zero import shard_range

nn = gt.nn

# (model, precision, clip, cpu_offload_fraction, scaler's init_scale): an MLP (one chunk of the
# gradient norm's summation, cut by every shard), a wider MLP (several chunks, some whole in a
# shard, some cut), a GPT, a model of 2 parameters (3 ranks: rank 0's shard is empty); fp16's
# scaler with an overflowing first scale skips steps.
CONFIGS = [("mlp", "fp32", None, 0.0, None), ("mlp", "fp16", 0.5, 0.5, 2.0**40), ("wide", "bf16", 0.05, 0.5, None),
           ("wide", "fp16", 0.05, 0.0, 2.0**12), ("gpt", "fp16", 0.5, 0.5, 2.0**12), ("tiny", "fp32", 0.5, 0.5, None)]
CHECKPOINT = ("mlp", "fp16", 0.5, 0.5, 2.0**12)  # trained 2 steps on 2 ranks, continued 2 on 3 and on 1


def build(kind: str, world: int, steps: int):
    if kind not in ("wide", "tiny"):
        return model_and_batches(kind, world, steps)
    gt.random.manual_seed(5)
    rng = np.random.default_rng(11)
    if kind == "tiny":  # one class: the loss and the gradients are 0, weight decay moves the weights
        return nn.Sequential(nn.Linear(1, 1)), [(rng.standard_normal((world * ROWS, 1)).astype(np.float32),
                                                 np.zeros(world * ROWS, np.int64)) for _ in range(steps)]
    # 1.28M parameters: each rank's reduce-scatter runs in 2 pieces
    model = nn.Sequential(nn.Linear(12, 4096), nn.GELU(), nn.Dropout(0.1), nn.Linear(4096, 300))
    batches = [(rng.standard_normal((world * ROWS, 12)).astype(np.float32), rng.integers(0, 300, world * ROWS))
               for _ in range(steps)]
    return model, batches


def train(config, world: int, rank: int | None, steps: int, zero: int, saved=None, device: str = "cpu"):
    """`steps` steps; rank None: one process, world micro-batches per step. saved: (weights,
    optimizer state, scaler state) to start from. Returns weights, results, optimizer, scaler,
    the step and a batch of one rank. On a device every step waits once (the step's read)."""
    kind, precision, clip, offload, init_scale = config
    model, batches = build(kind, world, steps)
    model.to(device)
    optimizer = gt.optim.AdamW(model.parameters(), lr=1e-2, cpu_offload_fraction=offload, zero_stage=zero)
    scaler = gt.amp.GradScaler(init_scale=init_scale, backoff_factor=2.0**-28) if precision == "fp16" else None
    if saved is not None:
        model.load_state_dict(saved[0])
        optimizer.load_state_dict(saved[1])
        if scaler is not None:
            scaler.load_state_dict(saved[2])
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer,
                        micro_batches=world if rank is None else 1, precision=precision,
                        max_grad_norm=clip, scaler=scaler, log_grad_norm=True)
    results = []
    rows = slice(None) if rank is None else slice(rank * ROWS, (rank + 1) * ROWS)
    for x, y in batches:
        gt.memory.device_counters(device, reset=True) if device != "cpu" else None
        out = step(x[rows], y[rows])
        if device != "cpu":
            counts = gt.memory.device_counters(device)
            assert counts["syncs"] == 1, (config, counts)
        results.append((out.loss, out.grad_norm, float(out.skipped), out.scale))
    return model.state_dict(), np.array(results), optimizer, scaler, step, batches[0][0][rows]


def check_plan(step, batch, optimizer, unsharded_plan, rank: int, world: int, kind: str = "cpu") -> None:
    """The memory plan of a sharded step shows one rank's optimizer bytes: the last rank's, whose
    shard is the largest, exactly (`kind`: the model's memory)."""
    plan = plan_step(step, batch)
    assert plan.settings["optimizer_shards"] == world and "optimizer_shards" not in unsharded_plan.settings
    memory = optimizer.memory()
    planned = (plan[kind].get("optimizer_state", 0), plan.get("pinned", {}).get("optimizer_offload", 0))
    assert planned[0] + planned[1] < unsharded_plan.total(kind) + unsharded_plan.total("pinned")
    if rank == world - 1:
        assert planned == (memory["device_bytes"], memory["host_bytes"]), (planned, memory)


def assert_same_state(got: dict, expected: dict, what: str) -> None:
    assert got["param_groups"] == expected["param_groups"], what
    assert got["state"].keys() == expected["state"].keys(), what
    for index, state in expected["state"].items():
        for name, value in state.items():
            assert np.array_equal(got["state"][index][name], value), (what, index, name)


def assert_same_run(got, expected, what: str) -> None:
    for name, value in expected[0].items():
        assert np.array_equal(got[0][name], value), (what, name)
    assert np.array_equal(got[1], expected[1], equal_nan=True), (what, got[1], expected[1])
    assert_same_state(got[2].state_dict(), expected[2].state_dict(), what)


def compare(rank: int, world: int) -> None:
    for config in CONFIGS:
        sharded = train(config, world, rank, 3, 1)
        unsharded = train(config, world, rank, 3, 0)
        assert_same_run(sharded, unsharded, config)
        check_plan(sharded[4], sharded[5], sharded[2], plan_step(unsharded[4], unsharded[5]), rank, world)
        memory, whole = sharded[2].memory(), unsharded[2].memory()
        assert memory["device_numel"] + memory["host_numel"] < whole["device_numel"] + whole["host_numel"], memory
        if config[1] == "fp16" and config[4] == 2.0**40:
            assert sharded[1][:, 2].tolist() == [1.0, 0.0, 0.0]  # the overflowing scale skipped the first step
        print(f"rank {rank} {config} identical; optimizer elements {memory}", flush=True)


def device(rank: int, world: int) -> None:
    """Models on sim:0 (sim's collectives run MPI on its stream worker): ZeRO-1 keeps this rank's
    shard of the state on the device (and of the offloaded share in pinned memory), and gives the
    weights, results and state of zero_stage=0 on sim and of ZeRO-1 on the cpu, bit for bit."""
    for config in [c for c in CONFIGS if c[0] != "wide"]:
        sharded = train(config, world, rank, 3, 1, device="sim")
        unsharded = train(config, world, rank, 3, 0, device="sim")
        assert_same_run(sharded, unsharded, (config, "sim zero_stage=0"))
        check_plan(sharded[4], sharded[5], sharded[2], plan_step(unsharded[4], unsharded[5]), rank, world, "sim:0")
        assert_same_run(sharded, train(config, world, rank, 3, 1), (config, "cpu ZeRO-1"))
        memory = sharded[2].memory()
        first, end = shard_range(sum(p.numel() for p in sharded[2]._params()), world, rank)
        assert memory["device_numel"] + memory["host_numel"] == end - first, memory
        print(f"rank {rank} {config} identical on sim; optimizer elements {memory}", flush=True)


def checkpoint(out: str, rank: int, world: int) -> None:
    weights, _, optimizer, scaler, _, _ = train(CHECKPOINT, world, rank, 2, 1)
    state = optimizer.state_dict()  # every rank gathers (a collective); rank 0 writes
    if rank == 0:
        with open(f"{out}.ckpt.pkl", "wb") as file:
            pickle.dump((weights, state, scaler.state_dict()), file)


def resume(out: str, rank: int | None, world: int) -> None:
    with open(f"{out}.ckpt.pkl", "rb") as file:
        saved = pickle.load(file)
    model, _ = build(CHECKPOINT[0], world, 0)
    optimizer = gt.optim.AdamW(model.parameters(), cpu_offload_fraction=CHECKPOINT[3], zero_stage=1)
    optimizer.load_state_dict(saved[1])
    assert_same_state(optimizer.state_dict(), saved[1], "loaded")  # sharded over `world`, gathered back
    sharded = train(CHECKPOINT, world, rank, 2, 1, saved)
    if rank is not None:
        assert_same_run(sharded, train(CHECKPOINT, world, rank, 2, 0, saved), "resumed")
    if not rank:
        np.savez(f"{out}.{'reference' if rank is None else 'resumed'}.npz", results=sharded[1], **sharded[0])
    print(f"rank {rank} resumed identical", flush=True)


def expect(error_type: type, words: tuple[str, ...], call) -> None:
    try:
        call()
    except error_type as error:
        assert all(word in str(error) for word in words), error
    else:
        raise AssertionError(f"no {error_type.__name__} for {words}")


def errors(rank: int) -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    optimizer = gt.optim.AdamW(model.parameters(), zero_stage=1)
    before = optimizer.state_dict()
    expect(RuntimeError, ("step", "zero_stage=1", "TrainStep"), optimizer.step)
    expect(RuntimeError, ("clip_grad_norm_", "zero_stage=1"), lambda: optimizer.clip_grad_norm_(1.0))
    extra = nn.Linear(2, 2)
    expect(RuntimeError, ("add_param_group", "zero_stage=1"),
           lambda: optimizer.add_param_group({"params": extra.parameters()}))
    assert_same_state(optimizer.state_dict(), before, "after refusals")
    expect(ValueError, ("params", "zero_stage=1", "one compiled model"),
           lambda: gt.optim.AdamW(list(model.parameters()) + list(extra.parameters()), zero_stage=1))
    print(f"rank {rank} errors OK", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["compare", "device", "checkpoint", "resume", "errors"])
    parser.add_argument("out")
    parser.add_argument("--reference", type=int, default=None, metavar="N", help="one process for N ranks")
    args = parser.parse_args()
    if args.reference is not None:
        resume(args.out, None, args.reference)
        return
    dist.init(timeout=60.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    {"compare": lambda: compare(rank, world), "device": lambda: device(rank, world), "resume": lambda: resume(args.out, rank, world),
     "checkpoint": lambda: checkpoint(args.out, rank, world), "errors": lambda: errors(rank)}[args.mode]()
    dist.destroy()


if __name__ == "__main__":
    sys.exit(main())
