"""RecipeProfile: a per-layer KV recipe in the engines' own formats (JSON; ``"target": "recipe"``).

It records the engine it was searched for, a format per layer
(:data:`~kvtuner.quant.engine_recipe.LAYER_FORMATS`), the per-layer K/V amax the scales come
from, and the model. Exports (ModelOpt's ``hf_quant_config.json``, TensorRT-LLM's
``KvCacheConfig.dtype``, vLLM flags) are made from it by :mod:`kvtuner.runtime_loader.recipe`.
The hash covers the runtime part: target, engine, formats, amax, fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import KVTunerError
from ..quant.engine_recipe import ENGINE_FORMATS, EngineRecipe
from .engine_io import check_hash, check_same_model, producer, section
from .fingerprint import ModelFingerprint
from .io import read_json, write_json_atomic

__all__ = [
    "RECIPE_SCHEMA_VERSION",
    "RecipeProfile",
    "is_recipe_profile",
    "load_recipe_profile",
    "recipe_profile_from_dict",
    "save_recipe_profile",
]

RECIPE_SCHEMA_VERSION = 1
_TOP_LEVEL = {"target", "schema_version", "producer", "model", "engine", "recipe", "budget",
              "calibration", "metrics", "created", "hash"}  # fmt: skip


@dataclass(frozen=True)
class RecipeProfile:
    model_id: str
    fingerprint: ModelFingerprint
    engine: str
    recipe: EngineRecipe
    budget: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=producer)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_FORMATS:
            raise KVTunerError(
                f"unknown recipe engine {self.engine!r}; choose from {', '.join(ENGINE_FORMATS)}"
            )
        served = ENGINE_FORMATS[self.engine]
        bad = sorted({f for f in self.recipe.layers if f not in served})
        if bad:
            raise KVTunerError(f"{self.engine} does not serve {', '.join(bad)} per layer")
        if self.recipe.num_layers != self.fingerprint.num_layers:
            raise KVTunerError(
                f"recipe has {self.recipe.num_layers} layers, the model "
                f"{self.fingerprint.num_layers}"
            )

    def check_model(self, model: ModelFingerprint) -> None:
        """One line when ``model`` is not the model this recipe was searched on."""
        names = ("architecture", "num_layers", "num_kv_heads", "head_dim")
        check_same_model(self.fingerprint, model, self.model_id, names, "recipe")

    @property
    def effective_bits(self) -> float:
        return float(self.recipe.effective_bits(self.fingerprint.head_dim))

    @property
    def hash(self) -> str:
        fp = self.fingerprint.to_dict()
        del fp["dtype"]
        canon = {"target": "recipe", "fingerprint": fp, "engine": self.engine,
                 "recipe": self.recipe.to_dict()}  # fmt: skip
        text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        model = {"id": self.model_id, "fingerprint": self.fingerprint.to_dict()}
        return {"target": "recipe", "schema_version": RECIPE_SCHEMA_VERSION,
                "producer": dict(self.producer), "model": model, "engine": self.engine,
                "recipe": self.recipe.to_dict(), "budget": dict(self.budget),
                "calibration": dict(self.calibration), "metrics": dict(self.metrics),
                "created": self.created, "hash": self.hash}  # fmt: skip


def is_recipe_profile(data: Any) -> bool:
    return isinstance(data, dict) and data.get("target") == "recipe"


def _section(data: dict, key: str) -> dict:
    return section(data, key, "recipe profile")


def _recipe(section: dict) -> EngineRecipe:
    lists = [section.get(k) for k in ("layers", "k_amax", "v_amax")]
    if not all(isinstance(x, list) for x in lists):
        raise KVTunerError("recipe profile needs recipe.layers, recipe.k_amax and recipe.v_amax")
    try:
        return EngineRecipe(*lists)
    except (TypeError, ValueError) as exc:
        raise KVTunerError(f"bad recipe: {exc}") from None


def recipe_profile_from_dict(data: Any) -> RecipeProfile:
    if not is_recipe_profile(data):
        raise KVTunerError('not a recipe profile (needs "target": "recipe"; see docs/engines.md)')
    if data.get("schema_version") != RECIPE_SCHEMA_VERSION:
        version = data.get("schema_version")
        raise KVTunerError(f"unsupported recipe profile schema_version {version!r}")
    unknown = set(data) - _TOP_LEVEL
    if unknown:
        raise KVTunerError(f"unknown recipe profile field(s): {', '.join(sorted(unknown))}")
    model = _section(data, "model")
    profile = RecipeProfile(
        str(model.get("id", "")),
        ModelFingerprint.from_dict(model.get("fingerprint")),
        str(data.get("engine", "")),
        _recipe(_section(data, "recipe")),
        _section(data, "budget"),
        _section(data, "calibration"),
        _section(data, "metrics"),
        _section(data, "producer") or producer(),
        str(data.get("created", "")),
    )
    check_hash(data, profile.hash, "recipe profile")
    return profile


def load_recipe_profile(path: str | os.PathLike) -> RecipeProfile:
    return recipe_profile_from_dict(read_json(path, "profile"))


def save_recipe_profile(profile: RecipeProfile, path: str | os.PathLike) -> Path:
    write_json_atomic(path, profile.to_dict())
    return Path(path)
