"""kvtuner: per-layer mixed-precision KV cache quantization, tuned offline, served anywhere.

The verbs: :func:`apply` a profile to a transformers model, :func:`search` one, :func:`calibrate`
a model's per-layer sensitivity, :func:`evaluate` profiles against fp. They load torch,
transformers and Optuna on first use, so ``import kvtuner`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import KVTunerError
from .profile import LayerSpec, ModelFingerprint, Profile, load_profile, save_profile
from .quant import QuantSpec, dequantize, fake_quantize, quantize

if TYPE_CHECKING:
    from .calibration import calibrate
    from .evaluation.run import evaluate
    from .runtime_loader.hf.apply import apply
    from .tuner.registry import search

_LAZY = {
    "apply": ".runtime_loader.hf.apply",
    "calibrate": ".calibration",
    "evaluate": ".evaluation.run",
    "search": ".tuner.registry",
}

__all__ = [
    "KVTunerError",
    "LayerSpec",
    "ModelFingerprint",
    "Profile",
    "QuantSpec",
    "__version__",
    "apply",
    "calibrate",
    "dequantize",
    "evaluate",
    "fake_quantize",
    "load_profile",
    "quantize",
    "save_profile",
    "search",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kvtuner' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # later reads skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
