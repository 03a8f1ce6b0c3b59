"""Which profile the running server uses: ``--kvtuner-profile`` travels as an absolute path in
the environment, so every scheduler process (spawned, or on another node with the same flag)
finds it."""

from __future__ import annotations

import functools
import os
from typing import Any

from ....errors import KVTunerError
from ....profile import ModelFingerprint, Profile, load_profile

ENV_VAR = "KVTUNER_PROFILE"

__all__ = ["ENV_VAR", "activate", "active_profile", "active_profile_path"]


def activate(path: str | os.PathLike) -> str:
    """Make ``path`` (made absolute) the profile of this process and of its children."""
    absolute = os.path.abspath(os.fspath(path))
    if not os.path.isfile(absolute):
        raise KVTunerError(f"--kvtuner-profile: profile not found: {absolute}")
    os.environ[ENV_VAR] = absolute
    return absolute


def active_profile_path() -> str | None:
    return os.environ.get(ENV_VAR) or None


@functools.lru_cache(maxsize=4)
def _load(path: str) -> Profile:
    return load_profile(path)


def active_profile(model_config: Any = None) -> Profile | None:
    """The active profile (None when none is set), checked against ``model_config`` if given
    (a transformers config or a ModelFingerprint)."""
    path = active_profile_path()
    if path is None:
        return None
    profile = _load(path)
    if model_config is not None:
        fp = model_config
        if not isinstance(fp, ModelFingerprint):
            fp = ModelFingerprint.from_config(model_config)
        profile.check_model(fp)  # raises one line on a model mismatch
    return profile
