"""Hugging Face model folders: ``from_pretrained`` / ``save_pretrained`` and the families they
dispatch to (``FAMILIES``: model_type -> Family): ``gpt2`` (gpt2.py), the Llama-like decoders
``llama``, ``qwen2``, ``qwen3``, ``mistral``, ``gemma``, ``gemma3_text`` (decoder_models.py) and the
encoders ``bert``, ``roberta``, ``xlm-roberta``, ``distilbert`` (encoders.py) and ``deberta-v2``
(DeBERTa-v2/v3, deberta.py)."""

from gputrain.models.hf.config import HFConfig
from gputrain.models.hf.decoder_models import (
    DecoderForCausalLM, DecoderForSequenceClassification, Gemma3ForCausalLM, Gemma3TextForSequenceClassification,
    GemmaForCausalLM, GemmaForSequenceClassification, LlamaForCausalLM, LlamaForSequenceClassification,
    MistralForCausalLM, MistralForSequenceClassification, Qwen2ForCausalLM, Qwen2ForSequenceClassification,
    Qwen3ForCausalLM, Qwen3ForSequenceClassification)
from gputrain.models.hf.folder import FAMILIES, Family, from_pretrained, register_family, save_pretrained
from gputrain.models.hf.gpt2 import GPT2LMHeadModel
from gputrain.models.hf import encoders  # noqa: E402,F401  (registers bert, roberta, xlm-roberta, distilbert)
from gputrain.models.hf import deberta  # noqa: E402,F401  (registers deberta-v2)

__all__ = ["FAMILIES", "DecoderForCausalLM", "DecoderForSequenceClassification", "Family", "GPT2LMHeadModel",
           "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification", "GemmaForCausalLM",
           "GemmaForSequenceClassification", "HFConfig", "LlamaForCausalLM", "LlamaForSequenceClassification",
           "MistralForCausalLM", "MistralForSequenceClassification", "Qwen2ForCausalLM",
           "Qwen2ForSequenceClassification", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification",
           "from_pretrained", "register_family", "save_pretrained"]
