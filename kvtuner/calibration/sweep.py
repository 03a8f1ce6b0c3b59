"""`calibrate()`: the per-layer K/V sensitivity sweep, cached on disk layer by layer.

Cost: one fp forward, one fp layer-forward per layer (carrying the fp activations up, so memory
holds one layer's worth), then for layer l the 2*len(bits) variants each run layer l alone and
run together through layers l+1..L-1, norm and lm_head: 2*len(bits)*(L-l) layer-forwards per
layer instead of 2*len(bits)*L for full forwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import KVTunerError
from ..models import fingerprint_of
from ..placement import placement_of
from ..profile import LayerSpec
from ..quant import QUANTIZED_BITS, KeySmoothing, QuantSpec
from ..search_spaces.losses import DEFAULT_BITS
from ..search_spaces.preset import smoothing_digest
from .batches import CalibrationData
from .runner import FpActivations, advance_to, capture_fp, run_layer_variants
from .sensitivity import PARTS, Sensitivity, spec_template
from .sweep_cache import SideCache, default_cache_dir, weights_digest

PER_TOKEN_KEY = QuantSpec(4, 32, rotation="hadamard")  # the `per-token` search preset
PER_TOKEN_VALUE = QuantSpec(4, 32)
_FP16 = QuantSpec(16)

__all__ = ["DEFAULT_BITS", "calibrate", "layer_forwards", "measure_layer"]


def layer_forwards(num_layers: int, num_bits: int) -> int:
    """Decoder-layer forwards of a full sweep (on the calibration tokens), fp passes included."""
    variants = 2 * num_bits
    return 2 * num_layers + sum(variants * (num_layers - li) for li in range(num_layers))


def _variants(layer, bits, key: QuantSpec, value: QuantSpec, smoothing=None, parts=PARTS):
    lam = None if smoothing is None else smoothing[layer]
    ks = [LayerSpec(layer, replace(key, bits=b), _FP16, lam) for b in bits]
    vs = [LayerSpec(layer, _FP16, replace(value, bits=b)) for b in bits]
    return (ks if "k" in parts else []) + (vs if "v" in parts else [])


def measure_layer(
    model, fp: FpActivations, layer, bits, key, value, smoothing=None, parts=PARTS
) -> dict:
    """One layer's entry of the sensitivity file: {"layer", "k": {bits: {...}}, "v": ...},
    each tensor of this layer alone at each of ``bits`` (``key``/``value``: spec templates;
    ``smoothing``: per-layer key λ or None; ``parts``: the halves to measure). Moves ``fp`` up
    to ``layer`` first (layers are measured bottom-up)."""
    advance_to(model, fp, layer)
    variants = _variants(layer, bits, key, value, smoothing, parts)
    sums = [[0.0, 0.0, 0.0] for _ in variants]
    for c in range(len(fp.chunks)):
        for acc, r in zip(sums, run_layer_variants(model, fp, c, variants), strict=True):
            acc[0] += r.kl_sum
            acc[1] += r.err_sq
            acc[2] += r.ref_sq
    positions = fp.reference.tokens.numel()
    measured = [p for p in PARTS if p in parts]  # the variants' order: keys, then values
    entry = {"layer": layer, **{part: {} for part in measured}}
    for i, (kl, err, ref) in enumerate(sums):
        part, b = measured[i // len(bits)], bits[i % len(bits)]
        rel = math.sqrt(err / ref) if ref > 0 else 0.0
        entry[part][str(b)] = {"kl": max(0.0, kl / positions), "attn_rel_err": rel}
    return entry


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total, disable=not enabled, desc="calibrate", unit="layer-fwd", dynamic_ncols=True
    )


def _caches_for(model, data, bits, key, value, smoothing, cache_dir) -> dict[str, SideCache]:
    """One cache per half: K results depend on the key spec (and λ), V results on the value
    spec, so presets sharing either spec share that half."""
    root = default_cache_dir() if cache_dir is None else Path(cache_dir)
    common = {
        "fingerprint": fingerprint_of(model).to_dict(),
        "weights": weights_digest(model),
        "tokens": data.token_hash,
        "shape": list(data.tokens.shape),
        "bits": list(bits),
    }
    k_common = (
        common if smoothing is None else {**common, "key_smoothing": smoothing_digest(smoothing)}
    )
    return {
        "k": SideCache(root, k_common, "k", spec_template(key)),
        "v": SideCache(root, common, "v", spec_template(value)),
    }


def _check_specs(model, bits, key: QuantSpec, value: QuantSpec) -> None:
    head_dim = fingerprint_of(model).head_dim
    if not bits or any(b not in QUANTIZED_BITS for b in bits):
        raise KVTunerError(f"bits must be among {QUANTIZED_BITS}, got {tuple(bits)}")
    for name, spec in (("key", key), ("value", value)):
        try:
            replace(spec, bits=bits[0]).check_head_dim(head_dim)
        except ValueError as exc:
            raise KVTunerError(f"{name} spec: {exc}") from None


def _sweep(model, fp, todo, bits, specs, caches, progress) -> dict[int, dict]:
    """Measure the halves ``todo`` ({layer: parts}), persisting each as soon as it is done."""
    num_layers, out = len(fp.kwargs[0]), {}
    work = {li: len(parts) * len(bits) * (num_layers - li) for li, parts in todo.items()}
    with _progress(sum(work.values()), progress) as bar:
        for li, parts in todo.items():
            out[li] = measure_layer(model, fp, li, bits, *specs, parts=parts)
            for part in parts if caches else ():
                caches[part].put_layer(li, out[li][part])
            bar.update(work[li])
    return out


def _cached(caches, num_layers: int) -> tuple[dict[int, dict], dict[int, tuple[str, ...]]]:
    """Entries read back from the half caches, and the halves still to measure per layer."""
    entries, todo = {li: {"layer": li} for li in range(num_layers)}, {}
    for li in range(num_layers):
        for part in PARTS:
            half = caches[part].layer(li) if caches else None
            if half is None:
                todo[li] = (*todo.get(li, ()), part)
            else:
                entries[li][part] = half
    return entries, todo


def _fp_ppl(caches) -> float | None:
    return next((p for c in (caches or {}).values() if (p := c.fp_ppl()) is not None), None)


def calibrate(
    model,
    data: CalibrationData,
    *,
    model_id: str,
    bits: Sequence[int] = DEFAULT_BITS,
    key_spec: QuantSpec = PER_TOKEN_KEY,
    value_spec: QuantSpec = PER_TOKEN_VALUE,
    key_smoothing: Sequence[KeySmoothing] | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    progress: bool = True,
    batch_size: int | None = None,
) -> Sensitivity:
    """Per-layer K and V sensitivity of ``model`` on ``data`` (``key_spec``/``value_spec``
    give axis, group, symmetry and rotation; their ``bits`` is ignored). ``key_smoothing``:
    one calibrated λ per layer, applied to every quantized key variant (token axis).

    cache_dir: where per-layer results persist (None: ``$KVTUNER_CACHE_DIR`` or
        ``~/.cache/kvtuner``); ``use_cache=False`` measures everything and stores nothing.
        With the cache a re-run is instant and an interrupted run resumes; K and V halves are
        cached apart, so a preset sharing a spec with an earlier one measures only the other.
    batch_size: calibration windows per forward (None: as many as keep one forward's fp32
        logits under 256 MiB). The sweep runs on the model's device, in its dtype, holding
        the model plus one layer's activations; the file records that device and dtype.
    """
    bits = tuple(sorted(set(bits)))
    _check_specs(model, bits, key_spec, value_spec)
    if key_smoothing is not None:
        key_smoothing = tuple(key_smoothing)
    specs = (key_spec, value_spec, key_smoothing)
    caches = _caches_for(model, data, bits, *specs, cache_dir) if use_cache else None
    num_layers = fingerprint_of(model).num_layers
    entries, todo = _cached(caches, num_layers)
    fp_ppl = _fp_ppl(caches)
    if todo or fp_ppl is None:  # a full cache hit runs no forward pass at all
        fp = capture_fp(model, data.tokens, batch_size=batch_size)
        fp_ppl = fp.reference.ppl
        for cache in (caches or {}).values():
            cache.put_fp_ppl(fp_ppl)
        for li, measured in _sweep(model, fp, todo, bits, specs, caches, progress).items():
            entries[li].update(measured)
    return Sensitivity(
        model_id=model_id,
        fingerprint=fingerprint_of(model),
        data={**data.describe(), **placement_of(model).describe()},
        bits=bits,
        key_spec=spec_template(key_spec),
        value_spec=spec_template(value_spec),
        key_smoothing=None if key_smoothing is None else smoothing_digest(key_smoothing),
        fp_ppl=fp_ppl,
        layers=tuple(entries[li] for li in range(num_layers)),
    )
