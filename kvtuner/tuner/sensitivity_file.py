"""The sensitivity a search starts from: a given file, the one cached beside the profile when it
was measured on this model, these tokens and these specs, or a fresh calibration; and the
preset's key smoothing, calibrated on the same tokens first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import KVTunerError
from ..profile import ModelFingerprint, read_json
from ..search_spaces import SearchPreset
from ..search_spaces.preset import smoothing_digest

__all__ = [
    "calibrated_smoothing",
    "load_or_calibrate",
    "sensitivity_path",
    "smoothing_provenance",
]


def load_or_calibrate(
    lm: Any,
    *,
    model_id: str,
    fp: ModelFingerprint,
    data: Any,
    preset: SearchPreset,
    bits: Sequence[int],
    path: Path,
    given: bool,
    log: Callable[[str], None],
    progress: bool,
    batch_size: int | None,
) -> Any:
    """The Sensitivity at ``path``: read when ``given`` or when it matches this model (``fp``),
    data and specs; else calibrated now and written there."""
    wanted = {**preset.settings(), "bits": list(bits)}
    if given or _matches(path, fp, data.describe(), wanted):
        log(f"sensitivity: {path}")
        return _load_sensitivity(path, fp, preset.settings(), log)
    return _calibrate(lm, model_id, data, preset, bits, path, log, progress, batch_size)


def sensitivity_path(output: Path) -> Path:
    """Where search keeps the sensitivity it calibrates: beside the profile."""
    return output.with_suffix(".sensitivity.json")


def _matches(path: Path, fp: ModelFingerprint, data: dict, settings: dict) -> bool:
    """Is the cached sensitivity file for this model, these tokens and these specs?"""
    if not path.exists():
        return False
    doc = read_json(path, "sensitivity file")
    same_model = doc.get("model", {}).get("fingerprint", {}).get("hash") == fp.hash
    same_data = all(doc.get("data", {}).get(k) == v for k, v in data.items())
    same_specs = all(doc.get("settings", {}).get(k) == v for k, v in settings.items())
    return same_model and same_data and same_specs


def _load_sensitivity(path: Path, fp: ModelFingerprint, preset_settings: dict, log) -> Any:
    from ..calibration import Sensitivity

    doc = read_json(path, "sensitivity file")
    theirs = doc.get("model", {}).get("fingerprint", {}).get("hash")
    if theirs != fp.hash:
        raise KVTunerError(
            f"sensitivity file {path} was measured on another model "
            f"(fingerprint {theirs}, this model {fp.hash})"
        )
    if any(doc.get("settings", {}).get(k) != v for k, v in preset_settings.items()):
        log(
            f"note: {path} was calibrated with other K/V specs than this preset; it only guides "
            "pruning and seeding, every trial is still measured with the preset's specs"
        )
    return Sensitivity.load(path)


def _calibrate(lm, model_id: str, data, preset, bits, path: Path, log, progress, batch_size):
    from ..calibration import calibrate

    log(
        f"calibrating: per-layer K/V sensitivity at {bits} bits on {data.tokens.numel()} "
        f"tokens ({data.dataset}) ..."
    )
    sensitivity = calibrate(
        lm,
        data,
        model_id=model_id,
        bits=bits,
        key_spec=preset.key,
        value_spec=preset.value,
        key_smoothing=preset.smoothing,
        progress=progress,
        batch_size=batch_size,
    )
    sensitivity.save(path)
    log(f"wrote {path}")
    return sensitivity


def calibrated_smoothing(lm, preset, data, log, batch_size):
    """The preset with λ calibrated on the calibration tokens (unchanged without smoothing)."""
    if preset.smooth_alpha is None:
        return preset
    from ..calibration.smoothing import calibrate_key_smoothing

    log(f"calibrating key smoothing (alpha {preset.smooth_alpha}) on the calibration tokens ...")
    lams = calibrate_key_smoothing(
        lm, data.tokens, alpha=preset.smooth_alpha, batch_size=batch_size
    )
    return preset.with_smoothing(lams)


def smoothing_provenance(preset: SearchPreset) -> dict:
    from ..calibration.smoothing import DEFAULT_QUANTILE

    return {"alpha": preset.smooth_alpha, "statistic": f"quantile {DEFAULT_QUANTILE} of |k|",
            "digest": smoothing_digest(preset.smoothing)}  # fmt: skip
