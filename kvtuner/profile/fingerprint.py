"""ModelFingerprint: the shape facts a profile must agree with before a runtime loads it.

Hybrid models (Gemma 2/3, Mistral, Qwen with ``use_sliding_window``) also record each layer's
attention type and the window. A sliding-window layer keeps at most ``window - 1`` past tokens
(transformers' convention: the new token completes the window), so its bytes weigh less in a
budget at long context. A model whose layers are all full attention records neither, so its
fingerprint, and the hash of every profile made before, stay what they were.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from ..errors import KVTunerError

FULL, SLIDING = "full_attention", "sliding_attention"
ATTENTION_TYPES = (FULL, SLIDING)


@dataclass(frozen=True)
class ModelFingerprint:
    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"
    layer_types: tuple[str, ...] | None = None  # None: every layer full attention
    sliding_window: int | None = None  # tokens a sliding layer's query sees, itself included

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KVTunerError(
                    f"model fingerprint: {name} must be a positive int, got {value!r}"
                )
        if not isinstance(self.architecture, str) or not self.architecture:
            raise KVTunerError("model fingerprint: architecture must be a non-empty string")
        self._check_layout()

    def _check_layout(self) -> None:
        types = self.layer_types
        if types is not None:
            types = tuple(types)
            if len(types) != self.num_layers or not set(types) <= set(ATTENTION_TYPES):
                raise KVTunerError(
                    f"model fingerprint: layer_types must list {self.num_layers} of "
                    f"{', '.join(ATTENTION_TYPES)}, got {list(types)!r}"
                )
            object.__setattr__(self, "layer_types", None if set(types) == {FULL} else types)
        window = self.sliding_window
        if self.layer_types is None:
            object.__setattr__(self, "sliding_window", None)
        elif isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise KVTunerError(
                f"model fingerprint: sliding layers need a sliding_window int >= 2, got {window!r}"
            )

    # -- attention layout ---------------------------------------------------------------------
    def window_of(self, layer: int) -> int | None:
        """The layer's window, or None for a full-attention layer."""
        is_sliding = self.layer_types is not None and self.layer_types[layer] == SLIDING
        return self.sliding_window if is_sliding else None

    def kept_tokens(self, layer: int, tokens: int) -> int:
        """Tokens the layer's cache holds after ``tokens`` tokens: capped at window - 1."""
        window = self.window_of(layer)
        return tokens if window is None else min(tokens, window - 1)

    def token_weights(self, context_length: int | None) -> tuple[Fraction, ...]:
        """Per layer, stored tokens / context length (1 for full layers; all 1 when None)."""
        if context_length is None:
            return (Fraction(1),) * self.num_layers
        return tuple(
            Fraction(self.kept_tokens(layer, context_length), context_length)
            for layer in range(self.num_layers)
        )

    @property
    def layout(self) -> str:
        """One line: ``all full attention`` or ``SSSSSF... (S: sliding window 512, F: full)``."""
        if self.layer_types is None:
            return "all full attention"
        letters = "".join("S" if t == SLIDING else "F" for t in self.layer_types)
        return f"{letters} (S: sliding window {self.sliding_window}, F: full)"

    # -- accounting and identity ------------------------------------------------------------
    @property
    def fp16_layer_bytes_per_token(self) -> int:
        """K and V of one layer, every KV head, as fp16."""
        return self.num_kv_heads * 2 * self.head_dim * 2

    @property
    def fp16_bytes_per_token(self) -> int:
        """K and V of every layer and KV head stored as fp16: the baseline of every ratio."""
        return self.num_layers * self.fp16_layer_bytes_per_token

    def fp16_bytes(self, tokens: int, *, capped: bool = True) -> int:
        """fp16 K/V bytes after ``tokens`` tokens; ``capped=False``: every layer in full."""
        if not capped:
            return self.fp16_bytes_per_token * tokens
        kept = sum(self.kept_tokens(layer, tokens) for layer in range(self.num_layers))
        return self.fp16_layer_bytes_per_token * kept

    @property
    def hash(self) -> str:
        """Stable hash of the shape facts (dtype excluded: a profile serves any dtype)."""
        facts: list[Any] = [self.architecture, self.num_layers, self.num_kv_heads, self.head_dim]
        if self.layer_types is not None:
            facts += [list(self.layer_types), self.sliding_window]
        return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.layer_types is None:
            del data["layer_types"], data["sliding_window"]
        else:
            data["layer_types"] = list(self.layer_types)
        return {**data, "hash": self.hash}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelFingerprint:
        if not isinstance(data, dict):
            raise KVTunerError("model fingerprint must be an object")
        fields = ("architecture", "num_layers", "num_kv_heads", "head_dim")
        missing = [f for f in fields if f not in data]
        if missing:
            raise KVTunerError(f"model fingerprint is missing {', '.join(missing)}")
        types = data.get("layer_types")
        if types is not None and not isinstance(types, list):
            raise KVTunerError("model fingerprint: layer_types must be a list")
        return cls(
            *(data[f] for f in fields),
            dtype=data.get("dtype", "float32"),
            layer_types=None if types is None else tuple(types),
            sliding_window=data.get("sliding_window"),
        )

    @classmethod
    def from_config(cls, config: Any, dtype: str | None = None) -> ModelFingerprint:
        """From a transformers ``PretrainedConfig`` (multimodal configs: their text config)."""
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        archs = getattr(config, "architectures", None) or [config.model_type]
        dtype = dtype or str(getattr(config, "dtype", None) or "float32").replace("torch.", "")
        types, window = _attention_layout(config)
        return cls(archs[0], config.num_hidden_layers, kv_heads, head_dim, dtype, types, window)

    def check_matches(self, other: ModelFingerprint) -> None:
        """Raise one clear line if ``other`` (the model) cannot run this (the profile's) specs."""
        for name in ("num_layers", "num_kv_heads", "head_dim", "layout"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise KVTunerError(
                    f"profile does not fit the model: {name} is {mine} in the profile but "
                    f"{theirs} in the model ({other.architecture})"
                )


def _attention_layout(config: Any) -> tuple[tuple[str, ...], int | None]:
    """Per-layer attention types as transformers' caches see them, and the one shared window."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, kwargs = get_layer_types_and_kwargs(config)
    if isinstance(kwargs, dict):  # transformers before 5.2x: one dict for every layer
        kwargs = [kwargs]
    unknown = sorted(set(types) - set(ATTENTION_TYPES))
    if unknown:
        raise KVTunerError(
            f"kvtuner supports full and sliding-window attention layers; the model has {unknown}"
        )
    windows = {kw["sliding_window"] for kw in kwargs if "sliding_window" in kw}
    if len(windows) > 1:
        raise KVTunerError(
            f"sliding layers with different windows {sorted(windows)} are not supported"
        )
    return tuple(types), (windows.pop() if windows else None)
