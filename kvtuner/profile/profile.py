"""Profile schema v1/v2/v3: per-layer K/V quant specs for one model, plus provenance and quality.

v2 differs from v1 only in allowing 3-, 5- and 6-bit codes; v3 adds per-layer key smoothing
factors (``k_smooth``, see :mod:`kvtuner.quant.smoothing`). A profile is written with the lowest
version that can hold its layers, so older readers keep reading every profile they can serve.

The runtime-relevant part (schema version, model fingerprint, layer specs) is what
:attr:`Profile.hash` covers; budget, calibration, metrics and timestamps are provenance.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from ..errors import KVTunerError
from ..quant.smoothing import KeySmoothing
from ..quant.spec import V1_BITS, QuantSpec
from .fingerprint import ModelFingerprint

SCHEMA_VERSION = 4  # the newest this kvtuner reads and writes
SCHEMA_VERSIONS = (1, 2, 3, 4)
PRODUCER_NAME = "kvtuner"


def _producer_version() -> str:
    from .._version import __version__

    return __version__


@dataclass(frozen=True)
class LayerSpec:
    """Key and value storage of one decoder layer; ``k_smooth``: calibrated key smoothing
    factors λ [kv_heads, head_dim] (quantized token-axis keys only; schema v3)."""

    layer: int
    k: QuantSpec
    v: QuantSpec
    k_smooth: KeySmoothing | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise KVTunerError(f"layer index must be a non-negative int, got {self.layer!r}")
        if self.v.pre_rope:
            raise KVTunerError(f"layer {self.layer}: pre_rope applies to keys only")
        if self.k_smooth is None:
            return
        if self.k.pre_rope:
            raise KVTunerError(f"layer {self.layer}: key smoothing and pre_rope do not combine")
        if not isinstance(self.k_smooth, KeySmoothing):
            raise KVTunerError(f"layer {self.layer}: k_smooth must be a KeySmoothing")
        if not self.k.is_quantized or self.k.axis != "token":
            raise KVTunerError(
                f"layer {self.layer}: key smoothing applies to quantized token-axis keys only "
                f"(k is {self.k.short()})"
            )

    def exact_bytes_per_token(self, num_kv_heads: int, head_dim: int) -> Fraction:
        """K plus V bytes this layer stores per token (all KV heads, metadata included)."""
        per_head = self.k.exact_bytes_per_token(head_dim) + self.v.exact_bytes_per_token(head_dim)
        return num_kv_heads * per_head

    def bytes_per_token(self, num_kv_heads: int, head_dim: int) -> float:
        return float(self.exact_bytes_per_token(num_kv_heads, head_dim))

    def _smooth_dict(self) -> dict[str, Any]:
        return {} if self.k_smooth is None else {"k_smooth": self.k_smooth.to_list()}

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "k": self.k.to_dict(), "v": self.v.to_dict(),
                **self._smooth_dict()}  # fmt: skip

    def runtime_dict(self) -> dict[str, Any]:
        """Like :meth:`to_dict`, but 16-bit specs reduced to their bits (nothing else applies)."""

        def canon(qs: QuantSpec) -> dict[str, Any]:
            return qs.to_dict() if qs.is_quantized else {"bits": 16}

        return {"layer": self.layer, "k": canon(self.k), "v": canon(self.v),
                **self._smooth_dict()}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerSpec:
        if not isinstance(data, dict) or not {"layer", "k", "v"} <= set(data):
            raise KVTunerError("each entry of 'layers' needs 'layer', 'k' and 'v'")
        unknown = set(data) - {"layer", "k", "v", "k_smooth"}
        if unknown:
            raise KVTunerError(f"unknown layer field(s): {', '.join(sorted(unknown))}")
        layer = data["layer"]
        try:
            smooth = data.get("k_smooth")
            smooth = None if smooth is None else KeySmoothing.from_list(smooth)
            k, v = QuantSpec.from_dict(data["k"]), QuantSpec.from_dict(data["v"])
            return cls(layer, k, v, smooth)
        except (TypeError, ValueError) as exc:
            raise KVTunerError(f"layer {layer}: {exc}") from None


def check_schema_version(version: Any, *, allow_none: bool = False) -> None:
    if version is None and allow_none:
        return
    newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
    if newer:
        raise KVTunerError(
            f"profile schema_version {version} is newer than this kvtuner reads "
            f"(versions {', '.join(map(str, SCHEMA_VERSIONS))}); upgrade kvtuner to load it"
        )
    if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
        raise KVTunerError(
            f"unsupported profile schema_version {version!r} "
            f"(this kvtuner reads versions {', '.join(map(str, SCHEMA_VERSIONS))})"
        )


def required_schema_version(layers: tuple[LayerSpec, ...]) -> int:
    """4 when a layer stores its keys pre-RoPE, else 3 when a layer smooths its keys, else
    1 when every K/V spec uses bits v1 knows (2/4/8/16), else 2."""
    if any(spec.k.pre_rope for spec in layers):
        return 4
    if any(spec.k_smooth is not None for spec in layers):
        return 3
    bits = {qs.bits for spec in layers for qs in (spec.k, spec.v)}
    return 1 if bits <= set(V1_BITS) else 2


_VERSION_HOLDS = {
    1: "bits 2/4/8/16 only",
    2: "no key smoothing (k_smooth)",
    3: "no pre-RoPE keys (pre_rope)",
}


@dataclass(frozen=True)
class Profile:
    model_id: str
    fingerprint: ModelFingerprint
    layers: tuple[LayerSpec, ...]
    budget: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    model_revision: str | None = None
    producer: dict[str, str] = field(
        default_factory=lambda: {"name": PRODUCER_NAME, "version": _producer_version()}
    )
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    schema_version: int | None = None  # None: the lowest version that holds these layers

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        check_schema_version(self.schema_version, allow_none=True)
        self._check_layers()
        needed = required_schema_version(self.layers)
        if self.schema_version is None:
            object.__setattr__(self, "schema_version", needed)
        elif self.schema_version < needed:
            raise KVTunerError(
                f"schema_version {self.schema_version} profiles hold "
                f"{_VERSION_HOLDS[self.schema_version]}; these layers need schema_version {needed}"
            )

    def _check_layers(self) -> None:
        fp = self.fingerprint
        indices = [spec.layer for spec in self.layers]
        if indices != list(range(fp.num_layers)):
            missing = sorted(set(range(fp.num_layers)) - set(indices))
            detail = f"missing {missing}" if missing else f"got {indices}"
            raise KVTunerError(
                f"profile must list layers 0..{fp.num_layers - 1} in order, once each ({detail})"
            )
        for spec in self.layers:
            for name, qs in (("k", spec.k), ("v", spec.v)):
                try:
                    qs.check_head_dim(fp.head_dim)
                except ValueError as exc:
                    raise KVTunerError(f"layer {spec.layer} {name}: {exc}") from None
            if spec.k_smooth is not None:
                try:
                    spec.k_smooth.check_shape(fp.num_kv_heads, fp.head_dim)
                except ValueError as exc:
                    raise KVTunerError(f"layer {spec.layer} k_smooth: {exc}") from None

    # -- memory accounting (row bytes are the single source of truth) --------------------------
    @property
    def context_length(self) -> int | None:
        """The context a hybrid model's budget was stated at (window layers capped there)."""
        n = self.budget.get("context_length")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def _weights(self) -> tuple[Fraction, ...]:
        return self.fingerprint.token_weights(self.context_length)

    def _layer_bytes(self) -> list[Fraction]:
        fp = self.fingerprint
        return [s.exact_bytes_per_token(fp.num_kv_heads, fp.head_dim) for s in self.layers]

    def kv_bytes(self, tokens: int) -> float:
        """K/V bytes stored after ``tokens`` tokens of one sequence (window layers capped)."""
        fp = self.fingerprint
        kept = [fp.kept_tokens(s.layer, tokens) for s in self.layers]
        return float(sum(b * n for b, n in zip(self._layer_bytes(), kept, strict=True)))

    @property
    def bytes_per_token(self) -> float:
        """Bytes per token of context (at :attr:`context_length` for a hybrid model)."""
        weights = self._weights()
        return float(sum(b * w for b, w in zip(self._layer_bytes(), weights, strict=True)))

    @property
    def fp16_bytes_per_token(self) -> float:
        """The same layout stored as fp16 (window layers capped alike)."""
        fp, n = self.fingerprint, self.context_length
        return fp.fp16_bytes_per_token if n is None else fp.fp16_bytes(n) / n

    @property
    def ratio_to_fp16(self) -> float:
        return self.bytes_per_token / self.fp16_bytes_per_token

    @property
    def nominal_bits(self) -> float:
        """KVTuner's convention: mean of k_bits and v_bits over layers (each layer weighted by
        the tokens it stores at :attr:`context_length`; all equal for full attention)."""
        weights = self._weights()
        bits = sum((s.k.bits + s.v.bits) * w for s, w in zip(self.layers, weights, strict=True))
        return float(bits / (2 * sum(weights)))

    @property
    def effective_bits(self) -> float:
        """Bits per stored element, scales and zeros included."""
        return 16.0 * self.ratio_to_fp16

    def with_accounting(self, **budget: Any) -> Profile:
        """Copy whose ``budget`` states nominal/effective bits and bytes per token."""
        asked = replace(self, budget={**self.budget, **budget})
        stated = {
            **asked.budget,
            "nominal_bits": round(asked.nominal_bits, 4),
            "effective_bits": round(asked.effective_bits, 4),
            "bytes_per_token": round(asked.bytes_per_token, 4),
            "ratio_to_fp16": round(asked.ratio_to_fp16, 4),
        }
        return replace(self, budget=stated)

    # -- identity --------------------------------------------------------------------------------
    def runtime_dict(self) -> dict[str, Any]:
        """The part a runtime needs; what the canonical hash covers."""
        fp = self.fingerprint.to_dict()
        del fp["dtype"]  # one profile serves the model in any dtype
        return {
            "schema_version": self.schema_version,
            "fingerprint": fp,
            "layers": [s.runtime_dict() for s in self.layers],
        }

    @property
    def hash(self) -> str:
        canon = json.dumps(self.runtime_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def check_model(self, model_fingerprint: ModelFingerprint) -> None:
        self.fingerprint.check_matches(model_fingerprint)

    def to_dict(self) -> dict[str, Any]:
        model = {
            "id": self.model_id,
            "revision": self.model_revision,
            "fingerprint": self.fingerprint.to_dict(),
        }
        return {
            "schema_version": self.schema_version,
            "producer": dict(self.producer),
            "model": model,
            "layers": [s.to_dict() for s in self.layers],
            "budget": dict(self.budget),
            "calibration": dict(self.calibration),
            "metrics": dict(self.metrics),
            "created": self.created,
            "hash": self.hash,
        }

    @classmethod
    def uniform(
        cls, model_id: str, fingerprint: ModelFingerprint, k: QuantSpec, v: QuantSpec, **kw: Any
    ) -> Profile:
        layers = tuple(LayerSpec(i, k, v) for i in range(fingerprint.num_layers))
        return cls(model_id, fingerprint, layers, **kw).with_accounting()
