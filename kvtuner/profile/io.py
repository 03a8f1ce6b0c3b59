"""Reading and writing profiles: JSON only, validated on load, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import KVTunerError
from .fingerprint import ModelFingerprint
from .profile import LayerSpec, Profile, check_schema_version

_TOP_LEVEL = {
    "schema_version",
    "producer",
    "model",
    "layers",
    "budget",
    "calibration",
    "metrics",
    "created",
    "hash",
}


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write JSON to a temp file in the target folder, then rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.chmod(tmp, _plain_file_mode(path))  # mkstemp's 0600 would hide it from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain_file_mode(path: Path) -> int:
    """The mode ``open(path, "w")`` would give: the existing file's, else 0666 less the umask."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise KVTunerError(f"{what} not found: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise KVTunerError(f"cannot read {what} {path}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KVTunerError(f"{what} {path} is not valid JSON: {exc}") from None


def profile_from_dict(data: Any) -> Profile:
    if not isinstance(data, dict):
        raise KVTunerError("a profile must be a JSON object")
    if data.get("target") == "vllm":
        raise KVTunerError(
            "this is a vLLM profile (target vllm): pass it to `kvtuner vllm-args` or "
            "`kvtuner serve --engine vllm` (docs/engines.md)"
        )
    if data.get("target") == "recipe":
        raise KVTunerError(
            "this is an engine recipe (target recipe): pass it to `kvtuner recipe-args` or "
            "`kvtuner export-hf --recipe` (docs/engines.md)"
        )
    check_schema_version(data.get("schema_version"))
    unknown = set(data) - _TOP_LEVEL
    if unknown:
        raise KVTunerError(f"unknown profile field(s): {', '.join(sorted(unknown))}")
    model = data.get("model")
    if not isinstance(model, dict) or "fingerprint" not in model:
        raise KVTunerError("profile needs 'model' with a 'fingerprint'")
    if not isinstance(data.get("layers"), list):
        raise KVTunerError("profile needs a 'layers' list")
    profile = Profile(
        model_id=str(model.get("id", "")),
        model_revision=model.get("revision"),
        fingerprint=ModelFingerprint.from_dict(model["fingerprint"]),
        layers=tuple(LayerSpec.from_dict(entry) for entry in data["layers"]),
        budget=_object(data, "budget"),
        calibration=_object(data, "calibration"),
        metrics=_object(data, "metrics"),
        producer=_object(data, "producer") or {"name": "unknown", "version": "unknown"},
        created=str(data.get("created", "")),
        schema_version=data["schema_version"],
    )
    stated = data.get("hash")
    if stated is not None and stated != profile.hash:
        raise KVTunerError(
            f"profile hash {stated} does not match its content ({profile.hash}); "
            "if you edited it by hand, delete the 'hash' field"
        )
    return profile


def _object(data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise KVTunerError(f"profile field '{key}' must be an object")
    return value


def load_profile(path: str | os.PathLike, model_config: Any = None) -> Profile:
    """Load and validate a profile; with ``model_config`` (a transformers config or a
    :class:`ModelFingerprint`) also check it fits that model. Raises :class:`KVTunerError`."""
    profile = profile_from_dict(read_json(path, "profile"))
    if model_config is not None:
        fp = model_config
        if not isinstance(fp, ModelFingerprint):
            fp = ModelFingerprint.from_config(model_config)
        profile.check_model(fp)
    return profile


def save_profile(profile: Profile, path: str | os.PathLike) -> Path:
    write_json_atomic(path, profile.to_dict())
    return Path(path)
