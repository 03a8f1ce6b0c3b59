"""``kvtuner.apply(model, profile)``: one call from a profile to what ``generate()`` needs."""

from __future__ import annotations

import os
from typing import Any

from ...errors import KVTunerError
from ...profile import Profile, load_profile
from .attention import use_kvtuner_attention
from .cache import KVTunerCache, make_cache

__all__ = ["apply"]


def _profile_of(profile: Profile | str | os.PathLike) -> Profile:
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, (str, os.PathLike)):
        return load_profile(profile)
    raise KVTunerError(f"apply needs a Profile or a profile path, got {type(profile).__name__}")


def apply(
    model: Any,
    profile: Profile | str | os.PathLike,
    *,
    residual_length: int = 0,
    keep_dequantized: bool = False,
    pack_chunk: int = 1,
    pack_reserve: int = 0,
    decode_kernel: str = "auto",
    max_cache_len: int | None = None,
) -> KVTunerCache:
    """Check ``profile`` (a :class:`~kvtuner.Profile` or a JSON path) fits the transformers
    ``model``, switch the model to ``attn_implementation="kvtuner"`` (sdpa, plus the fused
    decode kernel over packed rows on CUDA) and return a fresh packed cache for one
    ``generate()`` call: ``model.generate(ids, cache=cache)`` (``past_key_values=`` before
    transformers 5.24), like transformers' ``QuantizedCache``.

    The options are :func:`~.cache.make_cache`'s (``max_cache_len``: a static cache, whose
    decode step ``generate`` compiles on CUDA). ``decode_kernel="never"`` leaves the model's
    attention as it is. A profile that does not fit raises one :class:`KVTunerError` line and
    leaves the model untouched.
    """
    if not callable(getattr(model, "set_attn_implementation", None)):
        raise KVTunerError(f"apply needs a transformers model, got {type(model).__name__}")
    cache = make_cache(
        model,
        _profile_of(profile),
        residual_length=residual_length,
        keep_dequantized=keep_dequantized,
        pack_chunk=pack_chunk,
        pack_reserve=pack_reserve,
        decode_kernel=decode_kernel,
        max_cache_len=max_cache_len,
    )
    if decode_kernel != "never":
        use_kvtuner_attention(model)
    return cache
