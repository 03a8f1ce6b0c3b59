"""Profile schema v1/v2/v3 (JSON): per-layer K/V specs (v3: key smoothing), provenance, canonical
hash."""

from .fingerprint import ModelFingerprint
from .io import load_profile, profile_from_dict, read_json, save_profile, write_json_atomic
from .profile import SCHEMA_VERSION, LayerSpec, Profile
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
