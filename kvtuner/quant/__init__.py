"""The packed KV quantizer shared by calibration, the HF cache and the SGLang pool."""

from .reference import dequantize, fake_quantize, hadamard, quantize
from .slot_ops import gather_dequantized, quantize_rows, scatter_quantized
from .smoothing import KeySmoothing
from .spec import QUANTIZED_BITS, SUPPORTED_BITS, V1_BITS, QuantSpec

__all__ = [
    "QUANTIZED_BITS",
    "SUPPORTED_BITS",
    "V1_BITS",
    "KeySmoothing",
    "QuantSpec",
    "dequantize",
    "fake_quantize",
    "gather_dequantized",
    "hadamard",
    "quantize",
    "quantize_rows",
    "scatter_quantized",
]
