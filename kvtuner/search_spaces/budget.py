"""Budget: how much KV memory a profile may use, in KVTuner's nominal bits or bytes vs fp16.

``4bit`` / ``3.5bits``: average nominal bits ``Σ(k_bits + v_bits) / (2·L) ≤ N`` (scales and
zeros not counted — KVTuner's convention, so numbers compare). ``0.30x``: bytes per token
relative to fp16 K/V, scales and zeros included (the honest form). Arithmetic is exact
(:class:`fractions.Fraction`), so "fits" never depends on float rounding.

Hybrid models: with ``context_length`` set, each layer counts by the tokens it stores at that
context (a sliding-window layer at most ``window - 1``), both in bits (a weighted mean) and in
bytes (relative to fp16 of the same layout). Full-attention layers weigh 1, so a model without
window layers costs exactly what it did before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..errors import KVTunerError
from ..profile import LayerSpec, ModelFingerprint

__all__ = ["Budget", "layer_bytes"]

_BITS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*bits?\s*$", re.IGNORECASE)
_RATIO = re.compile(r"^\s*(\d*\.?\d+)\s*x\s*$", re.IGNORECASE)


def layer_bytes(spec: LayerSpec, fingerprint: ModelFingerprint) -> Fraction:
    """Exact K+V bytes per token of one layer, all KV heads, metadata included."""
    return spec.exact_bytes_per_token(fingerprint.num_kv_heads, fingerprint.head_dim)


@dataclass(frozen=True)
class Budget:
    """``kind`` is "bits" (value = nominal bits per element) or "ratio" (value = bytes / fp16)."""

    kind: str
    value: Fraction
    context_length: int | None = None  # tokens at which window layers are capped

    def __post_init__(self) -> None:
        n = self.context_length
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise KVTunerError(f"context length must be a positive int, got {n!r}")
        if self.kind not in ("bits", "ratio"):
            raise KVTunerError(f"budget kind must be 'bits' or 'ratio', got {self.kind!r}")
        object.__setattr__(self, "value", Fraction(self.value))
        if self.kind == "bits" and not 0 < self.value <= 16:
            raise KVTunerError(f"a bit budget must be in (0, 16] bits, got {float(self.value)}")
        if self.kind == "ratio" and not 0 < self.value <= 1:
            raise KVTunerError(f"a ratio budget must be in (0, 1] x fp16, got {float(self.value)}")

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``"4bit"``, ``"3.5bits"`` or ``"0.30x"``; anything else is a one-line error."""
        text = str(text)
        if m := _BITS.match(text):
            return cls("bits", Fraction(m.group(1)))
        if m := _RATIO.match(text):
            return cls("ratio", Fraction(m.group(1)))
        raise KVTunerError(
            f"cannot read budget {text!r}: use nominal bits like '4bit' / '3.5bits' "
            "or a fraction of fp16 bytes like '0.30x'"
        )

    @property
    def label(self) -> str:
        """Canonical text, also safe in file names: ``4bit``, ``2.5bit``, ``0.3x``."""
        number = f"{float(self.value):g}"
        return f"{number}bit" if self.kind == "bits" else f"{number}x"

    # -- exact accounting; the knapsack uses the same numbers --------------------------------
    def layer_cost(self, spec: LayerSpec, fingerprint: ModelFingerprint) -> Fraction:
        """What one layer spends: k_bits + v_bits (bits form) or its bytes per token (ratio),
        times the share of the context the layer stores."""
        weight = fingerprint.token_weights(self.context_length)[spec.layer]
        if self.kind == "bits":
            return Fraction(spec.k.bits + spec.v.bits) * weight
        return layer_bytes(spec, fingerprint) * weight

    def capacity(self, fingerprint: ModelFingerprint) -> Fraction:
        """The most the layer costs may add up to."""
        stored = sum(fingerprint.token_weights(self.context_length), Fraction(0))
        if self.kind == "bits":
            return self.value * 2 * stored
        return self.value * fingerprint.fp16_layer_bytes_per_token * stored

    def cost(self, specs: Sequence[LayerSpec], fingerprint: ModelFingerprint) -> Fraction:
        return sum((self.layer_cost(s, fingerprint) for s in specs), Fraction(0))

    def fits(self, specs: Sequence[LayerSpec], fingerprint: ModelFingerprint) -> bool:
        return self.cost(specs, fingerprint) <= self.capacity(fingerprint)

    def scaled(self, factor: Fraction | float) -> Budget:
        """The same kind of budget, ``factor`` times as large (DP seeds at smaller budgets)."""
        scaled = self.value * Fraction(factor).limit_denominator(10_000)
        return Budget(self.kind, scaled, self.context_length)

    def at_context(self, fingerprint: ModelFingerprint, context_length: int) -> Budget:
        """This budget stated at ``context_length`` when the model has window layers."""
        if fingerprint.layer_types is None:
            return self  # every layer stores every token: the context changes nothing
        return Budget(self.kind, self.value, context_length)

    def to_dict(self) -> dict:
        stated = {"asked": self.label, "kind": self.kind, "value": float(self.value)}
        if self.context_length is not None:
            stated["context_length"] = self.context_length
        return stated
