"""bitsandbytes' quantization formats, bit-exact: NF4/FP4 blockwise 4-bit with double
quantization (QuantState, bnb-4bit checkpoints), 8-bit blockwise dynamic quantization (8-bit
optimizer state) and LLM.int8's row-wise int8. The C path (ops.h quantize_blockwise /
dequantize_blockwise) runs on the CPU or a device; gputrain.quant.reference is the NumPy
reference it is tested against."""

from gputrain.quant.blockwise import BLOCKSIZES_4BIT, dequantize_blockwise, quantize_blockwise
from gputrain.quant.codes import DYNAMIC_SIGNED, DYNAMIC_UNSIGNED, FP4, NF4
from gputrain.quant.int8 import int8_vectorwise_dequant, int8_vectorwise_quant
from gputrain.quant.state import (QuantState, dequantize_4bit, from_tensors, quantize_4bit, read_bnb4bit,
                                  to_tensors)

__all__ = ["BLOCKSIZES_4BIT", "DYNAMIC_SIGNED", "DYNAMIC_UNSIGNED", "FP4", "NF4", "QuantState",
           "dequantize_4bit", "dequantize_blockwise", "from_tensors", "int8_vectorwise_dequant",
           "int8_vectorwise_quant", "quantize_4bit", "quantize_blockwise", "read_bnb4bit", "to_tensors"]
