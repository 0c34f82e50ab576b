"""The guides' recipes on a device against the same run on the CPU (.ci/gpu_check.sh recipes).

A GPT (6 layers, 384 wide, T 256; 4 micro-batches of 2 sequences a step) trains 20 optimizer
steps per run from the same seed on the same batches (a DataLoader with shuffling, 2 workers,
pinned, handing the step device batches), in two recipes:

- rtx3060: fp16 + GradScaler, accumulation 4, AdamW over no-decay groups with
  cpu_offload_fraction 0.5, clipping, an EMA on the device;
- bf16_tf32: bf16 (no scaler) with TF32 allowed, accumulation 4, the same AdamW without offload.

Per recipe: the device run against the CPU run (bit-identical where the docs claim it: on the
simulated device "sim"; else the measured largest difference), against a second device run
(the same seed gives the same bits) and, with offload, against cpu_offload_fraction 0 (DESIGN.md:
bit-identical to f = 0); gputrain.device_counters per step (after the first: one wait, no
allocation) and against the same steps on sim; the memory plan against the device
allocator's peak and cudaMemGetInfo. Writes JSON after each recipe; exits 1 when a claim does
not hold.

    python .ci/gpu_check/recipes.py --device cuda:0 --size full --out recipes.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any

import numpy as np

import gputrain as gt
from gputrain import memory_plan as mp

SIZES = {
    "full": {"n_layer": 6, "n_head": 6, "n_embd": 384, "seq": 256, "vocab": 65, "micro": 2, "steps": 20},
    "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq": 32, "vocab": 65, "micro": 4, "steps": 4},
}
RECIPES = {
    "rtx3060": {"precision": "fp16", "scaler": True, "offload": 0.5, "tf32": False},
    "bf16_tf32": {"precision": "bf16", "scaler": False, "offload": 0.0, "tf32": True},
}
ACCUMULATION = 4
SIM_COUNTER_STEPS = 3  # steps of the same recipe on sim whose counters a CUDA run's must equal
PLANNED_STEPS = 3  # steps measured against the memory plan: from the 2nd, the loader holds its 3 device batches


def dataset(size: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Token sequences with some structure (a noisy walk), exactly one epoch of `steps` steps."""
    rows = size["steps"] * ACCUMULATION * size["micro"]
    rng = np.random.default_rng(7)
    walk = np.cumsum(rng.integers(-2, 3, (rows, size["seq"] + 1)), axis=1) + rng.integers(0, size["vocab"], (rows, 1))
    tokens = np.mod(walk, size["vocab"]).astype(np.int64)
    return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])


class Run:
    """One recipe's objects on `device` ("cpu", "sim", "cuda:0"), built from seed 0."""

    def __init__(self, device: str, size: dict[str, int], recipe: dict[str, Any], offload: float | None = None):
        self.device = device
        gt.random.manual_seed(0)
        gt.backends.set_tf32(recipe["tf32"])
        self.model = gt.models.GPT(vocab_size=size["vocab"], block_size=size["seq"], n_layer=size["n_layer"],
                                   n_head=size["n_head"], n_embd=size["n_embd"]).to(device)
        groups = gt.optim.param_groups_weight_decay(self.model, weight_decay=0.1)
        fraction = recipe["offload"] if offload is None else offload
        self.optimizer = gt.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), cpu_offload_fraction=fraction)
        self.scaler = gt.amp.GradScaler(init_scale=2.0**12, growth_interval=5) if recipe["scaler"] else None
        self.ema = gt.optim.EMA(self.model, decay=0.95, location="device", use_warmup=True)
        self.step = gt.TrainStep(self.model, gt.nn.CrossEntropyLoss(), self.optimizer, precision=recipe["precision"],
                                 micro_batches=ACCUMULATION, max_grad_norm=1.0, scaler=self.scaler)
        on_device = device != "cpu"
        self.loader = gt.DataLoader(dataset(size), batch_size=size["micro"] * ACCUMULATION, shuffle=True,
                                    pin_memory=on_device, num_workers=2, seed=3, device=device if on_device else None)
        self.batches = iter(self.loader)  # one epoch of `steps` steps, over however many train() calls

    def train(self, steps: int) -> dict[str, Any]:
        """`steps` optimizer steps: losses, skipped steps, seconds and (on a device) counters per step."""
        counting = self.device != "cpu"
        losses, skipped, seconds, counters = [], [], [], []
        for _, (x, y) in zip(range(steps), self.batches):
            if counting:
                gt.device_counters(self.device, reset=True)
            start = time.perf_counter()
            out = self.step(x, y)
            if not out.skipped:
                self.ema.update()
            seconds.append(time.perf_counter() - start)
            if counting:
                counters.append(gt.device_counters(self.device, reset=True))
            losses.append(float(out.loss))
            skipped.append(bool(out.skipped))
        return {"losses": losses, "skipped": skipped, "seconds": seconds, "counters": counters}

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights and the EMA's shadow, as host arrays."""
        state = {f"model.{k}": np.asarray(v) for k, v in self.model.state_dict().items()}
        shadow = self.ema.state_dict()["shadow"]
        items = shadow.items() if isinstance(shadow, dict) else enumerate(shadow)
        state.update({f"ema.{k}": np.asarray(v) for k, v in items})
        return state


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray], losses_a: list[float], losses_b: list[float]) -> dict[str, Any]:
    """Whether two runs' arrays and losses are bit-identical, and their largest differences."""
    diffs = {k: float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)), initial=0.0)) for k in a}
    worst = max(diffs, key=diffs.get)
    scale = float(np.max(np.abs(b[worst]), initial=0.0))
    return {
        "bit_identical": all(a[k].tobytes() == b[k].tobytes() for k in a) and losses_a == losses_b,
        "max_abs_diff": diffs[worst],
        "max_abs_diff_relative_to_its_largest_value": diffs[worst] / scale if scale else None,
        "worst_array": worst,
        "arrays_differing": sum(a[k].tobytes() != b[k].tobytes() for k in a),
        "arrays": len(a),
        "max_loss_diff": max((abs(x - y) for x, y in zip(losses_a, losses_b)), default=0.0),
    }


