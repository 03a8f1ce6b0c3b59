"""KV formats: kvtuner's packed quantizer (specs, torch reference, Triton pack/unpack kernels,
key smoothing) shared by calibration, the HF cache and the SGLang pool; and the engines' own
formats, emulated bit-exact for measurement: vLLM's fp8/int8/int4 per token-head, NVFP4 and
TurboQuant caches (``vllm_*``) and the per-layer engine recipes built from them
(:mod:`.engine_recipe`)."""

from .reference import dequantize, fake_quantize, hadamard, quantize
from .slot_ops import gather_dequantized, quantize_rows, scatter_kv, scatter_quantized
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
    "scatter_kv",
    "scatter_quantized",
]
