"""gputrain.models: complete models built from gputrain.nn layers, and Hugging Face's decoder
families (from_pretrained of a model folder, or the family classes built from a config mapping)."""

from gputrain.models.classifier import TransformerClassifier, encode_pairs, encode_single
from gputrain.models.cnn import SimpleCNN
from gputrain.models.gpt import GPT, GPTConfig
from gputrain.models.hf import (
    FAMILIES, GPT2LMHeadModel, Gemma3ForCausalLM, Gemma3TextForSequenceClassification, GemmaForCausalLM,
    GemmaForSequenceClassification, LlamaForCausalLM, LlamaForSequenceClassification, MistralForCausalLM,
    MistralForSequenceClassification, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen3ForCausalLM,
    Qwen3ForSequenceClassification, from_pretrained, save_pretrained)

__all__ = ["FAMILIES", "GPT", "GPT2LMHeadModel", "GPTConfig", "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification",
           "GemmaForCausalLM", "GemmaForSequenceClassification", "LlamaForCausalLM", "LlamaForSequenceClassification",
           "MistralForCausalLM", "MistralForSequenceClassification", "Qwen2ForCausalLM",
           "Qwen2ForSequenceClassification", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", "SimpleCNN",
           "TransformerClassifier", "encode_pairs", "encode_single", "from_pretrained", "save_pretrained"]
