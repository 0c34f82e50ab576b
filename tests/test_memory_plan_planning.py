"""Models built inside gputrain.memory_plan.planning() (laid out, never allocated): their plans
equal those of the same models built and allocated, to the byte, for the decoder families' tiny
fixtures in bf16 and fp32, full, with LoRA and with an NF4 base, the LM head and loss whole and
chunked; and such a model refuses everything that needs values."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import gputrain as gt
from gputrain import memory_plan as mp
from gputrain.nn.module import planning_active
from gputrain.nn.qlinear import quantized_linears

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = {"llama-tiny": gt.models.LlamaForCausalLM, "qwen3-tiny": gt.models.Qwen3ForCausalLM,
            "gemma3-tiny": gt.models.Gemma3ForCausalLM, "mistral-tiny": gt.models.MistralForCausalLM}
SHAPE = (2, 3, 16)  # ids, mask, position ids


def build(name: str, variant: str, device: str) -> gt.nn.Module:
    """variant: "full" (everything trains), "lora" (r=4 on all linear layers), "nf4" (NF4 decoder
    Linears, the embeddings frozen: the rest trains)."""
    config = json.loads((FIXTURES / name / "config.json").read_text())
    if "final_logit_softcapping" in config:  # Gemma-3-1B's value: a soft-capped head cannot be chunked
        config["final_logit_softcapping"] = None
    linear = quantized_linears("nf4") if variant == "nf4" else gt.nn.Linear
    model = FAMILIES[name](config, init_weights=False, linear=linear)
    if variant == "lora":  # adapted on the cpu, then moved
        model = gt.peft.get_peft_model(model, gt.peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    model = model.to(device)
    if variant == "nf4":
        for pname, p in model.named_parameters():
            p.requires_grad = "embed" not in pname
    return model


def plans(model: gt.nn.Module, kind: str) -> list[tuple]:
    numels = tuple(p.numel() for p in model.parameters() if p.requires_grad)
    out = []
    for precision in ("bf16", "fp32"):
        for checkpointing in (True, False):
            for chunk in (0, 8):
                plan = mp.plan_training(model, SHAPE, precision=precision, checkpointing=checkpointing,
                                        optimizer=mp.OptimizerSpec(kind, numels), loss_chunk_rows=chunk)
                out.append((dict(plan), plan.alternatives, plan.activation_arena, plan.settings))
    return out


@pytest.mark.parametrize("device", ["sim", "cpu"])
@pytest.mark.parametrize("variant", ["full", "lora", "nf4"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_plan_only_equals_allocated(name: str, variant: str, device: str) -> None:
    allocated = build(name, variant, device)
    with mp.planning():
        planned = build(name, variant, device)
    assert planned.compiled.plan_only and not allocated.compiled.plan_only
    assert planned.compiled.num_parameters == allocated.compiled.num_parameters
    kind = "adamw8bit" if variant == "lora" else "adamw"
    assert plans(planned, kind) == plans(allocated, kind)
    assert planned.compiled.num_gradients == allocated.compiled.num_gradients  # after the freezing sync
    live = planned.compiled.live_arenas()
    assert live["parameters"] == live["gradients"] == live["half_parameters"] == live["buffers"] == 0


def test_plan_only_model_refuses_values() -> None:
    with mp.planning():
        model = build("llama-tiny", "lora", "cpu")
    ids = np.zeros((1, 3, 8), np.int64)
    ids[:, 1] = 1
    ids[:, 2] = np.arange(8)
    with pytest.raises(ValueError, match="planning only"):
        model(ids)
    with pytest.raises(ValueError, match="planning only"):
        model.state_dict()
    with pytest.raises(ValueError, match="planning only"):
        gt.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with pytest.raises(ValueError, match="planning only"):
        model.compiled.parameter_arrays()
    with pytest.raises(ValueError, match="planning only"):
        with mp.planning():
            gt.peft.get_peft_model(build("llama-tiny", "full", "cpu"),
                                   gt.peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert not planning_active()  # the contexts ended, also by an exception


def test_plan_only_builds_what_memory_cannot_hold() -> None:
    """A 1e12-parameter layer (4 TB of f32) plans without allocating."""
    with mp.planning():
        model = gt.nn.Sequential(gt.nn.Linear(1_000_000, 1_000_000, bias=False))
    plan = mp.plan_training(model, (1, 1_000_000), precision="bf16")
    assert plan["cpu"]["parameters"] >= 4 * 10**12 and plan["cpu"]["half_parameters"] >= 2 * 10**12


def test_memory_plans_script_plans_every_row() -> None:
    """benchmarks/memory_plans.py (the README's table) on Qwen3-0.6B: every row a plan whose regions
    add up; the LoRA rows, on the bf16, NF4 or int8 base, train r*(in+out) per adapted Linear and
    nothing else, and the NF4 base plans fewer bytes than the int8 one, which plans fewer than the
    bf16 one."""
    script = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "memory_plans.py"
    done = subprocess.run([sys.executable, str(script), "--models", "qwen3-0.6b", "--chunks", "512", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {r["row"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(rows) == sorted(("full", "full8", "full8-paged", "lora", "lora8", "nf4-lora", "nf4-lora8", "nf4",
                                   "int8-lora", "frozen"))
    for row in rows.values():
        assert row["device_total"] == sum(row["device_regions"].values()) > 0
    per_layer = 16 * ((1024 + 2048) + 2 * (1024 + 1024) + (2048 + 1024) + 2 * (1024 + 3072) + (3072 + 1024))
    assert rows["lora"]["trainable"] == rows["lora8"]["trainable"] == 28 * per_layer
    assert rows["nf4-lora"]["trainable"] == rows["nf4-lora8"]["trainable"] == rows["int8-lora"]["trainable"] \
        == 28 * per_layer
    assert rows["nf4-lora"]["device_total"] < rows["int8-lora"]["device_total"] < rows["lora"]["device_total"]
    assert rows["full"]["trainable"] == rows["full"]["parameters"]
    assert rows["frozen"]["trainable"] == rows["nf4"]["trainable"] == 0
    assert rows["full8"]["device_regions"]["optimizer_state"] < rows["full"]["device_regions"]["optimizer_state"] / 3
    paged = rows["full8-paged"]  # the 8-bit state in pinned memory, with its staging buffers
    assert "optimizer_state" not in paged["device_regions"] and rows["full8"]["pinned_total"] == 0
    assert paged["pinned_total"] > rows["full8"]["device_regions"]["optimizer_state"]
    assert paged["device_total"] == rows["full8"]["device_total"] - rows["full8"]["device_regions"]["optimizer_state"]
    table = subprocess.run([sys.executable, str(script), "--models", "qwen3-0.6b", "--rows", "nf4,nf4-lora", "--chunks",
                            "512", "--markdown"], capture_output=True, text=True, timeout=600)
    assert table.returncode == 0, table.stderr[-4000:]
    lines = table.stdout.splitlines()
    assert len(lines) == 4 and len({line.count("|") for line in lines}) == 1  # header, rule, two plans
