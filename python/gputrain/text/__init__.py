"""gputrain.text: pretrained tokenizers from Hugging Face folders, over the `tokenizers` package
(an optional dependency: pip install 'gputrain[text]'; imported when a tokenizer is loaded).

    tok = gputrain.tokenizer_from_pretrained("deberta-v3-base/")
    batch = tok(premises, hypotheses, padding=True, truncation=True, return_tensors="np")
    columns = gputrain.data.tokenize(tok, premises, hypotheses)   # ragged columns for the DataLoader
"""

from __future__ import annotations

from gputrain.text.tokenizer import BatchEncoding, PretrainedTokenizer, tokenizer_from_pretrained

__all__ = ["BatchEncoding", "PretrainedTokenizer", "tokenizer_from_pretrained"]
