"""A vLLM profile as vLLM's own arguments: ``vllm.LLM(**engine_kwargs(p))``, ``vllm serve``."""

from __future__ import annotations

import os
from typing import Any

from ...profile import ModelFingerprint, VllmProfile, load_vllm_profile


def _profile(profile: VllmProfile | str | os.PathLike) -> VllmProfile:
    return profile if isinstance(profile, VllmProfile) else load_vllm_profile(profile)


def check_model_dir(profile: VllmProfile, model: str | os.PathLike) -> None:
    """Refuse (one KVTunerError line) a profile searched on another model than ``model`` (an HF
    folder or hub id whose config transformers can read offline)."""
    from ...models import model_fingerprint

    profile.check_model(model_fingerprint(str(model)))


def engine_kwargs(
    profile: VllmProfile | str | os.PathLike, *, model: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(model=..., **kwargs)``: the dtype the profile was sized
    for, ``kv_cache_dtype`` and ``kv_cache_dtype_skip_layers``. With ``model``, first check the
    profile was made for it."""
    p = _profile(profile)
    if model is not None:
        check_model_dir(p, model)
    return {"dtype": p.model_dtype, **p.plan.engine_kwargs()}


def vllm_args(profile: VllmProfile | str | os.PathLike) -> list[str]:
    """The same as ``vllm serve`` flags (``--dtype ... --kv-cache-dtype ...``)."""
    p = _profile(profile)
    return ["--dtype", p.model_dtype, *p.plan.cli_args()]


def serve_argv(profile: VllmProfile | str | os.PathLike, model: str, extra=()) -> list[str]:
    """``vllm serve MODEL <profile flags> <extra>`` after checking the profile fits MODEL."""
    p = _profile(profile)
    check_model_dir(p, model)
    return ["vllm", "serve", str(model), *vllm_args(p), *extra]


__all__ = ["ModelFingerprint", "check_model_dir", "engine_kwargs", "serve_argv", "vllm_args"]
