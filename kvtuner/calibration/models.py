"""Re-export: model loading lives in :mod:`kvtuner.models`, below the runtimes that use it."""

from ..models.loader import (
    SUPPORTED_MODEL_TYPES,
    fingerprint_of,
    load_model,
    model_fingerprint,
    resolve_model,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "fingerprint_of",
    "load_model",
    "model_fingerprint",
    "resolve_model",
]