def mem_get_info(device: str) -> dict[str, int] | str:
    """cudaMemGetInfo of the runtime gputrain loaded (same soname, so the same library), for the
    calling thread's current device (cuda:0 here)."""
    if not device.startswith("cuda"):
        return f"not applicable on {device}"
    try:
        cudart = ctypes.CDLL(f"libcudart.so.{gt.cuda.runtime_version() // 1000}")
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        rc = cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    except OSError as error:
        return f"libcudart not loadable: {error}"
    return {"free": free.value, "total": total.value, "used": total.value - free.value} if rc == 0 else f"error {rc}"


def memory_kinds(device: str) -> list[str]:
    """The pools a device run uses: the device's ("cuda:0"), pinned host memory, and the CPU's
    (which also holds the model while it is built, before it moves to the device)."""
    return [device if ":" in device else f"{device}:0", "pinned", "cpu"]


def planned_against_peaks(device: str, size: dict[str, int], recipe: dict[str, Any]) -> tuple[Run, dict[str, Any]]:
    """A fresh device run whose first PLANNED_STEPS steps are measured: each pool's peak growth
    over what it held before against the plan, and cudaMemGetInfo's used bytes before and after.
    (From the second batch on, the device loader holds the 3 batches the plan counts.)"""
    before_info = mem_get_info(device)
    base = {}
    for kind in memory_kinds(device):
        gt.reset_peak_memory_stats(kind)
        base[kind] = gt.memory_stats(kind)["reserved_bytes"]
    run = Run(device, size, recipe)
    plan = mp.plan_step(run.step, (size["micro"] * ACCUMULATION, size["seq"]), ema=run.ema,
                        loader=mp.LoaderSpec.of(run.loader))
    first = run.train(PLANNED_STEPS)
    kinds = {}
    for kind in memory_kinds(device):
        growth = gt.memory_stats(kind)["peak_reserved_bytes"] - base[kind]
        kinds[kind] = {"planned": plan.total(kind), "peak_growth": growth, "peak_minus_plan": growth - plan.total(kind)}
    after_info = mem_get_info(device)
    driver = None
    if isinstance(before_info, dict) and isinstance(after_info, dict):
        driver = after_info["used"] - before_info["used"]
    return run, {"pools": kinds, "plan": str(plan), "cudaMemGetInfo_before": before_info,
                 "cudaMemGetInfo_after": after_info, "cudaMemGetInfo_used_growth": driver, "first_steps": first}


def counter_claims(counters: list[dict[str, int]]) -> dict[str, Any]:
    """After the first step: one wait and no allocation or free per step, and the same counts each step."""
    later = counters[1:]
    return {
        "one_wait_no_alloc": all(c["syncs"] == 1 and c["allocs"] == 0 and c["frees"] == 0 for c in later),
        "same_each_step": all(c == later[0] for c in later),
        "step2": later[0] if later else None,
    }


def sim_counters(size: dict[str, int], recipe: dict[str, Any]) -> list[dict[str, int]]:
    """The counters of the first SIM_COUNTER_STEPS steps of the same recipe on sim."""
    return Run("sim", size, recipe).train(SIM_COUNTER_STEPS)["counters"]


