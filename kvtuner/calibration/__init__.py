"""Calibration: load text, measure KV-quantization damage (KL vs fp) per layer (models load
from :mod:`kvtuner.models`; ``load_model`` and ``model_fingerprint`` are re-exported here)."""

from ..models import SUPPORTED_MODEL_TYPES, fingerprint_of, load_model, model_fingerprint
from .batches import CalibrationData, load_calibration_data, load_token_batches
from .kl import FpReference, check_batch_size, fp_reference, measure_kl, measure_with_cache
from .sensitivity import Sensitivity
from .sweep import calibrate

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CalibrationData",
    "FpReference",
    "Sensitivity",
    "calibrate",
    "check_batch_size",
    "fingerprint_of",
    "fp_reference",
    "load_calibration_data",
    "load_model",
    "load_token_batches",
    "measure_kl",
    "measure_with_cache",
    "model_fingerprint",
]
