"""MkDocs hooks (mkdocs.yml: hooks): tables generated from the code at build time.

A page holds a marker comment, and the hook replaces it with the table the code renders, so the
tables cannot drift from the code: ``<!-- gputrain:training_args_fields -->`` becomes
``gputrain.training_args.fields_markdown()`` and ``<!-- gputrain:trainer_keywords -->`` becomes
``gputrain.trainer.trainer_keywords_markdown()``. The installed gputrain is imported
(``pip install ".[docs]"`` installs it). ``<!-- gputrain:source_counts -->`` becomes a table of
the source tree's folders (files and lines, counted when the site is built) and
``<!-- gputrain:table_counts -->`` the number of rows of the op, CUDA kernel and layer kind lists.
"""

from __future__ import annotations

import importlib
import pathlib
import re

_MARKERS = {
    "<!-- gputrain:training_args_fields -->": ("gputrain.training_args", "fields_markdown"),
    "<!-- gputrain:trainer_keywords -->": ("gputrain.trainer", "trainer_keywords_markdown"),
}


_FOLDERS = [  # (folder, what it holds)
    ("csrc/core", "status and errors, the allocator, tensors, the device registry, threads, shared math headers"),
    ("csrc/ops", "the op table (ops.h) and the CPU backend's ops (cpu_*.c), the arithmetic shared with CUDA (*_hd.h)"),
    ("csrc/nn", "the table of layer kinds, layers' forward/backward pairs, the model (graph, arenas, checkpointing), plan"),
    ("csrc/train", "the fused step, loss scaler, optimizers (+ offload, ZeRO-1), EMA, gradient norm"),
    ("csrc/data", "the loader: sampler, gather threads, the ring of pinned slots, device transfer"),
    ("csrc/dist", "collectives in rank order over MPI, TCP or the device's NCCL"),
    ("csrc/sim", "the simulated device: the device table over host memory, streams on threads"),
    ("csrc/py", "CPython + NumPy C API bindings: one file per Python type, module.c registers them"),
    ("cuda", "the CUDA backend: the same tables with cuBLAS(Lt), cuDNN, NCCL, streams and kernels"),
    ("python/gputrain", "the Python API: Trainer, TrainingArguments, DataLoader, nn, optim, amp, models"),
]
_SOURCE = re.compile(r"\.(c|h|cu|cuh|py|pyi)$")


def _source_counts(root: pathlib.Path) -> str:
    lines = ["| folder | files | lines | what it holds |", "|---|---:|---:|---|"]
    for folder, what in _FOLDERS:
        paths = [p for p in sorted((root / folder).rglob("*")) if p.is_file() and _SOURCE.search(p.name)]
        count = sum(len(p.read_bytes().splitlines()) for p in paths)
        lines.append(f"| `{folder}/` | {len(paths)} | {count:,} | {what} |")
    return "\n".join(lines) + "\n"


def _list_rows(path: pathlib.Path, macro: str, row: str) -> int:
    text = path.read_text()
    start = text.index(f"#define {macro}(X)")
    end = text.find("\n\n", start)
    return len(re.findall(row, text[start:end if end >= 0 else None]))


def _table_counts(root: pathlib.Path) -> str:
    ops = _list_rows(root / "csrc/ops/ops.h", "GT_OP_LIST", r"X\([A-Z_]+, \w+")
    kernels = _list_rows(root / "cuda/ops_kernels.cuh", "GT_CUDA_OP_LIST", r"X\(\w+\)")
    kinds = _list_rows(root / "csrc/nn/kind_list.h", "GT_LAYER_KIND_LIST", r"X\([A-Z0-9_]+, \w+\)")
    return (f"| list | rows |\n|---|---:|\n| ops (`GT_OP_LIST`, `csrc/ops/ops.h`) | {ops} |\n"
            f"| CUDA ops (`GT_CUDA_OP_LIST`, `cuda/ops_kernels.cuh`) | {kernels} |\n"
            f"| layer kinds (`GT_LAYER_KIND_LIST`, `csrc/nn/kind_list.h`) | {kinds} |\n")


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace each marker with its generated Markdown table."""
    for marker, (module, function) in _MARKERS.items():
        if marker in markdown:
            table = getattr(importlib.import_module(module), function)()
            markdown = markdown.replace(marker, table)
    root = pathlib.Path(config["config_file_path"]).resolve().parent
    if "<!-- gputrain:source_counts -->" in markdown:
        markdown = markdown.replace("<!-- gputrain:source_counts -->", _source_counts(root))
    if "<!-- gputrain:table_counts -->" in markdown:
        markdown = markdown.replace("<!-- gputrain:table_counts -->", _table_counts(root))
    return markdown
