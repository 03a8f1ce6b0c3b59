"""Sensitivity file (``kvtuner-sensitivity`` v1): per-layer K and V damage at each bit width.

KL is the mean over calibration positions of KL(fp || quantized) with ONLY that tensor of that
layer quantized; ``attn_rel_err`` is that layer's relative attention-output error (Frobenius).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import KVTunerError
from ..profile import ModelFingerprint, read_json, write_json_atomic
from ..quant import QUANTIZED_BITS, QuantSpec

FORMAT = "kvtuner-sensitivity"
VERSION = 1
PARTS = ("k", "v")
METRICS = ("kl", "attn_rel_err")

__all__ = ["FORMAT", "VERSION", "Sensitivity", "spec_template"]


def spec_template(spec: QuantSpec) -> dict[str, Any]:
    """A QuantSpec's fields without ``bits`` (the file's ``key_spec`` / ``value_spec``)."""
    return {k: v for k, v in spec.to_dict().items() if k != "bits"}


def _check_template(template: Any, name: str) -> None:
    try:
        QuantSpec.from_dict({**template, "bits": 4})
    except (TypeError, ValueError) as exc:
        raise KVTunerError(f"sensitivity settings.{name}: {exc}") from None


def _check_layer(entry: Any, index: int, bits: tuple[int, ...]) -> None:
    if not isinstance(entry, dict) or entry.get("layer") != index:
        raise KVTunerError(f"sensitivity layers must be listed in order; entry {index} is not")
    for part in PARTS:
        for b in bits:
            cell = entry.get(part, {}).get(str(b))
            if not isinstance(cell, dict) or set(cell) != set(METRICS):
                raise KVTunerError(f"sensitivity layer {index} {part}{b}: needs {METRICS}")
            for name in METRICS:
                value = cell[name]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise KVTunerError(f"sensitivity layer {index} {part}{b} {name} not a number")
                if not math.isfinite(value) or value < 0:
                    raise KVTunerError(f"sensitivity layer {index} {part}{b} {name} = {value}")


@dataclass(frozen=True)
class Sensitivity:
    model_id: str
    fingerprint: ModelFingerprint
    data: dict[str, Any]
    bits: tuple[int, ...]
    key_spec: dict[str, Any]
    value_spec: dict[str, Any]
    fp_ppl: float
    layers: tuple[dict[str, Any], ...]
    key_smoothing: str | None = None  # digest of the per-layer key λ the K variants used
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", tuple(self.bits))
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.bits or any(b not in QUANTIZED_BITS for b in self.bits):
            raise KVTunerError(f"sensitivity bits must be among {QUANTIZED_BITS}, got {self.bits}")
        _check_template(self.key_spec, "key_spec")
        _check_template(self.value_spec, "value_spec")
        if len(self.layers) != self.fingerprint.num_layers:
            raise KVTunerError(
                f"sensitivity has {len(self.layers)} layers, model fingerprint says "
                f"{self.fingerprint.num_layers}"
            )
        for i, entry in enumerate(self.layers):
            _check_layer(entry, i, self.bits)
        if not isinstance(self.fp_ppl, (int, float)) or not self.fp_ppl > 0:
            raise KVTunerError(f"sensitivity fp.ppl must be positive, got {self.fp_ppl!r}")

    def _cell(self, layer: int, part: str, bits: int) -> dict[str, float]:
        if part not in PARTS:
            raise KVTunerError(f"part must be 'k' or 'v', got {part!r}")
        if not 0 <= layer < len(self.layers):
            raise KVTunerError(f"layer {layer} out of range 0..{len(self.layers) - 1}")
        if bits not in self.bits:
            raise KVTunerError(f"bits {bits} not measured (have {', '.join(map(str, self.bits))})")
        return self.layers[layer][part][str(bits)]

    def kl(self, layer: int, part: str, bits: int) -> float:
        """KL(fp || only this tensor of this layer at ``bits``); 16 bits costs nothing."""
        return 0.0 if bits == 16 else float(self._cell(layer, part, bits)["kl"])

    def attn_rel_err(self, layer: int, part: str, bits: int) -> float:
        return 0.0 if bits == 16 else float(self._cell(layer, part, bits)["attn_rel_err"])

    def _smoothing_settings(self) -> dict[str, Any]:
        """The shape :meth:`SearchPreset.settings` gives a smoothed preset (cache matching)."""
        if self.key_smoothing is None:
            return {}
        return {"key_smoothing": {"digest": self.key_smoothing}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": {"id": self.model_id, "fingerprint": self.fingerprint.to_dict()},
            "data": dict(self.data),
            "settings": {
                "bits": list(self.bits),
                "key_spec": dict(self.key_spec),
                "value_spec": dict(self.value_spec),
                **self._smoothing_settings(),
            },
            "fp": {"ppl": self.fp_ppl},
            "layers": [dict(e) for e in self.layers],
            "created": self.created,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Sensitivity:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise KVTunerError(f"not a {FORMAT} file")
        if doc.get("version") != VERSION:
            raise KVTunerError(
                f"unsupported sensitivity version {doc.get('version')!r} "
                f"(this kvtuner reads {VERSION})"
            )
        try:
            model, settings = doc["model"], doc["settings"]
            return cls(
                model_id=model["id"],
                fingerprint=ModelFingerprint.from_dict(model["fingerprint"]),
                data=doc["data"],
                bits=tuple(settings["bits"]),
                key_spec=settings["key_spec"],
                value_spec=settings["value_spec"],
                fp_ppl=doc["fp"]["ppl"],
                layers=tuple(doc["layers"]),
                key_smoothing=(settings.get("key_smoothing") or {}).get("digest"),
                created=doc.get("created", ""),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise KVTunerError(f"sensitivity file is missing a field ({exc})") from None

    def save(self, path: str | os.PathLike) -> Path:
        write_json_atomic(path, self.to_dict())
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Sensitivity:
        return cls.from_dict(read_json(path, "sensitivity file"))
