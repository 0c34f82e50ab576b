"""gputrain against transformers + torch on the same GPU (.ci/gpu_check.sh bench).

- GPT-2 124M (12 layers, 768 wide, vocabulary 50257, T 1024, batch 8), one AdamW step per round,
  in fp32 with TF32, bf16, and fp16 with a loss scaler: gputrain.models.GPT and TrainStep against
  transformers' GPT2LMHeadModel (attn_implementation="sdpa", dropout 0), torch.optim.AdamW(fused=True)
  and torch.autocast (+ torch.amp.GradScaler for fp16); tokens/s.
- The SimpleCNN of benchmarks/bench_cnn.py (CIFAR sizes, batch 256) with
  gputrain.backends.cudnn.benchmark against the same model in torch with
  torch.backends.cudnn.benchmark; images/s, fp32 and bf16.

Rounds alternate (gputrain, torch, gputrain, torch, ...) after warm-up steps; medians. Each step's
GEMM FLOP/s (benchmarks/bench_gpt.py's and bench_cnn.py's step_flops) is reported as a fraction of
the GPU's bf16 GEMM peak, a torch matmul timed in the same run. Without torch (or transformers),
that side is skipped, saying so. --size tiny (the dry run): small models, a few rounds; on "sim"
torch runs on the CPU and the peak is gputrain's sgemm on the CPU.

    python .ci/gpu_check/bench.py --device cuda:0 --size full --out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
SIZES = {
    "full": {"gpt": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab": 50257, "seq": 1024, "batch": 8},
             "cnn": {"image": 32, "channels": "32,64,128", "batch": 256},
             "rounds": 10, "warmup": 2, "seconds_per_case": 8.0, "peak_n": 8192},
    "tiny": {"gpt": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab": 97, "seq": 32, "batch": 2},
             "cnn": {"image": 8, "channels": "8,16", "batch": 8},
             "rounds": 2, "warmup": 1, "seconds_per_case": 5.0, "peak_n": 256},
}
GPT_PRECISIONS = ("fp32_tf32", "bf16", "fp16_scaler")
CNN_PRECISIONS = ("fp32", "bf16")


def configure_benchmark_modules(size: dict[str, Any]) -> None:
    """benchmarks/bench_gpt.py and bench_cnn.py read their sizes from the environment at import."""
    gpt, cnn = size["gpt"], size["cnn"]
    os.environ.update({"GPT_BENCH_LAYERS": str(gpt["n_layer"]), "GPT_BENCH_HEADS": str(gpt["n_head"]),
                       "GPT_BENCH_EMBD": str(gpt["n_embd"]), "GPT_BENCH_T": str(gpt["seq"]),
                       "GPT_BENCH_BATCH": str(gpt["batch"]), "GPT_BENCH_VOCAB": str(gpt["vocab"]),
                       "CNN_BENCH_IMAGE": str(cnn["image"]), "CNN_BENCH_CHANNELS": cnn["channels"],
                       "CNN_BENCH_BATCH": str(cnn["batch"])})
    sys.path.insert(0, os.path.abspath(BENCHMARKS))


def import_torch() -> tuple[Any, Any, str | None]:
    """(torch, transformers, why either is missing)."""
    try:
        import torch
    except ImportError as error:
        return None, None, f"torch not importable ({error}): the torch side is skipped"
    try:
        import transformers
    except ImportError as error:
        return torch, None, f"transformers not importable ({error}): the torch GPT side is skipped"
    return torch, transformers, None


def interleaved(ours: Callable[[], None], theirs: Callable[[], None] | None, size: dict[str, Any]) -> dict[str, list[float]]:
    """Seconds per round of `ours` and `theirs`, alternating, after warm-up steps of each; at
    most SIZES' rounds and stopping (after 3 rounds) once the case has taken seconds_per_case."""
    for _ in range(size["warmup"]):
        ours()
        if theirs:
            theirs()
    times: dict[str, list[float]] = {"gputrain": [], "torch": []}
    start = time.perf_counter()
    for r in range(size["rounds"]):
        for name, fn in (("gputrain", ours), ("torch", theirs)):
            if fn is not None:
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        if r >= 2 and time.perf_counter() - start > size["seconds_per_case"]:
            break
    return times


def rates(times: dict[str, list[float]], units: float, flops: float, peak: float | None, unit: str) -> dict[str, Any]:
    """Medians as units/s, ms and fractions of the bf16 GEMM peak, and the speed-up over torch."""
    out: dict[str, Any] = {}
    for name, seconds in times.items():
        if not seconds:
            continue
        median = float(np.median(seconds))
        out[name] = {f"{unit}_per_s": units / median, "step_ms": 1e3 * median, "rounds": len(seconds),
                     "fraction_of_bf16_peak": flops / median / peak if peak else None}
    if "gputrain" in out and "torch" in out:
        out["speedup_vs_torch"] = out["torch"]["step_ms"] / out["gputrain"]["step_ms"]
    return out


def bf16_peak(torch: Any, device: str, n: int) -> dict[str, Any]:
    """FLOP/s of an n^3 bf16 torch matmul on the GPU (median of 10 after a warm-up)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    seconds = []
    for _ in range(10):
        t = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
    return {"flops": 2 * n**3 / float(np.median(seconds)), "how": f"torch bf16 matmul {n}^3 on {device}"}


def gputrain_gpt_step(gt: Any, device: str, g: dict[str, int], precision: str) -> Callable[[], None]:
    """One gputrain AdamW step of GPT-2 (bench_gpt's model at these sizes) on host batches."""
    import bench_gpt

    gt.backends.set_tf32(precision == "fp32_tf32")
    model = bench_gpt.gputrain_model().to(device)
    mode = {"fp32_tf32": "fp32", "bf16": "bf16", "fp16_scaler": "fp16"}[precision]
    optimizer = gt.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=mode,
                        scaler=gt.amp.GradScaler() if mode == "fp16" else None)
    x, y = bench_gpt.batch_data()
    return lambda: step(x, y)


