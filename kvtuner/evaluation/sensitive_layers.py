"""The hand heuristic users apply today: uniform bits, with the layers calibration ranks most
sensitive raised to 8 bits.

On Qwen-family models a single layer can dominate the quantization loss, and the common fix is to
keep that layer (or two) in high precision by hand. These rows are the peer a searched profile
must beat: the search has to add something beyond finding that layer.
"""

from __future__ import annotations

from dataclasses import replace

from ..calibration.sensitivity import Sensitivity
from ..errors import KVTunerError
from ..profile import LayerSpec
from .configs import EvalConfig

RAISED_BITS = 8

__all__ = ["RAISED_BITS", "most_sensitive_layers", "with_sensitive_layers_raised"]


def most_sensitive_layers(sensitivity: Sensitivity, bits: int, count: int) -> tuple[int, ...]:
    """The ``count`` layers whose K plus V KL at ``bits`` is largest, most sensitive first."""
    if bits not in sensitivity.bits:
        raise KVTunerError(f"sensitivity file has no {bits}-bit column (it has {sensitivity.bits})")
    damage = {
        i: sensitivity.kl(i, "k", bits) + sensitivity.kl(i, "v", bits)
        for i in range(len(sensitivity.layers))
    }
    return tuple(sorted(damage, key=damage.get, reverse=True)[:count])


def _raised(layer: LayerSpec) -> LayerSpec:
    k = replace(layer.k, bits=RAISED_BITS) if layer.k.is_quantized else layer.k
    v = replace(layer.v, bits=RAISED_BITS) if layer.v.is_quantized else layer.v
    return replace(layer, k=k, v=v)


def with_sensitive_layers_raised(
    base: EvalConfig, sensitivity: Sensitivity, count: int
) -> EvalConfig:
    """``base`` (a uniform row) with its ``count`` most sensitive layers at 8-bit K and V (same
    axis, group and rotation), ranked at the base's own key bit width."""
    if base.specs is None:
        raise KVTunerError(f"{base.name}: only rows with layer specs can have layers raised")
    bits = base.specs[0].k.bits
    layers = most_sensitive_layers(sensitivity, bits, count)
    specs = tuple(_raised(s) if s.layer in layers else s for s in base.specs)
    name = f"{base.name}+8bit-l{'-'.join(map(str, layers))}"
    return EvalConfig(name, "uniform", specs, source=f"top {count} of {sensitivity.model_id}")
