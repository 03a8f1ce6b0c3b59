"""Decode speed: greedy single-token steps after a prompt, with a given cache.

Each config is timed ``repeats`` times, each run right after a default-cache run (so CPU-load
swings hit both alike); reported: the median tokens/s and the median of the paired ratios.
kvtuner rows are timed in two modes: ``packed`` (only packed rows + the residual window are kept;
every step dequantizes the history) and ``copy`` (``keep_dequantized=True``: a dequantized working
copy is extended by the newly packed tokens only; same outputs, more memory).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..placement import model_device, synchronize
from ..runtime_loader.hf.keyword import cache_kwargs
from .configs import EvalConfig

DEFAULT_PROMPT_TOKENS = 512
DEFAULT_DECODE_STEPS = 64
DEFAULT_REPEATS = 3
DEFAULT_RESIDUAL = 128
DEFAULT_PACK_CHUNK = 32  # tokens leave the window 32 at a time: one quantize call per 32 steps

__all__ = ["DecodeSettings", "decode_cache", "decode_tokens_per_s", "measure_decode"]


@dataclass(frozen=True)
class DecodeSettings:
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    steps: int = DEFAULT_DECODE_STEPS
    repeats: int = DEFAULT_REPEATS
    residual_length: int = DEFAULT_RESIDUAL
    pack_chunk: int = DEFAULT_PACK_CHUNK

    def __post_init__(self) -> None:
        from ..errors import KVTunerError

        for name in ("prompt_tokens", "steps", "repeats"):
            if getattr(self, name) <= 0:
                raise KVTunerError(f"decode {name} must be positive")
        if self.residual_length < 0 or self.pack_chunk < 1:
            raise KVTunerError("decode residual length must be >= 0 and pack chunk >= 1")


def decode_cache(
    config: EvalConfig, model: Any, settings: DecodeSettings, keep_dequantized: bool = False
):
    """The cache a user would decode with: default, kvtuner's packed cache, or quanto's."""
    if config.kind == "fp":
        from transformers import DynamicCache

        return DynamicCache(config=model.config)
    if config.kind == "hf-quanto":
        from .quanto import quanto_decode_cache

        return quanto_decode_cache(model, config.quanto_bits, settings.residual_length)
    from ..runtime_loader.hf import make_cache

    return make_cache(
        model,
        config.specs,
        residual_length=settings.residual_length,
        keep_dequantized=keep_dequantized,
        pack_chunk=settings.pack_chunk,
    )


@torch.inference_mode()
def decode_tokens_per_s(model: Any, prompt: torch.Tensor, cache: Any, steps: int) -> float:
    """Prefill prompt[T] (untimed), then time ``steps`` greedy one-token forwards."""
    device = model_device(model)
    out = model(prompt[None].to(device), **cache_kwargs(cache), use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        out = model(nxt, **cache_kwargs(cache), use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
    synchronize(device)
    return steps / (time.perf_counter() - start)


def _modes(config: EvalConfig) -> list[tuple[str, bool]]:
    """(column suffix, keep_dequantized) pairs to time for this row."""
    return [("", False), ("_copy", True)] if config.specs is not None else [("", False)]


def measure_decode(
    model: Any, prompt: torch.Tensor, configs: list[EvalConfig], settings: DecodeSettings
) -> dict[str, dict[str, float]]:
    """Per config name: ``tok_s`` / ``ratio`` (and ``tok_s_copy`` / ``ratio_copy`` for kvtuner
    rows); ratio = median over repeats of tok/s over the default cache's tok/s right before."""
    fp = EvalConfig("fp", "fp")
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(settings.repeats):
        for c in configs or [fp]:
            for suffix, keep in _modes(c):
                pair = []
                for cfg in (fp, c):
                    cache = decode_cache(cfg, model, settings, keep and cfg is c)
                    pair.append(decode_tokens_per_s(model, prompt, cache, settings.steps))
                runs.setdefault(("fp", "tok_s"), []).append(pair[0])
                runs.setdefault((c.name, "tok_s" + suffix), []).append(pair[1])
                runs.setdefault((c.name, "ratio" + suffix), []).append(pair[1] / pair[0])
    out: dict[str, dict[str, float]] = {"fp": {"ratio": 1.0}}
    for (name, key), values in runs.items():
        out.setdefault(name, {})[key] = statistics.median(values)
    out["fp"]["ratio"] = 1.0
    return out
