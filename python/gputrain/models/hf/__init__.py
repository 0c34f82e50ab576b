"""Hugging Face model folders: ``from_pretrained`` / ``save_pretrained`` and the families they
dispatch to (``FAMILIES``: model_type -> Family; one module per family, ``gpt2`` today)."""

from gputrain.models.hf.config import HFConfig
from gputrain.models.hf.folder import FAMILIES, Family, from_pretrained, register_family, save_pretrained
from gputrain.models.hf.gpt2 import GPT2LMHeadModel
from gputrain.models.hf import encoders  # noqa: E402,F401  (registers bert, roberta, xlm-roberta, distilbert)

__all__ = ["FAMILIES", "Family", "GPT2LMHeadModel", "HFConfig", "from_pretrained", "register_family",
           "save_pretrained"]