def run_recipe(name: str, device: str, size: dict[str, int], recipe: dict[str, Any], claims: list[dict[str, Any]]) -> dict[str, Any]:
    """Every run of one recipe, its comparisons, and its claims appended to `claims`."""
    def claim(what: str, holds: bool, detail: Any = None) -> None:
        claims.append({"recipe": name, "claim": what, "holds": bool(holds), "detail": detail})

    steps = size["steps"]
    start = time.perf_counter()
    device_run, memory = planned_against_peaks(device, size, recipe)
    if device.startswith("sim"):  # docs/guides/small-card.md: on sim the allocator's peak equals the plan
        # (the device's pool and pinned memory; the CPU's also held the model built before .to())
        exact = all(pool["peak_minus_plan"] == 0 for kind, pool in memory["pools"].items() if kind != "cpu")
        claim("sim: the device's and the pinned pool's peaks equal the memory plan", exact, memory["pools"])
    trained = device_run.train(steps - PLANNED_STEPS)
    trained = {k: memory["first_steps"][k] + trained[k] for k in trained}
    device_seconds = time.perf_counter() - start
    result: dict[str, Any] = {"recipe": recipe, "device": device, "losses": trained["losses"],
                              "skipped": trained["skipped"], "scale": device_run.scaler and device_run.scaler.get_scale(),
                              "step_ms_median": 1e3 * float(np.median(trained["seconds"][1:] or trained["seconds"])),
                              "device_run_seconds": device_seconds, "memory": memory,
                              "counters": counter_claims(trained["counters"])}
    claim("after the first step: one wait and no allocation per step", result["counters"]["one_wait_no_alloc"],
          result["counters"]["step2"])

    start = time.perf_counter()
    cpu_run = Run("cpu", size, recipe)
    cpu = cpu_run.train(steps)
    result["cpu_run_seconds"] = time.perf_counter() - start
    result["cpu_losses"] = cpu["losses"]
    result["device_vs_cpu"] = compare(device_run.arrays(), cpu_run.arrays(), trained["losses"], cpu["losses"])
    if device.startswith("sim"):  # docs/tour.md: on sim every knob gives the CPU's bits
        claim("sim gives the CPU run's bits", result["device_vs_cpu"]["bit_identical"], result["device_vs_cpu"])

    again = Run(device, size, recipe)
    repeat = again.train(steps)
    result["device_vs_device_again"] = compare(again.arrays(), device_run.arrays(), repeat["losses"], trained["losses"])
    claim("the same seed gives the same bits on the device", result["device_vs_device_again"]["bit_identical"],
          result["device_vs_device_again"])

    if recipe["offload"]:
        resident = Run(device, size, recipe, offload=0.0)
        kept = resident.train(steps)
        result["offload_vs_none"] = compare(device_run.arrays(), resident.arrays(), trained["losses"], kept["losses"])
        claim(f"cpu_offload_fraction {recipe['offload']} gives the bits of 0", result["offload_vs_none"]["bit_identical"],
              result["offload_vs_none"])

    # the counters of the same steps on sim (on sim itself, in the dry run, the same device twice)
    sim = sim_counters(size, recipe)
    same = sim[1:] == trained["counters"][1:SIM_COUNTER_STEPS]
    result["sim_counters"] = sim
    claim("the device's counters per step equal sim's", same, {"sim": sim[1:], "device": trained["counters"][1:SIM_COUNTER_STEPS]})
    gt.backends.set_tf32(False)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    size, claims = SIZES[args.size], []
    report: dict[str, Any] = {"device": args.device, "size": size, "accumulation": ACCUMULATION,
                              "threads": gt.get_num_threads(), "recipes": {}, "claims": claims}
    if args.device.startswith("cuda"):
        report["gpu"] = gt.cuda.get_device_name(args.device)
    for name, recipe in RECIPES.items():
        try:
            report["recipes"][name] = run_recipe(name, args.device, size, recipe, claims)
        except Exception as error:  # noqa: BLE001 -- the other recipe still runs; the error is the finding
            report["recipes"][name] = {"error": f"{type(error).__name__}: {error}"}
            claims.append({"recipe": name, "claim": "the recipe runs", "holds": False, "detail": str(error)})
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print_recipe(name, report["recipes"][name])
    failed = [c for c in claims if not c["holds"]]
    for c in claims:
        print(f"{'ok  ' if c['holds'] else 'FAIL'} {c['recipe']}: {c['claim']}")
    return 1 if failed else 0


def print_recipe(name: str, result: dict[str, Any]) -> None:
    if "error" in result:
        print(f"{name}: ERROR {result['error']}")
        return
    versus = result["device_vs_cpu"]
    print(f"{name}: loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f} ({result['device']}), "
          f"{result['cpu_losses'][-1]:.4f} (cpu); step {result['step_ms_median']:.2f} ms; device vs cpu: "
          f"bits {versus['bit_identical']}, max |diff| {versus['max_abs_diff']:.3g} ({versus['worst_array']}); "
          f"per step {result['counters']['step2']}")
    for kind, pool in result["memory"]["pools"].items():
        print(f"  {kind}: planned {pool['planned']:,} B, peak growth {pool['peak_growth']:,} B")


if __name__ == "__main__":
    sys.exit(main())
