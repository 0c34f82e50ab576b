"""summary.md of a .ci/gpu_check.sh run, from what its phases left in OUT: each phase's exit
status, the build's facts, the tests' counts, the recipes' claims and comparisons, the benchmarks'
rates. Rewritten after every phase, so a run cut short still says how far it got.

    python .ci/gpu_check/summary.py OUT PHASES_FILE DRY_RUN(0|1) > OUT/summary.md
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def read(out: str, name: str) -> str | None:
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        return f.read()


def phases(path: str) -> list[str]:
    with open(path) as f:
        text = f.read()
    rows = [line.split() for line in text.splitlines() if line.strip()]
    return [f"- {name}: {'ok' if rc == '0' else f'FAILED (exit {rc})'} (at {seconds} s)" for name, rc, seconds in rows]


def build_facts(out: str) -> list[str]:
    log = read(out, "build.log")
    if log is None:
        return []
    keep = [line for line in log.splitlines() if line.startswith(("gputrain", "build:", "building", "torch", "dry run"))
            or ":" in line and line.split(":")[0].strip() in ("cuda_compiled", "cuda_available", "device", "blas", "simd")]
    return ["## Build", "```", *keep[-25:], "```"]


def tests(out: str) -> list[str]:
    text = read(out, "tests.txt")
    return [] if text is None else ["## cuda tests", "```", *text.strip().splitlines()[:60], "```"]


def recipes(out: str) -> list[str]:
    text = read(out, "recipes.json")
    if text is None:
        return []
    report = json.loads(text)
    lines = [f"## Recipes on {report['device']} ({report.get('gpu', 'no GPU')}) against the CPU"]
    for name, r in report["recipes"].items():
        if "error" in r:
            lines.append(f"- {name}: ERROR {r['error']}")
            continue
        v = r["device_vs_cpu"]
        pools = ", ".join(f"{k} planned {p['planned']:,} / peak {p['peak_growth']:,} B" for k, p in r["memory"]["pools"].items())
        lines.append(f"- {name}: loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} (cpu {r['cpu_losses'][-1]:.4f}), "
                     f"{r['step_ms_median']:.2f} ms/step; vs cpu: bit-identical {v['bit_identical']}, max |diff| "
                     f"{v['max_abs_diff']:.3g} in {v['worst_array']}; per step {r['counters']['step2']}; {pools}; "
                     f"cudaMemGetInfo used growth {r['memory']['cudaMemGetInfo_used_growth']}")
    lines += [f"- {'ok' if c['holds'] else '**FAILS**'}: {c['recipe']}: {c['claim']}" for c in report["claims"]]
    return lines


def bench(out: str) -> list[str]:
    text = read(out, "bench.json")
    if text is None:
        return []
    report = json.loads(text)
    peak = report["bf16_peak"]
    lines = [f"## Benchmarks on {report['device']} (torch {report['torch']}; peak {peak['flops'] / 1e9:,.0f} GFLOP/s, {peak['how']})",
             "| case | gputrain | torch | speed-up | gputrain of peak | torch of peak |", "|---|---:|---:|---:|---:|---:|"]
    for model, unit in (("gpt", "tokens_per_s"), ("cnn", "images_per_s")):
        for precision, r in report[model].items():
            lines.append(f"| {model} {precision} | {_rate(r, 'gputrain', unit)} | {_rate(r, 'torch', unit)} | "
                         f"{_num(r.get('speedup_vs_torch'))} | {_num(_get(r, 'gputrain', 'fraction_of_bf16_peak'))} | "
                         f"{_num(_get(r, 'torch', 'fraction_of_bf16_peak'))} |")
            for key in ("error", "torch_error"):
                if key in r:
                    lines.append(f"|  {key}: {str(r[key])[:200]} | | | | | |")
    return lines


def _get(r: dict[str, Any], side: str, key: str) -> Any:
    value = r.get(side)
    return value.get(key) if isinstance(value, dict) else None


def _rate(r: dict[str, Any], side: str, unit: str) -> str:
    value = _get(r, side, unit)
    return f"{value:,.0f}" if value is not None else "-"


def _num(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-"


def main(out: str, phases_file: str, dry: str) -> None:
    title = "gputrain's first GPU run" + (" (DRY RUN: no GPU, sim, tiny sizes)" if dry == "1" else "")
    sections = [[f"# {title}", *phases(phases_file)], build_facts(out), tests(out), recipes(out), bench(out)]
    print("\n\n".join("\n".join(s) for s in sections if s))


if __name__ == "__main__":
    main(*sys.argv[1:4])
