"""ModelFingerprint: the shape facts a profile must agree with before a runtime loads it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import KVTunerError


@dataclass(frozen=True)
class ModelFingerprint:
    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KVTunerError(
                    f"model fingerprint: {name} must be a positive int, got {value!r}"
                )
        if not isinstance(self.architecture, str) or not self.architecture:
            raise KVTunerError("model fingerprint: architecture must be a non-empty string")

    @property
    def fp16_bytes_per_token(self) -> int:
        """K and V of every layer and KV head stored as fp16: the baseline of every ratio."""
        return self.num_layers * self.num_kv_heads * 2 * self.head_dim * 2

    @property
    def hash(self) -> str:
        """Stable hash of the shape facts (dtype excluded: a profile serves any dtype)."""
        facts = [self.architecture, self.num_layers, self.num_kv_heads, self.head_dim]
        return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hash": self.hash}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelFingerprint:
        if not isinstance(data, dict):
            raise KVTunerError("model fingerprint must be an object")
        fields = ("architecture", "num_layers", "num_kv_heads", "head_dim")
        missing = [f for f in fields if f not in data]
        if missing:
            raise KVTunerError(f"model fingerprint is missing {', '.join(missing)}")
        return cls(*(data[f] for f in fields), dtype=data.get("dtype", "float32"))

    @classmethod
    def from_config(cls, config: Any, dtype: str | None = None) -> ModelFingerprint:
        """From a transformers ``PretrainedConfig`` (multimodal configs: their text config)."""
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        archs = getattr(config, "architectures", None) or [config.model_type]
        dtype = dtype or str(getattr(config, "dtype", None) or "float32").replace("torch.", "")
        return cls(archs[0], config.num_hidden_layers, kv_heads, head_dim, dtype)

    def check_matches(self, other: ModelFingerprint) -> None:
        """Raise one clear line if ``other`` (the model) cannot run this (the profile's) specs."""
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise KVTunerError(
                    f"profile does not fit the model: {name} is {mine} in the profile but "
                    f"{theirs} in the model ({other.architecture})"
                )
