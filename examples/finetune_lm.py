"""Fine-tune a causal language model from a Hugging Face folder (Llama, Qwen2/3, Mistral, Gemma,
Gemma3, GPT-2) on a text file, through gputrain's Trainer: packed rows (no padding), gradient
accumulation, gradient checkpointing, a cosine schedule, bf16 where the CPU multiplies it natively,
a checkpoint at the end; it prints the start-up block, the loss as it goes, the validation loss and
perplexity, and a sample.

    python examples/finetune_lm.py --model FOLDER [--text FILE] [--steps 200] [--seq-len 512]
    python examples/finetune_lm.py            # no folder: a small Llama-architecture model from scratch

Without --model it builds a small Llama-architecture model itself (grouped-query attention,
SwiGLU, RMSNorm, rotary embeddings) over byte-level ids (vocabulary 256: each byte of the UTF-8
text is a token) and trains it on the standard library's sources, so it runs on a fresh machine in
minutes (300 steps: 10 on 2 shared cores at load 6). With --model the folder's tokenizer.json
tokenizes the text (the `tokenizers` package: pip install ".[text]").
"""

from __future__ import annotations

import argparse
import math
import os
import sysconfig
import tempfile

import numpy as np

import gputrain as gt
from gputrain.models import from_pretrained
from gputrain.models.hf.decoder_models import LlamaForCausalLM

STDLIB_FILES = ("textwrap.py", "string.py", "shlex.py", "fractions.py", "calendar.py", "heapq.py", "bisect.py",
                "dataclasses.py", "functools.py", "argparse.py", "difflib.py", "pprint.py")
SMALL_LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 128, "intermediate_size": 352,
               "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 1024, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
               "rms_norm_eps": 1e-5, "tie_word_embeddings": True}


def stdlib_documents() -> list[str]:
    """The sources of a few standard-library modules, one document each."""
    stdlib = sysconfig.get_paths()["stdlib"]
    texts = []
    for name in STDLIB_FILES:
        path = os.path.join(stdlib, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
    if not texts:
        raise SystemExit(f"none of {STDLIB_FILES} found under {stdlib}")
    return texts


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: np.ndarray) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def load(args: argparse.Namespace):
    """(model, tokenizer, documents)."""
    if args.model is None:
        return LlamaForCausalLM(SMALL_LLAMA), ByteTokenizer(), stdlib_documents()
    model = from_pretrained(args.model)
    if not os.path.exists(os.path.join(args.model, "tokenizer.json")):
        raise SystemExit(f"{args.model}: no tokenizer.json to tokenize the text with")
    tokenizer = gt.tokenizer_from_pretrained(args.model)
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            documents = [part for part in f.read().split("\n\n") if part.strip()]
    else:
        documents = stdlib_documents()
    return model, tokenizer, documents


def packed_rows(model: gt.nn.Module, documents: list[np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
    """Documents packed into rows of seq_len. The Llama-like families read position ids (no token
    attends across a document) and shift their labels; GPT-2 reads the ids alone, so it gets
    shifted targets and attends across documents within a row, as GPT-2 was trained."""
    if hasattr(model, "shift_labels"):
        return gt.data.pack_sequences(documents, seq_len)
    packed = gt.data.pack_sequences(documents, seq_len, shift_labels=True)
    return {"input_ids": packed["input_ids"], "labels": packed["labels"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model folder (default: a small Llama from scratch)")
    parser.add_argument("--text", help="a UTF-8 text file, documents separated by blank lines (default: "
                                       "the standard library's sources)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--lr", type=float, default=None, help="default: 3e-3 from scratch, 5e-5 fine-tuning")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="auto: bf16 where this CPU's bf16 GEMMs are native, else fp32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    if args.threads:
        gt.set_num_threads(args.threads)
    gt.random.manual_seed(0)
    model, tokenizer, documents = load(args)
    config = model.config  # GPT-2's positions are a table of block_size rows
    longest = getattr(config, "block_size", None) or config.max_position_embeddings
    if args.seq_len > longest:
        print(f"--seq-len {args.seq_len} is longer than the model's {longest} positions: using {longest}")
        args.seq_len = longest
    ids = [np.asarray(tokenizer.encode(text), dtype=np.int64) for text in documents]
    held_out = ids[-1]  # the last document validates
    train, valid = packed_rows(model, ids[:-1], args.seq_len), packed_rows(model, [held_out], args.seq_len)
    precision = args.precision
    if precision == "auto":
        precision = "bf16" if "bf16" in gt.info()["cpu_native_gemm"] else "fp32"
    training_args = gt.TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="finetune_lm-"),
        per_device_train_batch_size=args.batch, per_device_eval_batch_size=args.batch,
        gradient_accumulation_steps=args.accumulation, max_steps=args.steps,
        learning_rate=args.lr or (3e-3 if args.model is None else 5e-5), weight_decay=0.1,
        lr_scheduler_type="cosine", warmup_steps=0.05, bf16=precision == "bf16", gradient_checkpointing=True,
        logging_steps=max(1, args.steps // 10), save_strategy="steps", save_steps=args.steps,
        eval_strategy="no", disable_tqdm=True, report_to="none")
    print(f"{sum(len(d) for d in ids[:-1]):,} training tokens in {len(train['input_ids'])} packed rows of "
          f"{args.seq_len}; validation: {len(held_out):,} tokens; precision {precision}")
    trainer = gt.Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=valid)
    trainer.train()
    loss = trainer.evaluate()["eval_loss"]
    print(f"validation loss {loss:.3f} nats/token, perplexity {math.exp(loss):.2f}")
    prompt = np.asarray(tokenizer.encode("def "), dtype=np.int64)[None]
    sample = model.eval().generate(prompt, 120, do_sample=True, temperature=0.8, top_k=20, seed=0)
    print("sample:\n" + tokenizer.decode(sample[0]))


if __name__ == "__main__":
    main()
