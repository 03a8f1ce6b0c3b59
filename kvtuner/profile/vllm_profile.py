"""VllmProfile: a profile for vLLM's own KV formats (JSON; ``"target": "vllm"``).

It records the engine, the ``--kv-cache-dtype``, the skip set and the model it was searched on;
vLLM needs nothing else (no plugin). Kept apart from :class:`~.profile.Profile` (kvtuner's packed
per-layer specs), whose schema and hash stay as they are; :func:`is_vllm_profile` tells the two
apart. The hash covers the runtime part: target, dtype, skip set, scales, fingerprint.
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
from .engine_io import check_hash, check_same_model, producer, section
from .fingerprint import ModelFingerprint
from .io import read_json, write_json_atomic
from .vllm_plan import VllmPlan

VLLM_SCHEMA_VERSION = 1
VLLM_TESTED = "0.32.0"  # the vLLM whose source defines the formats and the page sizes
_TOP_LEVEL = {"target", "schema_version", "producer", "model", "vllm", "budget",
              "calibration", "metrics", "created", "hash"}  # fmt: skip
_VLLM_FIELDS = {"version", "kv_cache_dtype", "skip_layers", "model_dtype", "k_scale", "v_scale"}


@dataclass(frozen=True)
class VllmProfile:
    model_id: str
    fingerprint: ModelFingerprint
    plan: VllmPlan
    model_dtype: str = "bfloat16"
    budget: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=producer)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def __post_init__(self) -> None:
        if self.plan.num_layers != self.fingerprint.num_layers:
            raise KVTunerError(
                f"vLLM plan has {self.plan.num_layers} layers, the model "
                f"{self.fingerprint.num_layers}"
            )

    def vllm_dict(self) -> dict[str, Any]:
        p = self.plan
        out = {"version": VLLM_TESTED, "kv_cache_dtype": p.kv_cache_dtype,
               "skip_layers": list(p.skip_layers), "model_dtype": self.model_dtype}  # fmt: skip
        if (p.k_scale, p.v_scale) != (1.0, 1.0):
            out.update(k_scale=p.k_scale, v_scale=p.v_scale)
        return out

    @property
    def hash(self) -> str:
        fp = self.fingerprint.to_dict()
        del fp["dtype"]
        canon = {"target": "vllm", "fingerprint": fp, "vllm": self.vllm_dict()}
        text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def check_model(self, model: ModelFingerprint) -> None:
        """One line when ``model`` is not the model this profile was searched on."""
        names = ("architecture", "num_layers", "num_kv_heads", "head_dim", "layout")
        check_same_model(self.fingerprint, model, self.model_id, names, "profile")

    def to_dict(self) -> dict[str, Any]:
        model = {"id": self.model_id, "fingerprint": self.fingerprint.to_dict()}
        return {"target": "vllm", "schema_version": VLLM_SCHEMA_VERSION,
                "producer": dict(self.producer), "model": model, "vllm": self.vllm_dict(),
                "budget": dict(self.budget), "calibration": dict(self.calibration),
                "metrics": dict(self.metrics), "created": self.created,
                "hash": self.hash}  # fmt: skip


def is_vllm_profile(data: Any) -> bool:
    return isinstance(data, dict) and data.get("target") == "vllm"


def _section(data: dict, key: str) -> dict:
    return section(data, key, "vLLM profile")


def vllm_profile_from_dict(data: Any) -> VllmProfile:
    if not is_vllm_profile(data):
        raise KVTunerError('not a vLLM profile (needs "target": "vllm"; see docs/engines.md)')
    if data.get("schema_version") != VLLM_SCHEMA_VERSION:
        raise KVTunerError(
            f"unsupported vLLM profile schema_version {data.get('schema_version')!r}"
        )
    unknown = (set(data) - _TOP_LEVEL) | (set(_section(data, "vllm")) - _VLLM_FIELDS)
    if unknown:
        raise KVTunerError(f"unknown vLLM profile field(s): {', '.join(sorted(unknown))}")
    model, v = _section(data, "model"), _section(data, "vllm")
    fp = ModelFingerprint.from_dict(model.get("fingerprint"))
    if "kv_cache_dtype" not in v or not isinstance(v.get("skip_layers", []), list):
        raise KVTunerError("vLLM profile needs vllm.kv_cache_dtype and a vllm.skip_layers list")
    plan = VllmPlan(v["kv_cache_dtype"], fp.num_layers, tuple(v.get("skip_layers", [])),
                    v.get("k_scale", 1.0), v.get("v_scale", 1.0))  # fmt: skip
    profile = VllmProfile(str(model.get("id", "")), fp, plan, v.get("model_dtype", "bfloat16"),
                          _section(data, "budget"), _section(data, "calibration"),
                          _section(data, "metrics"), _section(data, "producer") or producer(),
                          str(data.get("created", "")))  # fmt: skip
    check_hash(data, profile.hash, "vLLM profile")
    return profile


def load_vllm_profile(path: str | os.PathLike) -> VllmProfile:
    return vllm_profile_from_dict(read_json(path, "profile"))


def save_vllm_profile(profile: VllmProfile, path: str | os.PathLike) -> Path:
    write_json_atomic(path, profile.to_dict())
    return Path(path)
