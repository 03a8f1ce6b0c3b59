"""Models: where one comes from (hub id, local folder, ``.gguf`` file, or the ``smollm2-135m`` /
``gemma3-270m`` / ``qwen2.5-0.5b`` aliases, assembled from PyPI packages) and its fingerprint."""

from .loader import (
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
