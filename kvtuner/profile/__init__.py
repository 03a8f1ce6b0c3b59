"""Profile schemas (JSON), each with provenance and a canonical hash: kvtuner's packed per-layer
K/V specs (v1/v2/v3, v3: key smoothing), vLLM plans (``"target": "vllm"``: one
``--kv-cache-dtype`` and its skip layers) and engine recipes (``"target": "recipe"``);
:mod:`.index` builds ``exported_configs/index.*``."""

from .fingerprint import ModelFingerprint
from .io import load_profile, profile_from_dict, read_json, save_profile, write_json_atomic
from .profile import SCHEMA_VERSION, LayerSpec, Profile
from .vllm_plan import VllmPlan
from .vllm_profile import (
    VllmProfile,
    is_vllm_profile,
    load_vllm_profile,
    save_vllm_profile,
    vllm_profile_from_dict,
)

__all__ = [
    "SCHEMA_VERSION",
    "LayerSpec",
    "ModelFingerprint",
    "Profile",
    "VllmPlan",
    "VllmProfile",
    "is_vllm_profile",
    "load_vllm_profile",
    "save_vllm_profile",
    "vllm_profile_from_dict",
    "load_profile",
    "profile_from_dict",
    "read_json",
    "save_profile",
    "write_json_atomic",
]
