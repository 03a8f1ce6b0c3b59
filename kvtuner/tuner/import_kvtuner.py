"""Convert KVTuner's published per-layer presets (YAML ``{layer: {nbits_key, nbits_value}}``)
into a kvtuner profile. The YAML states only bits; axis, group and grid come from the caller
(KVTuner's own ``--axis_key/--axis_value/--group_size/--asym`` flags, here keyword arguments)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml

from ..errors import KVTunerError
from ..profile import LayerSpec, ModelFingerprint, Profile
from ..quant.spec import QuantSpec

__all__ = ["import_kvtuner_yaml", "read_kvtuner_yaml"]


def read_kvtuner_yaml(path: str | os.PathLike) -> dict[int, tuple[int, int]]:
    """``{layer: (nbits_key, nbits_value)}`` for layers 0..N-1; one-line errors otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise KVTunerError(f"KVTuner preset not found: {path}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KVTunerError(f"cannot read KVTuner preset {path}: {first}") from None
    if not isinstance(data, dict) or not data:
        raise KVTunerError(f"KVTuner preset {path} must map layer -> {{nbits_key, nbits_value}}")
    layers = {}
    for key, entry in data.items():
        try:
            layer = int(key)
        except (TypeError, ValueError):
            raise KVTunerError(f"KVTuner preset {path}: layer key {key!r} is not an int") from None
        if not isinstance(entry, dict) or not {"nbits_key", "nbits_value"} <= set(entry):
            raise KVTunerError(
                f"KVTuner preset {path}: layer {layer} needs nbits_key and nbits_value"
            )
        layers[layer] = (entry["nbits_key"], entry["nbits_value"])
    if sorted(layers) != list(range(len(layers))):
        raise KVTunerError(f"KVTuner preset {path}: layers must be 0..{len(layers) - 1}, once each")
    return layers


def _spec(bits: Any, template: QuantSpec, where: str) -> QuantSpec:
    if bits == 16:
        return QuantSpec(16)
    try:
        return QuantSpec(
            bits, template.group_size, template.symmetric, template.axis, template.rotation
        )
    except (TypeError, ValueError) as exc:
        raise KVTunerError(f"{where}: {exc}") from None


def import_kvtuner_yaml(
    path: str | os.PathLike,
    fingerprint: ModelFingerprint,
    *,
    model_id: str,
    key: QuantSpec | None = None,
    value: QuantSpec | None = None,
) -> Profile:
    """A profile for ``fingerprint``'s model; ``key``/``value`` templates give everything but
    the bits (default: channel-axis keys, token-axis values, group 32, asymmetric).

    Rejects (one line) a preset whose layer count differs from the model's.
    """
    key = key or QuantSpec(4, 32, axis="channel")  # KVTuner's KIVI scheme by default
    value = value or QuantSpec(4, 32)
    layers = read_kvtuner_yaml(path)
    if len(layers) != fingerprint.num_layers:
        raise KVTunerError(
            f"KVTuner preset {Path(path).name} has {len(layers)} layers but "
            f"{model_id} has {fingerprint.num_layers}"
        )
    specs = tuple(
        LayerSpec(
            i, _spec(kb, key, f"layer {i} nbits_key"), _spec(vb, value, f"layer {i} nbits_value")
        )
        for i, (kb, vb) in sorted(layers.items())
    )
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    source = {"imported_from": "KVTuner preset", "file": Path(path).name, "sha256": digest}
    profile = Profile(model_id, fingerprint, specs, calibration=source)
    return profile.with_accounting(asked=f"KVTuner preset {Path(path).name}")
