"""TensorRT-LLM's per-layer KV dtype (``KvCacheConfig.dtype``, TensorRT-LLM #13695): a string
``"0-3:fp8,4-35:nvfp4"`` (ranges inclusive, unlisted layers ``auto``) or ``{layer: dtype}``."""

from __future__ import annotations

import re
from typing import Any

from ...errors import KVTunerError
from ...quant.engine_recipe import MODEL_DTYPE

__all__ = ["parse_trtllm_kv_dtype", "trtllm_kv_dtype"]

DTYPES = {"fp8": "fp8", "nvfp4": "nvfp4"}  # ours -> TensorRT-LLM's
_SEGMENT = re.compile(r"^\s*(\d+)(?:\s*-\s*(\d+))?\s*:\s*([a-z0-9_]+)\s*$")


def trtllm_kv_dtype(layers: tuple[str, ...]) -> str:
    """Runs of one quantized format as ``start-end:dtype``; one format on every layer: its name."""
    bad = sorted({f for f in layers if f != MODEL_DTYPE and f not in DTYPES})
    if bad:
        raise KVTunerError(f"TensorRT-LLM has no per-layer KV dtype for {', '.join(bad)}")
    if len(set(layers)) == 1:
        return DTYPES.get(layers[0], "auto")
    runs: list[list] = []  # [format, first, last]
    for i, f in enumerate(layers):
        if runs and runs[-1][0] == f and runs[-1][2] == i - 1:
            runs[-1][2] = i
        else:
            runs.append([f, i, i])
    parts = [(f"{a}" if a == b else f"{a}-{b}") + f":{DTYPES[f]}"
             for f, a, b in runs if f != MODEL_DTYPE]  # fmt: skip
    return ",".join(parts)


def _segment(text: str, num_layers: int) -> tuple[range, str]:
    m = _SEGMENT.match(text)
    if m is None:
        raise KVTunerError(f"invalid per-layer dtype segment {text!r} (want start-end:dtype)")
    start, end = int(m.group(1)), int(m.group(2) or m.group(1))
    if start > end:
        raise KVTunerError(f"segment {text!r}: start {start} must not exceed end {end}")
    if end >= num_layers:
        raise KVTunerError(f"segment {text!r} is out of range for {num_layers} layers")
    return range(start, end + 1), m.group(3)


def parse_trtllm_kv_dtype(spec: Any, num_layers: int) -> tuple[str, ...]:
    """A format per layer from a ``KvCacheConfig.dtype`` string or dict, checked as its parser
    checks it (segments, ranges in order and in range, known dtypes, no layer twice)."""
    if isinstance(spec, str) and ":" not in spec:
        items = [(range(num_layers), spec.strip())]
    elif isinstance(spec, str):
        items = [_segment(part, num_layers) for part in spec.split(",")]
    elif isinstance(spec, dict):
        items = [_segment(f"{k}:{v}", num_layers) for k, v in spec.items()]
    else:
        raise KVTunerError(f"KvCacheConfig.dtype must be a string or a dict, got {spec!r}")
    ours = {v: k for k, v in DTYPES.items()} | {"auto": MODEL_DTYPE}
    layers: list[str | None] = [None] * num_layers
    for span, dtype in items:
        if dtype not in ours:
            raise KVTunerError(f"unknown KV dtype {dtype!r}; TensorRT-LLM takes {sorted(ours)}")
        for i in span:
            if layers[i] is not None:
                raise KVTunerError(f"layer {i} is given a KV dtype twice")
            layers[i] = ours[dtype]
    return tuple(MODEL_DTYPE if f is None else f for f in layers)
