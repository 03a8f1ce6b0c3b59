"""make_cache: a transformers ``Cache`` storing each layer's K/V packed with its own specs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers.cache_utils import Cache

from ...errors import KVTunerError
from ...profile import LayerSpec, ModelFingerprint, Profile
from .attention import DECODE_KERNEL_MODES, KernelDispatch
from .layer import KVTunerLayer
from .rope import KeyRope, key_rope_of
from .sliding_layer import KVTunerSlidingLayer
from .static_layer import KVTunerStaticLayer
from .stream import predicted_stream_nbytes

__all__ = ["KVTunerCache", "layer_specs_for", "make_cache"]


def _layer(
    spec: LayerSpec, fingerprint: ModelFingerprint, *, max_cache_len: int | None, **kw: Any
) -> KVTunerLayer | KVTunerStaticLayer:
    window = fingerprint.window_of(spec.layer)
    if max_cache_len is not None:
        return KVTunerStaticLayer(spec, fingerprint.head_dim, max_cache_len=max_cache_len,
                                  window=window, dispatch=kw["dispatch"])  # fmt: skip
    if window is None:
        return KVTunerLayer(spec, fingerprint.head_dim, **kw)
    return KVTunerSlidingLayer(spec, fingerprint.head_dim, sliding_window=window, **kw)


class KVTunerCache(Cache):
    """One :class:`KVTunerLayer` per decoder layer (:class:`KVTunerSlidingLayer` for a
    sliding-window layer; :class:`KVTunerStaticLayer` for every layer with ``max_cache_len``);
    pass it as ``past_key_values``."""

    def __init__(
        self,
        specs: Sequence[LayerSpec],
        fingerprint: ModelFingerprint,
        *,
        residual_length: int,
        keep_dequantized: bool,
        pack_chunk: int = 1,
        pack_reserve: int = 0,
        dispatch: KernelDispatch | None = None,
        ropes: Sequence[KeyRope | None] | None = None,
        max_cache_len: int | None = None,
    ):
        ropes = ropes or [None] * len(specs)
        kw = dict(
            residual_length=residual_length,
            keep_dequantized=keep_dequantized,
            pack_chunk=pack_chunk,
            pack_reserve=pack_reserve,
            dispatch=dispatch,
        )
        layers = [
            _layer(s, fingerprint, rope=r, max_cache_len=max_cache_len, **kw)
            for s, r in zip(specs, ropes, strict=True)
        ]
        super().__init__(layers=layers)
        self.specs = tuple(specs)
        self.fingerprint = fingerprint
        self.residual_length = residual_length
        self.pack_chunk = pack_chunk

    def nbytes(self) -> int:
        """KV bytes stored now: packed rows as stored, unpacked elements (16-bit layers, residual
        window, a still-filling channel block) accounted at 2 bytes each (fp16); a static cache:
        every slot it holds, written or not."""
        return sum(layer.nbytes() for layer in self.layers)

    def predicted_nbytes(self, tokens: int, batch: int = 1) -> int:
        """What :meth:`nbytes` must report after ``tokens`` tokens per sequence, from the specs
        (a sliding-window layer holds at most ``window - 1`` of them).

        With ``residual_length=0`` and block-aligned ``tokens`` this equals
        ``profile.kv_bytes(tokens) * batch``.
        """
        fp = self.fingerprint
        kw = dict(
            tokens=tokens,
            residual_length=self.residual_length,
            heads=fp.num_kv_heads,
            batch=batch,
            pack_chunk=self.pack_chunk,
        )
        return sum(
            predicted_stream_nbytes(qs, fp.head_dim, kept=fp.kept_tokens(s.layer, tokens), **kw)
            for s in self.specs
            for qs in (s.k, s.v)
        )

    def fp16_nbytes(self, tokens: int, batch: int = 1, *, capped: bool = True) -> int:
        """Bytes the same tokens take in an fp16 cache (the reference for memory ratios);
        ``capped=False``: a cache that stores every layer, window layers too, in full."""
        return self.fingerprint.fp16_bytes(tokens, capped=capped) * batch


def _check_window_specs(specs: Sequence[LayerSpec], fingerprint: ModelFingerprint) -> None:
    for s in specs:
        for name, q in (("k", s.k), ("v", s.v)):
            if fingerprint.window_of(s.layer) and q.is_quantized and q.axis == "channel":
                raise KVTunerError(
                    f"layer {s.layer} {name}: a sliding-window layer drops single tokens, which "
                    "channel-axis blocks cannot; use token-axis specs on window layers"
                )


_STATIC_OPTIONS = dict(residual_length=0, keep_dequantized=False, pack_chunk=1, pack_reserve=0)


def _check_static(max_cache_len: int, **options: int | bool) -> None:
    """A static cache's options: a positive length, every other option at its default (the
    layers refuse the specs their slots cannot store)."""
    if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1:
        raise KVTunerError(f"max_cache_len must be an int >= 1, got {max_cache_len!r}")
    if options != _STATIC_OPTIONS:
        raise KVTunerError(
            "a static cache (max_cache_len) quantizes every token as it comes: leave "
            "residual_length, keep_dequantized, pack_chunk and pack_reserve at their defaults"
        )


def layer_specs_for(
    model_or_config: Any, profile_or_layer_specs: Profile | Sequence[LayerSpec]
) -> tuple[tuple[LayerSpec, ...], ModelFingerprint]:
    """Validate a profile (or in-memory layer specs) against the model; one KVTunerError line."""
    config = getattr(model_or_config, "config", model_or_config)
    model_fp = ModelFingerprint.from_config(config)
    if isinstance(profile_or_layer_specs, Profile):
        profile_or_layer_specs.check_model(model_fp)
        return profile_or_layer_specs.layers, model_fp
    specs = tuple(profile_or_layer_specs)
    if not all(isinstance(s, LayerSpec) for s in specs):
        raise KVTunerError("make_cache needs a Profile or a sequence of LayerSpec")
    if [s.layer for s in specs] != list(range(model_fp.num_layers)):
        raise KVTunerError(
            f"layer specs do not fit the model: need layers 0..{model_fp.num_layers - 1} in "
            f"order, got {len(specs)} spec(s)"
        )
    for s in specs:
        for name, q in (("k", s.k), ("v", s.v)):
            try:
                q.check_head_dim(model_fp.head_dim)
            except ValueError as exc:
                raise KVTunerError(f"layer {s.layer} {name}: {exc}") from None
    return specs, model_fp


def make_cache(
    model: Any,
    profile_or_layer_specs: Profile | Sequence[LayerSpec],
    *,
    residual_length: int = 0,
    keep_dequantized: bool = False,
    pack_chunk: int = 1,
    pack_reserve: int = 0,
    decode_kernel: str = "auto",
    max_cache_len: int | None = None,
) -> KVTunerCache:
    """A packed per-layer K/V cache for ``model`` (``generate(past_key_values=...)`` or forward).

    residual_length: the newest tokens kept unquantized (KIVI-style). 0 = every token, prefill
        included, is quantized before attention reads it (the calibration / perplexity protocol).
    keep_dequantized: also keep a dequantized working copy of the packed history, so that each
        decode step dequantizes only the newly packed tokens (faster decode, but the working copy
        costs model-dtype memory; ``nbytes()`` counts the packed storage only). Results are
        identical either way.
    pack_chunk: token-axis tokens leave the residual window in chunks of this many (1 = exactly
        ``residual_length`` tokens stay unquantized). A chunk of e.g. 32 quantizes once every 32
        decode steps instead of every step; waiting tokens are read like the window (exact when
        ``residual_length=0``: they are read fake-quantized, identical to packed).
    pack_reserve: 0 (default) keeps every packed history exact-size, so memory held equals
        ``nbytes()``, but each pack copies the layer's whole history. N > 0 grows it in place
        with N rows (plus 1/8) of spare capacity: a decode step then writes only its new rows
        (GPU decode at long context), holding up to that much beyond ``nbytes()``.
    decode_kernel: when the model runs ``attn_implementation="kvtuner"`` (see
        :func:`~.attention.use_kvtuner_attention`), decode steps read the packed rows with the
        fused Triton kernel: ``"auto"`` on CUDA, ``"always"`` also on CPU (needs
        ``TRITON_INTERPRET=1``; tests), ``"never"``. Any other attention reads the dequantized
        history, as before.
    max_cache_len: a static cache (:class:`~.static_layer.KVTunerStaticLayer`): packed slots
        for this many tokens a request, allocated at the first update and never again, so that
        ``generate`` compiles its decode steps (CUDA graphs on a GPU) as it does a
        ``StaticCache``'s. Token-axis and 16-bit specs, keys after RoPE; every token quantized
        (the other options keep their defaults). A decode step under
        ``attn_implementation="kvtuner"`` reads the slots with the fused kernel where
        ``decode_kernel`` says, else with the kernel's torch reference.
    """
    for name, value, low in (
        ("residual_length", residual_length, 0),
        ("pack_chunk", pack_chunk, 1),
        ("pack_reserve", pack_reserve, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise KVTunerError(f"{name} must be an int >= {low}, got {value!r}")
    if decode_kernel not in DECODE_KERNEL_MODES:
        raise KVTunerError(
            f"decode_kernel must be one of {DECODE_KERNEL_MODES}, got {decode_kernel!r}"
        )
    config = getattr(model, "config", model)
    specs, model_fp = layer_specs_for(config, profile_or_layer_specs)
    _check_window_specs(specs, model_fp)
    if max_cache_len is not None:
        _check_static(max_cache_len, residual_length=residual_length, pack_chunk=pack_chunk,
                      keep_dequantized=keep_dequantized, pack_reserve=pack_reserve)  # fmt: skip
    return KVTunerCache(
        specs,
        model_fp,
        residual_length=residual_length,
        keep_dequantized=keep_dequantized,
        pack_chunk=pack_chunk,
        pack_reserve=pack_reserve,
        dispatch=KernelDispatch(decode_kernel, config),
        ropes=[key_rope_of(model, s.layer) if s.k.pre_rope else None for s in specs],
        max_cache_len=max_cache_len,
    )
