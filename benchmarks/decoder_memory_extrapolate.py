"""The full models' memory plans from cut ones (the full 1B models do not fit this machine's memory
beside the other work on it: a build holds ~20-24 bytes of host memory per parameter).

Reads the JSON lines decoder_memory_plan.py --json-only prints for a family built with 1, 2 and 3
layers (Gemma-3: all sliding, then [sliding, full] and [sliding, full, full]). Each region of
each setting must be exactly affine in the layer count -- v(3) - v(2) == v(2) - v(1), and for
Gemma-3 the [sliding, full, full] build must equal the prediction from the others -- or this
stops; then the full model's region is v(1) + (sliding - 1) * per-sliding-layer + full *
per-full-layer, to the byte.

    bash -c 'for L in 1 2 3; do python benchmarks/decoder_memory_plan.py qwen3 --layers $L --json-only; done' \
        | python benchmarks/decoder_memory_extrapolate.py
"""

from __future__ import annotations

import json
import sys

FULL = {"llama": (16, 0), "qwen3": (28, 0), "gemma3": (22, 4)}  # (sliding or uniform layers, full layers)
CARD, CARD_GIB = 12 * 10**9, 12 * 2**30


def key(row: dict) -> tuple:
    return row["cpu_offload_fraction"], row["gradient_checkpointing"]


def regions(row: dict) -> dict[str, int]:
    return {**{k: v for k, v in row["device_regions"].items() if k != "total"}, "pinned": row["pinned_total"]}


def main() -> None:
    builds: dict[tuple, dict] = {}  # (family, layer types) -> {setting: row}
    for line in sys.stdin:
        if line.startswith("[{"):
            rows = json.loads(line)
            types = tuple(rows[0].get("layer_types") or ("uniform",) * rows[0]["layers"])
            builds[(rows[0]["family"], types)] = {key(r): r for r in rows}
    for family in sorted({f for f, _ in builds}):
        base = "sliding_attention" if family == "gemma3" else "uniform"
        needed = [(family, (base,) * n) for n in (1, 2, 3)]
        if family in {"gemma3"}:
            needed += [(family, (base, "full_attention")), (family, (base, "full_attention", "full_attention"))]
        missing = [types for types in needed if types not in builds]
        if missing:
            print(f"{family}: no build of {', '.join(str(m[1]) for m in missing)}", file=sys.stderr)
            continue
        one, two, three = (builds[(family, (base,) * n)] for n in (1, 2, 3))
        mixed = builds.get((family, (base, "full_attention")))
        check = builds.get((family, (base, "full_attention", "full_attention")))
        n_uniform, n_full = FULL[family]
        for setting in sorted(one):
            names = sorted(set(regions(one[setting])) | set(regions(three[setting])))
            total, pinned, per_region = 0, 0, {}
            for name in names:
                v1, v2, v3 = (regions(b[setting]).get(name, 0) for b in (one, two, three))
                step = v2 - v1
                if v3 - v2 != step:
                    raise SystemExit(f"{family} {setting} {name}: not affine in the layer count ({v1}, {v2}, {v3})")
                full_step = 0
                if n_full:
                    full_step = regions(mixed[setting]).get(name, 0) - v1
                    predicted = v1 + 2 * full_step
                    if regions(check[setting]).get(name, 0) != predicted:
                        raise SystemExit(f"{family} {setting} {name}: [sliding, full, full] is "
                                         f"{regions(check[setting]).get(name, 0)}, predicted {predicted}")
                value = v1 + (n_uniform - 1) * step + n_full * full_step
                per_region[name] = value
                if name == "pinned":
                    pinned = value
                else:
                    total += value
            print(json.dumps({"family": family, "layers": n_uniform + n_full, "cpu_offload_fraction": setting[0],
                              "gradient_checkpointing": setting[1], "device_total": total, "pinned_total": pinned,
                              "fits_12e9": total <= CARD, "fits_12GiB": total <= CARD_GIB, "regions": per_region}))


if __name__ == "__main__":
    main()
