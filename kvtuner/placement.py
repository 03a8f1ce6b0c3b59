"""Where a model runs and in which dtype: ``--device {auto,cpu,cuda,cuda:N}`` and
``--dtype {auto,float32,bfloat16,float16}``, resolved in one place.

``auto`` device: CUDA when one is visible, else the CPU. ``auto`` dtype: bf16 on CUDA, fp32 on
the CPU (so the CPU path is exactly what it was before devices existed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from .errors import KVTunerError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

__all__ = [
    "DEVICE_CHOICES",
    "DTYPE_CHOICES",
    "Placement",
    "model_device",
    "peak_memory_bytes",
    "peak_memory_line",
    "placement",
    "placement_of",
    "reset_peak_memory",
    "synchronize",
]


@dataclass(frozen=True)
class Placement:
    """A device/dtype choice. Built from user input it may say ``auto``; :meth:`resolve` gives the
    concrete one (``cpu``/``cuda:N``, a dtype name), checking that the device exists."""

    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not _DEVICE.match(self.device):
            raise KVTunerError(
                f"device must be one of {', '.join(DEVICE_CHOICES)}, got {self.device!r}"
            )
        if self.dtype not in DTYPE_CHOICES:
            raise KVTunerError(
                f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}"
            )

    @property
    def resolved(self) -> bool:
        return self.device not in ("auto", "cuda") and self.dtype != "auto"

    def resolve(self) -> Placement:
        """The concrete placement; one clear line when CUDA is asked for but not there."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        _check_device(device)
        if device == "cuda":
            device = f"cuda:{torch.cuda.current_device()}"
        dtype = self.dtype
        if dtype == "auto":
            dtype = "float32" if device == "cpu" else "bfloat16"
        return Placement(device, dtype)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.resolve().device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.resolve().dtype]

    def describe(self) -> dict[str, str]:
        """``{"device", "dtype"}`` as resolved: calibration provenance of a profile."""
        r = self.resolve()
        return {"device": _device_name(r.device), "dtype": r.dtype}


def _check_device(device: str) -> None:
    if device == "cpu":
        return
    if not torch.cuda.is_available():
        raise KVTunerError(
            f"--device {device}: no CUDA device is visible to torch "
            f"(torch {torch.__version__}); use --device cpu"
        )
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise KVTunerError(
            f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )


def _device_name(device: str) -> str:
    """``cuda:0 (NVIDIA H100 80GB HBM3)``; ``cpu`` as is."""
    if device == "cpu":
        return device
    return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"


def placement(device: Any = "auto", dtype: Any = "auto") -> Placement:
    """A resolved :class:`Placement` from strings, ``torch.device`` or ``torch.dtype`` values."""
    if isinstance(device, torch.device):
        device = str(device)
    if isinstance(dtype, torch.dtype):
        names = {v: k for k, v in DTYPES.items()}
        if dtype not in names:
            raise KVTunerError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype}")
        dtype = names[dtype]
    return Placement(device, dtype).resolve()


def model_device(model: Any) -> torch.device:
    """Where a model's weights are: every tensor fed to it is moved there first."""
    return next(model.parameters()).device


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def placement_of(model: Any) -> Placement:
    """Where a loaded model's weights are, and their dtype."""
    weight = next(model.parameters())
    return placement(weight.device, weight.dtype)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """torch.cuda.max_memory_allocated since the last reset; None on the CPU (not tracked)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def peak_memory_line(device: torch.device) -> str:
    """``peak GPU memory 12.3 GiB`` (torch.cuda.max_memory_allocated); ``n/a`` on the CPU."""
    peak = peak_memory_bytes(device)
    if peak is None:
        return "peak GPU memory n/a (cpu)"
    return f"peak GPU memory {peak / 2**30:.2f} GiB"
