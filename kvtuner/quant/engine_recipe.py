"""EngineRecipe: one KV format per layer, in the formats the engines serve with their own kernels.

A layer's format names how vLLM (and ModelOpt, TensorRT-LLM) store its K and V:

- ``auto``: the model's dtype (unquantized; ModelOpt counts it 16 bits);
- ``fp8``: FP8 E4M3 with one calibrated scale per layer and side (8 bits);
- ``nvfp4`` / ``nvfp4_4over6``: E2M1 in blocks of 16 with an FP8 block scale (4.5 bits);
- ``fp8k_nvfp4v``: keys FP8, values NVFP4 (ModelOpt's mixed candidate, 6.25 bits);
- ``turboquant_*``: vLLM's TurboQuant presets (bits from the bytes vLLM's slot takes).

Effective bits are counted as ModelOpt's ``kv_cache`` cost model counts them: 8 times the bytes
one token-head's page takes per element, K and V averaged, the model dtype at 16, and a recipe's
bits are the mean over layers. Per-layer scales derive from the calibrated amax of what the cache
stores (keys after RoPE): ``k_scale = amax / 448`` for FP8 (ModelOpt's convention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .vllm_format import VllmKVFormat, kv_scale

__all__ = ["ENGINE_FORMATS", "LAYER_FORMATS", "EngineRecipe", "format_bits"]

MODEL_DTYPE = "auto"
TURBOQUANT = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
LAYER_FORMATS: dict[str, tuple[str | None, str | None]] = {  # name -> (K dtype, V dtype) in vLLM
    MODEL_DTYPE: (None, None),
    "fp8": ("fp8_e4m3", "fp8_e4m3"),
    "nvfp4": ("nvfp4", "nvfp4"),
    "nvfp4_4over6": ("nvfp4_4over6", "nvfp4_4over6"),
    "fp8k_nvfp4v": ("fp8_e4m3", "nvfp4"),
    **{name: (name, name) for name in TURBOQUANT},
}
# What each engine serves per layer (the model dtype always): ModelOpt's three candidates;
# TensorRT-LLM's per-layer KvCacheConfig.dtype and vLLM's ModelOpt map, FP8 and NVFP4.
ENGINE_FORMATS: dict[str, tuple[str, ...]] = {
    "modelopt": (MODEL_DTYPE, "fp8", "nvfp4", "fp8k_nvfp4v"),
    "vllm": (MODEL_DTYPE, "fp8", "nvfp4"),
    "trtllm": (MODEL_DTYPE, "fp8", "nvfp4"),
}


def _side_format(dtype: str | None, amax: float) -> VllmKVFormat | None:
    if dtype is None:
        return None
    scale = kv_scale(dtype, amax)
    return VllmKVFormat(dtype, scale, scale)


def format_bits(name: str, head_dim: int) -> Fraction:
    """Bits per element a layer in ``name`` takes, K and V averaged (the model dtype: 16)."""
    if name not in LAYER_FORMATS:
        raise ValueError(f"unknown layer format {name!r}; choose from {', '.join(LAYER_FORMATS)}")
    sides = []
    for which, dtype in zip("kv", LAYER_FORMATS[name], strict=True):
        nbytes = 2 * head_dim if dtype is None else VllmKVFormat(dtype).side_bytes(head_dim, which)
        sides.append(Fraction(8 * nbytes, head_dim))
    return sum(sides, Fraction(0)) / 2


def _check_amax(name: str, values: tuple[float, ...]) -> None:
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int | float)]
    if bad or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"{name} must be non-negative finite numbers, got {list(values)!r}")


@dataclass(frozen=True)
class EngineRecipe:
    """``layers``: a :data:`LAYER_FORMATS` name per layer; ``k_amax`` / ``v_amax``: per layer,
    the largest |K| / |V| the cache stores on the calibration text (the source of the scales)."""

    layers: tuple[str, ...]
    k_amax: tuple[float, ...]
    v_amax: tuple[float, ...]

    def __post_init__(self) -> None:
        for name in ("layers", "k_amax", "v_amax"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.layers:
            raise ValueError("a recipe needs at least one layer")
        unknown = sorted({f for f in self.layers if f not in LAYER_FORMATS})
        if unknown:
            raise ValueError(
                f"unknown layer format(s) {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(LAYER_FORMATS)}"
            )
        n = len(self.layers)
        if (len(self.k_amax), len(self.v_amax)) != (n, n):
            raise ValueError(f"a recipe of {n} layers needs {n} k_amax and {n} v_amax values")
        _check_amax("k_amax", self.k_amax)
        _check_amax("v_amax", self.v_amax)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_formats(self, layer: int) -> tuple[VllmKVFormat | None, VllmKVFormat | None]:
        """How ``layer`` stores K and V (None: the model's dtype), with its scales."""
        k_dtype, v_dtype = LAYER_FORMATS[self.layers[layer]]
        return _side_format(k_dtype, self.k_amax[layer]), _side_format(v_dtype, self.v_amax[layer])

    def scales(self, layer: int) -> tuple[float, float] | None:
        """(k_scale, v_scale) an engine loads for ``layer``; None for the model dtype."""
        k, v = self.layer_formats(layer)
        if k is None and v is None:
            return None
        return (k.k_scale if k else 1.0), (v.v_scale if v else 1.0)

    def effective_bits(self, head_dim: int) -> Fraction:
        """The mean over layers of :func:`format_bits` (ModelOpt's ``effective_bits``)."""
        return sum((format_bits(f, head_dim) for f in self.layers), Fraction(0)) / self.num_layers

    def with_layers(self, layers: tuple[str, ...]) -> EngineRecipe:
        """The same calibration, another format per layer."""
        return EngineRecipe(layers, self.k_amax, self.v_amax)

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), "k_amax": list(self.k_amax),
                "v_amax": list(self.v_amax)}  # fmt: skip