def torch_gpt_step(torch: Any, transformers: Any, device: str, g: dict[str, int], precision: str) -> Callable[[], None]:
    """transformers' GPT2LMHeadModel (from its config, sdpa attention, no dropout), fused AdamW,
    autocast (+ GradScaler for fp16); each step synchronized."""
    import bench_gpt

    config = transformers.GPT2Config(vocab_size=g["vocab"], n_positions=g["seq"], n_embd=g["n_embd"],
                                     n_layer=g["n_layer"], n_head=g["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, use_cache=False)
    with torch.device(device):  # initialised where it trains
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    print(f"torch side: {type(model).__name__}, attention {model.config._attn_implementation}", flush=True)
    on_gpu = device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = precision == "fp32_tf32"
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=on_gpu)
    dtype = {"bf16": torch.bfloat16, "fp16_scaler": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.split(":")[0], enabled=precision == "fp16_scaler")
    x, y = (torch.from_numpy(a).to(device) for a in bench_gpt.batch_data())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if on_gpu:
            torch.cuda.synchronize()

    return step


def gputrain_cnn_step(gt: Any, device: str, precision: str) -> Callable[[], None]:
    import bench_cnn

    gt.backends.cudnn.benchmark = True
    model = bench_cnn.gputrain_model().to(device)
    optimizer = gt.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)
    x, y = bench_cnn.batch_data()
    return lambda: step(x, y)


def torch_cnn_step(torch: Any, device: str, precision: str) -> Callable[[], None]:
    import bench_cnn

    torch.backends.cudnn.benchmark = True
    model = bench_cnn.torch_cnn(torch).to(device)
    on_gpu = device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=on_gpu)
    x, y = (torch.from_numpy(a).to(device) for a in bench_cnn.batch_data())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x)
        torch.nn.functional.cross_entropy(logits.float(), y).backward()
        optimizer.step()
        if on_gpu:
            torch.cuda.synchronize()

    return step


def case(name: str, ours: Callable[[], Callable[[], None]], theirs: Callable[[], Callable[[], None]] | None,
         why_not_torch: str | None, size: dict[str, Any], units: float, flops: float, peak: float | None,
         unit: str) -> dict[str, Any]:
    """One benchmark case; a side that fails to build or run is reported, not raised."""
    result: dict[str, Any] = {}
    try:
        mine = ours()
    except Exception as error:  # noqa: BLE001 -- reported; the other cases still run
        return {"error": f"gputrain: {type(error).__name__}: {error}"}
    other = None
    if theirs is None:
        result["torch"] = why_not_torch
    else:
        try:
            other = theirs()
            other()
        except Exception as error:  # noqa: BLE001
            result["torch_error"] = f"{type(error).__name__}: {error}"
            other = None
    try:
        result.update(rates(interleaved(mine, other, size), units, flops, peak, unit))
    except Exception as error:  # noqa: BLE001
        result["error"] = f"{type(error).__name__}: {error}"
    print(f"{name}: {json.dumps(result, default=str)}", flush=True)
    return result


def release_torch_cache(torch: Any, device: str) -> None:
    """Gives torch's cached GPU memory back between cases (gputrain's allocator asks the driver)."""
    if torch is not None and device.startswith("cuda"):
        torch.cuda.empty_cache()


def run(device: str, size: dict[str, Any], save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every case on `device`; `save(report)` after each (a phase cut short keeps what it measured)."""
    import gputrain as gt

    configure_benchmark_modules(size)
    import bench_cnn
    import bench_gpt

    torch, transformers, why = import_torch()
    torch_device = device if device.startswith("cuda") else "cpu"
    report: dict[str, Any] = {"device": device, "torch_device": torch_device, "sizes": size, "torch": why or torch.__version__,
                              "transformers": transformers.__version__ if transformers else why, "gpt": {}, "cnn": {}}
    if torch is not None and torch_device.startswith("cuda"):
        report["bf16_peak"] = bf16_peak(torch, torch_device, size["peak_n"])
    else:
        sys.path.insert(0, os.path.abspath(BENCHMARKS))
        import _timing

        report["bf16_peak"] = {"flops": _timing.sgemm_peak(repeats=1), "how": "gputrain sgemm 2048^3 on the CPU (no GPU)"}
    peak = report["bf16_peak"]["flops"]
    g = size["gpt"]
    for precision in GPT_PRECISIONS:
        theirs = (lambda p=precision: torch_gpt_step(torch, transformers, torch_device, g, p)) if transformers else None
        report["gpt"][precision] = case(f"gpt2 {precision}", lambda p=precision: gputrain_gpt_step(gt, device, g, p),
                                        theirs, why, size, g["batch"] * g["seq"], bench_gpt.step_flops(), peak, "tokens")
        save(report)
        release_torch_cache(torch, torch_device)
    gt.backends.set_tf32(False)
    for precision in CNN_PRECISIONS:
        theirs = (lambda p=precision: torch_cnn_step(torch, torch_device, p)) if torch else None
        report["cnn"][precision] = case(f"cnn {precision}", lambda p=precision: gputrain_cnn_step(gt, device, p),
                                        theirs, why, size, size["cnn"]["batch"], bench_cnn.step_flops(), peak, "images")
        save(report)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    def save(report: dict[str, Any]) -> None:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)

    report = run(args.device, SIZES[args.size], save)
    failed = [f"{model} {p}" for model in ("gpt", "cnn") for p, r in report[model].items() if "error" in r]
    if failed:
        print("failed cases:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
