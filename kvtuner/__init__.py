"""kvtuner: per-layer mixed-precision KV cache quantization, tuned offline, served anywhere."""

from ._version import __version__
from .errors import KVTunerError  # noqa: E402
from .profile import LayerSpec, ModelFingerprint, Profile, load_profile, save_profile  # noqa: E402
from .quant import QuantSpec, dequantize, fake_quantize, quantize  # noqa: E402

__all__ = [
    "KVTunerError",
    "LayerSpec",
    "ModelFingerprint",
    "Profile",
    "QuantSpec",
    "__version__",
    "dequantize",
    "fake_quantize",
    "load_profile",
    "quantize",
    "save_profile",
]
