"""gputrain.models: ready-made models built from gputrain.nn layers."""

from gputrain.models.gpt import GPT, GPTConfig
