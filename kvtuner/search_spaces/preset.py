"""Search presets: how a (k_bits, v_bits) pair becomes the two QuantSpecs of a layer.

``per-token``: token axis for both, keys Hadamard-rotated, group 32, asymmetric — what the
SGLang pool quantizes at write time. ``per-token-g64``: the same with groups of 64 (half the
scale/zero bytes: 4.5 instead of 5 effective bits at 4 bits, for serving capacity; more loss).
``kivi``: channel-axis keys (groups of 32 tokens), token-axis values group 32 (SGLang serves it
with ``--page-size 32``).
``kivi-hadv``: ``kivi`` with Hadamard-rotated values (on SmolLM2 its searched profiles beat
``kivi``'s on held-out KL at 3 and 2.5 bits, not at 4: see docs/results/search.md).
``per-token-smooth``: token axis for both, group 32, keys divided by calibrated per-channel
smoothing factors λ (schema v3 profiles; servable by a write-time pool).
``kivi-prerope`` / ``kivi-prerope-hadv``: ``kivi`` / ``kivi-hadv`` with keys stored before
RoPE (``pre_rope``, schema v4 profiles; SGLang with ``--page-size 32``): on SmolLM2 uniform
K3/K4 channel keys lose 18–23 % less KL.
``kivi-prerope-g64``: ``kivi-prerope`` with groups of 64 (64 tokens per key scale, 64 values per
value scale; SGLang with ``--page-size 64``): half the scale/zero bytes, spent on wider codes
when the budget is given in bytes (``0.25x``): on Qwen2.5-0.5B uniform K4V3 in groups of 64
measures +1.44 % perplexity on the 32 test windows against +2.68 % for K3V3 in groups of 32, at
the same 3072 bytes per token (docs/results/qwen25.md).
``per-token-head`` / ``per-token-head-had``: token axis for both, one fp16 scale and zero per
token-head (the group is the model's head_dim, resolved by :meth:`SearchPreset.for_head_dim`),
without and with Hadamard-rotated keys and values (vLLM's ``int4_per_token_head`` and
TurboQuant's shape): the fewest metadata bytes (4 per row: at head_dim 128, 4.25 bits an element
at 4 bits against g32's 5), and the decode kernel's cheapest read (scale and zero after the dot).
A user JSON file gives ``{"name", "key", "value"}`` where key/value are QuantSpec fields without
``bits``, plus optionally ``"smooth_alpha"`` (key smoothing, α in (0, 1]). Bits 16 always mean
"leave alone" (fp16).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import KVTunerError
from ..profile import LayerSpec, read_json
from ..quant.smoothing import KeySmoothing
from ..quant.spec import QuantSpec

__all__ = ["PRESETS", "SearchPreset", "load_preset", "smoothing_digest"]

_UNQUANTIZED = QuantSpec(16)


def smoothing_digest(smoothing: Sequence[KeySmoothing]) -> str:
    """A short hash of every layer's λ (sweep cache keys, sensitivity and preset settings)."""
    canon = json.dumps([s.to_list() for s in smoothing], separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SearchPreset:
    """Templates for key and value specs; their ``bits`` field is replaced per candidate.

    smooth_alpha: keys are smoothed (λ = quantile(|k|)^α per layer, head and channel); the
    search calibrates λ on its calibration tokens (:meth:`with_smoothing`) before measuring.
    """

    name: str
    key: QuantSpec
    value: QuantSpec
    servable_by_sglang: bool  # at any --page-size: token-axis sides, keys after RoPE
    smooth_alpha: float | None = None
    smoothing: tuple[KeySmoothing, ...] | None = None  # per layer, once calibrated
    group_per_head: bool = False  # templates' group: the model's head_dim (for_head_dim)

    def __post_init__(self) -> None:
        if not self.name:
            raise KVTunerError("a search preset needs a name")
        alpha = self.smooth_alpha
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                                  or not 0 < alpha <= 1):  # fmt: skip
            raise KVTunerError(f"smooth_alpha must be a number in (0, 1], got {alpha!r}")
        if alpha is not None and self.key.axis != "token":
            raise KVTunerError("key smoothing needs token-axis keys")
        if self.smoothing is not None and alpha is None:
            raise KVTunerError("smoothing factors need a preset with smooth_alpha")

    def for_head_dim(self, head_dim: int) -> SearchPreset:
        """This preset at a model's head_dim: a per-head preset's templates take ``group_size
        = head_dim`` (one scale and zero per token-head); any other preset is returned as is."""
        if not self.group_per_head:
            return self
        key, value = (replace(t, group_size=head_dim) for t in (self.key, self.value))
        return replace(self, key=key, value=value)

    def with_smoothing(self, smoothing: tuple[KeySmoothing, ...]) -> SearchPreset:
        """This preset with calibrated per-layer λ: every quantized key gets its layer's λ."""
        return replace(self, smoothing=tuple(smoothing))

    def spec(self, template: QuantSpec, bits: int) -> QuantSpec:
        return _UNQUANTIZED if bits == 16 else replace(template, bits=bits)

    def layer_spec(self, layer: int, k_bits: int, v_bits: int) -> LayerSpec:
        k = self.spec(self.key, k_bits)
        lam = self.smoothing[layer] if self.smoothing and k.is_quantized else None
        return LayerSpec(layer, k, self.spec(self.value, v_bits), lam)

    def settings(self) -> dict[str, Any]:
        """Key/value templates without bits (the sensitivity file's ``settings`` shape), plus
        the digest of the calibrated λ when keys are smoothed."""
        drop = lambda s: {k: v for k, v in s.to_dict().items() if k != "bits"}  # noqa: E731
        out = {"key_spec": drop(self.key), "value_spec": drop(self.value)}
        if self.smoothing is not None:
            out["key_smoothing"] = {"digest": smoothing_digest(self.smoothing)}
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, **self.settings(), "servable_by_sglang": self.servable_by_sglang}
        if self.smooth_alpha is not None:
            out["smooth_alpha"] = self.smooth_alpha
        return out


