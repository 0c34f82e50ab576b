"""Runs onednn_versions.c's binary against two libdnnl.so.3 copies in interleaved rounds and
prints median GFLOP/s and the ratio new/old (benchmarks/README.md, "CPU GEMM library: oneDNN
2026.1 against 2023.2"). Each process measures one library, one ISA cap and one thread count;
thread counts are set by the CPU affinity (taskset, which both GNU OpenMP and TBB honour) and
OMP_NUM_THREADS. Build and run commands are in the README."""
from __future__ import annotations

import argparse
import collections
import math
import os
import statistics
import subprocess
import time


def run(binary: str, libdir: str, extra_env: dict[str, str], isa: str | None, threads: int,
        dtypes: str, passes: str) -> tuple[str, dict[tuple[str, str, str], float]]:
    env = dict(os.environ, LD_LIBRARY_PATH=libdir, OMP_NUM_THREADS=str(threads), **extra_env)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    cpus = ",".join(str(c) for c in range(threads))
    out = subprocess.run(["taskset", "-c", cpus, binary, dtypes, passes], env=env, text=True,
                         capture_output=True, check=True).stdout
    header, results = [], {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "RESULT":
            results[(parts[1], parts[2], parts[3])] = float(parts[4])
        elif parts and parts[0] in ("LOADED", "VERSION"):
            header.append(line)
    return " | ".join(header), results



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--binary", required=True)
    p.add_argument("--old", required=True, help="directory holding the old libdnnl.so.3")
    p.add_argument("--new", required=True, help="directory holding the new libdnnl.so.3")
    p.add_argument("--new-env", default="", help="NAME=VALUE,... set for the new library only")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--passes", default="fwd,bwd")
    p.add_argument("--stop-at", type=float, default=0.0,
                   help="Unix time after which no further round starts")
    a = p.parse_args()
    new_env = dict(kv.split("=", 1) for kv in a.new_env.split(",") if kv)
    libs = {"2023.2": (a.old, {}), "2026.1": (a.new, new_env)}
    configs = [(isa, t) for t in map(int, a.threads.split(",")) for isa in (None, "AVX2")]
    samples: dict = collections.defaultdict(list)
    headers = set()
    for r in range(a.rounds):
        if r and a.stop_at and time.time() > a.stop_at:
            print(f"# stopped after {r} rounds (--stop-at)")
            break
        order = list(libs) if r % 2 == 0 else list(reversed(libs))
        for isa, t in configs:
            # under the AVX2 cap gputrain widens bf16 like f16, so f16 stands for both there
            dtypes = "f32,bf16,f16" if isa is None else "f32,f16"
            for lib in order:
                header, res = run(a.binary, libs[lib][0], libs[lib][1], isa, t, dtypes, a.passes)
                headers.add(f"{lib} isa={isa or 'native'}: {header}")
                for key, g in res.items():
                    samples[(isa or "native", t, key, lib)].append(g)
        print(f"# round {r + 1} done {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
    for h in sorted(headers):
        print("#", h)
    keys = sorted({(isa, t, key) for isa, t, key, _ in samples},
                  key=lambda k: (k[1], k[0] != "native", k[2][2], k[2][1]))
    print("| threads | ISA | dtype | GEMM | pass | 2023.2 GFLOP/s | 2026.1 GFLOP/s | 2026/2023 |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = collections.defaultdict(list)
    for isa, t, key in keys:
        old = statistics.median(samples[(isa, t, key, "2023.2")])
        new = statistics.median(samples[(isa, t, key, "2026.1")])
        name, ps, dt = key
        print(f"| {t} | {isa} | {dt} | {name} | {ps} | {old:.1f} | {new:.1f} | {new / old:.2f} |")
        ratios[(t, isa, dt)].append(new / old)
    print("\n| threads | ISA | dtype | GEMMs | geometric mean 2026/2023 | min | max |")
    print("|---|---|---|---|---|---|---|")
    for (t, isa, dt), rs in ratios.items():
        gm = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"| {t} | {isa} | {dt} | {len(rs)} | {gm:.2f} | {min(rs):.2f} | {max(rs):.2f} |")
    n = {k: len(v) for k, v in samples.items()}
    print(f"\n# samples per median: {min(n.values())} to {max(n.values())}")


if __name__ == "__main__":
    main()
