"""vLLM flags for a recipe.

vLLM 0.32 serves one ``--kv-cache-dtype`` with ``--kv-cache-dtype-skip-layers`` at the model
dtype: a recipe of one quantized format and model-dtype layers is exactly that, at unit
per-layer scales (0.32 loads KV scales only with a quantized-weights ModelOpt config, and
refuses a KV-only one: tests/runtime_loader/vllm/test_recipe_exports.py). A recipe that mixes
quantized formats, or wants its calibrated scales, needs vLLM's ModelOpt KV map reader (vLLM
#56155 / #56116, not in 0.32): ``--kv-cache-dtype auto`` and the checkpoint
``kvtuner export-hf --recipe`` writes.
"""

from __future__ import annotations

from ...quant.engine_recipe import LAYER_FORMATS, MODEL_DTYPE

__all__ = ["recipe_vllm_args"]


def recipe_vllm_args(layers: tuple[str, ...]) -> tuple[list[str], bool]:
    """(flags, needs_map): the ``vllm serve`` KV flags, and whether the checkpoint's ModelOpt
    map (a vLLM with its reader) is what carries the recipe."""
    quantized = {f for f in layers if f != MODEL_DTYPE}
    if not quantized:
        return ["--kv-cache-dtype", "auto"], False
    dtypes = {d for f in quantized for d in LAYER_FORMATS[f]}
    if len(dtypes) > 1:
        return ["--kv-cache-dtype", "auto"], True
    args = ["--kv-cache-dtype", dtypes.pop()]
    skipped = [str(i) for i, f in enumerate(layers) if f == MODEL_DTYPE]
    if skipped:  # vLLM parses this list flag space-separated (nargs="+")
        args += ["--kv-cache-dtype-skip-layers", *skipped]
    return args, False