PRESETS = {
    "per-token": SearchPreset(
        "per-token", QuantSpec(4, 32, rotation="hadamard"), QuantSpec(4, 32), True
    ),
    "per-token-g64": SearchPreset(
        "per-token-g64", QuantSpec(4, 64, rotation="hadamard"), QuantSpec(4, 64), True
    ),
    "per-token-head": SearchPreset(
        "per-token-head", QuantSpec(4, 128), QuantSpec(4, 128), True, group_per_head=True
    ),
    "per-token-head-had": SearchPreset(
        "per-token-head-had",
        QuantSpec(4, 128, rotation="hadamard"),
        QuantSpec(4, 128, rotation="hadamard"),
        True,
        group_per_head=True,
    ),
    "per-token-smooth": SearchPreset(
        "per-token-smooth", QuantSpec(4, 32), QuantSpec(4, 32), True, smooth_alpha=0.5
    ),
    "kivi": SearchPreset("kivi", QuantSpec(4, 32, axis="channel"), QuantSpec(4, 32), False),
    "kivi-hadv": SearchPreset(
        "kivi-hadv", QuantSpec(4, 32, axis="channel"), QuantSpec(4, 32, rotation="hadamard"), False
    ),
    "kivi-prerope": SearchPreset(
        "kivi-prerope", QuantSpec(4, 32, axis="channel", pre_rope=True), QuantSpec(4, 32), False
    ),
    "kivi-prerope-g64": SearchPreset(
        "kivi-prerope-g64", QuantSpec(4, 64, axis="channel", pre_rope=True), QuantSpec(4, 64), False
    ),
    "kivi-prerope-hadv": SearchPreset(
        "kivi-prerope-hadv",
        QuantSpec(4, 32, axis="channel", pre_rope=True),
        QuantSpec(4, 32, rotation="hadamard"),
        False,
    ),
}


def load_preset(name_or_path: str | os.PathLike) -> SearchPreset:
    """A named preset, or a JSON file ``{"name": ..., "key": {...}, "value": {...}}``."""
    if str(name_or_path) in PRESETS:
        return PRESETS[str(name_or_path)]
    path = Path(name_or_path)
    if path.suffix != ".json" and not path.exists():
        raise KVTunerError(
            f"unknown preset {str(name_or_path)!r}: use {' / '.join(PRESETS)} or a JSON file"
        )
    data = read_json(path, "preset file")
    if not isinstance(data, dict) or not {"key", "value"} <= set(data):
        raise KVTunerError(f"preset file {path} needs 'key' and 'value' objects")
    key, value = (_template(data[part], part, path) for part in ("key", "value"))
    servable = key.axis == "token" and value.axis == "token" and not key.pre_rope
    name, alpha = str(data.get("name", path.stem)), data.get("smooth_alpha")
    return SearchPreset(name, key, value, servable, smooth_alpha=alpha)


def _template(data: Any, part: str, path: Path) -> QuantSpec:
    if not isinstance(data, dict):
        raise KVTunerError(f"preset file {path}: '{part}' must be an object")
    try:
        return QuantSpec.from_dict({**data, "bits": 4})
    except (TypeError, ValueError) as exc:
        raise KVTunerError(f"preset file {path}: '{part}': {exc}") from None
