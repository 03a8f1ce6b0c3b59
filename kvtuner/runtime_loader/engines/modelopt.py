"""ModelOpt's layer-wise KV checkpoint metadata (``kv_cache_schema_version`` 1), for a recipe.

The form ModelOpt's KV AutoQuantize exports (NVIDIA/Model-Optimizer #2211/#2272) and vLLM's
reader of it takes (``ModelOptMixedPrecisionConfig``, vLLM RFC #57445 / PR #56116):

- ``hf_quant_config.json``: ``{"producer": ..., "quantization": {"quant_algo":
  "MIXED_PRECISION", "quantized_layers": {}, "kv_cache_quant_algo": "MIXED_PRECISION",
  "kv_cache_quantized_layers": {"model.layers.0.self_attn": {"quant_algo": "FP8"}, ...},
  "kv_cache_schema_version": 1}}``; every layer in one quantized format writes that format's
  name as ``kv_cache_quant_algo`` instead (the map stays);
- ``config.json``'s ``quantization_config``: the same keys with ``"quant_method": "modelopt"``;
- unlisted layers stay in the model dtype;
- scales: ``model.layers.N.self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` = amax / 448 for FP8
  and NVFP4 alike (NVFP4's block scales are computed as the cache is written).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...errors import KVTunerError
from ...profile.io import read_json, write_json_atomic
from ...quant.engine_recipe import MODEL_DTYPE

__all__ = [
    "modelopt_kv_layers",
    "quant_config",
    "read_quant_config",
    "scale_tensors",
    "write_checkpoint_kv",
]

KV_SCHEMA_VERSION = 1
MIXED = "MIXED_PRECISION"
SCALES_FILE = "kv_scales.safetensors"
ALGOS = {"fp8": "FP8", "nvfp4": "NVFP4", "fp8k_nvfp4v": "FP8_K_NVFP4_V"}  # ours -> ModelOpt's
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.self_attn$")


def _attn(layer: int) -> str:
    return f"model.layers.{layer}.self_attn"


def modelopt_kv_layers(layers: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``kv_cache_quantized_layers``: each quantized layer's attention module and algorithm."""
    bad = sorted({f for f in layers if f != MODEL_DTYPE and f not in ALGOS})
    if bad:
        raise KVTunerError(f"ModelOpt has no KV format for {', '.join(bad)}")
    return {_attn(i): {"quant_algo": ALGOS[f]} for i, f in enumerate(layers) if f != MODEL_DTYPE}


def quant_config(layers: tuple[str, ...]) -> dict[str, Any]:
    """The ``quantization`` section of ``hf_quant_config.json`` (``config.json``'s
    ``quantization_config`` is it plus ``"quant_method": "modelopt"``)."""
    mapped = modelopt_kv_layers(layers)
    if not mapped:
        raise KVTunerError("the recipe quantizes no layer: nothing for ModelOpt's KV config")
    algos = {entry["quant_algo"] for entry in mapped.values()}
    uniform = len(algos) == 1 and len(mapped) == len(layers)
    return {"quant_algo": MIXED, "quantized_layers": {},
            "kv_cache_quant_algo": algos.pop() if uniform else MIXED,
            "kv_cache_quantized_layers": mapped,
            "kv_cache_schema_version": KV_SCHEMA_VERSION}  # fmt: skip


def _layer_of(key: Any, num_layers: int) -> int:
    m = _LAYER_KEY.match(key) if isinstance(key, str) else None
    if m is None or int(m.group(1)) >= num_layers:
        raise KVTunerError(
            f"kv_cache_quantized_layers key {key!r} is not model.layers.N.self_attn "
            f"with N < {num_layers}"
        )
    return int(m.group(1))


def read_quant_config(config: Any, num_layers: int) -> tuple[str, ...]:
    """A format per layer from a ModelOpt KV ``quantization`` section, checked as vLLM's reader
    checks it (schema version 1, a non-empty map, known algorithms); one line when it is not."""
    if not isinstance(config, dict):
        raise KVTunerError("ModelOpt quantization config must be an object")
    if config.get("kv_cache_schema_version") != KV_SCHEMA_VERSION:
        found = config.get("kv_cache_schema_version")
        raise KVTunerError(f"kv_cache_schema_version must be {KV_SCHEMA_VERSION}, got {found!r}")
    mapped = config.get("kv_cache_quantized_layers")
    if not isinstance(mapped, dict) or not mapped:
        raise KVTunerError("kv_cache_quantized_layers must be a non-empty object")
    by_algo = {v: k for k, v in ALGOS.items()}
    layers = [MODEL_DTYPE] * num_layers
    for key, entry in mapped.items():
        algo = entry.get("quant_algo") if isinstance(entry, dict) else None
        if not isinstance(algo, str) or algo.upper() not in by_algo:
            raise KVTunerError(f"unsupported ModelOpt KV format {algo!r} for {key}")
        layers[_layer_of(key, num_layers)] = by_algo[algo.upper()]
    return tuple(layers)


def scale_tensors(recipe: Any) -> dict[str, float]:
    """Checkpoint tensor name -> value of each quantized layer's k_scale and v_scale."""
    out = {}
    for i in range(recipe.num_layers):
        scales = recipe.scales(i)
        if scales is not None:
            out[f"{_attn(i)}.k_proj.k_scale"], out[f"{_attn(i)}.v_proj.v_scale"] = scales
    return out


def write_checkpoint_kv(folder: Path, recipe: Any) -> None:
    """Make the HF folder ``folder`` a ModelOpt KV checkpoint for ``recipe``: its
    ``hf_quant_config.json``, ``config.json``'s ``quantization_config`` and the per-layer scales
    (fp32 scalars in ``kv_scales.safetensors``, listed in the safetensors index)."""
    import torch
    from safetensors.torch import save_file

    from ..._version import __version__

    section = quant_config(recipe.layers)
    producer = {"name": "kvtuner", "version": __version__}
    quant = {"producer": producer, "quantization": section}
    write_json_atomic(folder / "hf_quant_config.json", quant)
    config = read_json(folder / "config.json", "config")
    config["quantization_config"] = {"quant_method": "modelopt", **section}
    write_json_atomic(folder / "config.json", config)
    scales = {k: torch.tensor(v, dtype=torch.float32) for k, v in scale_tensors(recipe).items()}
    save_file(scales, folder / SCALES_FILE)
    _index_scales(folder, list(scales))


def _index_scales(folder: Path, names: list[str]) -> None:
    """List the scales in ``model.safetensors.index.json`` (made for a one-file checkpoint)."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        index = read_json(index_path, "safetensors index")
    else:
        from safetensors import safe_open

        with safe_open(folder / "model.safetensors", "pt") as f:
            index = {"metadata": {}, "weight_map": dict.fromkeys(f.keys(), "model.safetensors")}
    index["weight_map"].update(dict.fromkeys(names, SCALES_FILE))
    write_json_atomic(index_path, index)
