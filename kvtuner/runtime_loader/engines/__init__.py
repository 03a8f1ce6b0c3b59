"""A recipe profile in each engine's own form: ModelOpt's checkpoint metadata (which vLLM's and
TensorRT-LLM's ModelOpt readers take), TensorRT-LLM's per-layer ``KvCacheConfig.dtype`` and
vLLM's flags. Each form has a reader that checks it the way its engine does."""

from .modelopt import (
    modelopt_kv_layers,
    quant_config,
    read_quant_config,
    scale_tensors,
    write_checkpoint_kv,
)
from .trtllm import parse_trtllm_kv_dtype, trtllm_kv_dtype
from .vllm_flags import recipe_vllm_args

__all__ = [
    "modelopt_kv_layers",
    "parse_trtllm_kv_dtype",
    "quant_config",
    "read_quant_config",
    "recipe_vllm_args",
    "scale_tensors",
    "trtllm_kv_dtype",
    "write_checkpoint_kv",
]
