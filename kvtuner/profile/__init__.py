"""Profile schema v1/v2/v3 (JSON): per-layer K/V specs (v3: key smoothing), provenance, canonical
hash."""

from .fingerprint import ModelFingerprint
from .io import load_profile, profile_from_dict, read_json, save_profile, write_json_atomic
from .profile import SCHEMA_VERSION, LayerSpec, Profile

__all__ = [
    "SCHEMA_VERSION",
    "LayerSpec",
    "ModelFingerprint",
    "Profile",
    "load_profile",
    "profile_from_dict",
    "read_json",
    "save_profile",
    "write_json_atomic",
]
