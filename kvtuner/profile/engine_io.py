"""What the engine-format profiles (vLLM skip sets, engine recipes) share when they are read:
the producer stamp, object sections, the hash check and the model check, each one line."""

from __future__ import annotations

from ..errors import KVTunerError
from .fingerprint import ModelFingerprint

__all__ = ["check_hash", "check_same_model", "producer", "section"]


def producer() -> dict[str, str]:
    from .._version import __version__

    return {"name": "kvtuner", "version": __version__}


def section(data: dict, key: str, what: str) -> dict:
    """``data[key]`` (an object, ``{}`` when absent); one line when it is not an object."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise KVTunerError(f"{what} field '{key}' must be an object")
    return value


def check_hash(data: dict, computed: str, what: str) -> None:
    """A stated hash must be the content's."""
    if data.get("hash") not in (None, computed):
        raise KVTunerError(
            f"{what} hash {data['hash']} does not match its content ({computed}); "
            "if you edited it by hand, delete the 'hash' field"
        )


def check_same_model(
    mine: ModelFingerprint,
    model: ModelFingerprint,
    model_id: str,
    names: tuple[str, ...],
    what: str,
) -> None:
    """One line when ``model`` differs from ``mine`` in any of ``names``."""
    for name in names:
        if getattr(mine, name) != getattr(model, name):
            raise KVTunerError(
                f"{what} was made for {model_id} ({name} {getattr(mine, name)}), "
                f"not for this model ({name} {getattr(model, name)})"
            )
