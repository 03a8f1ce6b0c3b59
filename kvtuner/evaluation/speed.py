"""Decode speed: greedy single-token steps after a prompt, with a given cache.

Each config is timed ``repeats`` times, interleaved with the default cache (so CPU-load swings hit
both alike); the median tokens/s is reported, and the ratio to the default cache's median.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from .configs import EvalConfig

DEFAULT_PROMPT_TOKENS = 512
DEFAULT_DECODE_STEPS = 64
DEFAULT_REPEATS = 3
DEFAULT_RESIDUAL = 128

__all__ = ["DecodeSettings", "decode_cache", "decode_tokens_per_s", "measure_decode"]


@dataclass(frozen=True)
class DecodeSettings:
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    steps: int = DEFAULT_DECODE_STEPS
    repeats: int = DEFAULT_REPEATS
    residual_length: int = DEFAULT_RESIDUAL
    keep_dequantized: bool = False

    def __post_init__(self) -> None:
        from ..errors import KVTunerError

        for name in ("prompt_tokens", "steps", "repeats"):
            if getattr(self, name) <= 0:
                raise KVTunerError(f"decode {name} must be positive")
        if self.residual_length < 0:
            raise KVTunerError("residual length must be >= 0")


def decode_cache(config: EvalConfig, model: Any, settings: DecodeSettings):
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
        keep_dequantized=settings.keep_dequantized,
    )


@torch.inference_mode()
def decode_tokens_per_s(model: Any, prompt: torch.Tensor, cache: Any, steps: int) -> float:
    """Prefill prompt[T] (untimed), then time ``steps`` greedy one-token forwards."""
    out = model(prompt[None], past_key_values=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    start = time.perf_counter()
    for _ in range(steps):
        out = model(nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
    return steps / (time.perf_counter() - start)


def measure_decode(
    model: Any, prompt: torch.Tensor, configs: list[EvalConfig], settings: DecodeSettings
) -> dict[str, dict[str, float]]:
    """Per config name: median decode ``tok_s`` and ``ratio`` = median over repeats of its tok/s
    divided by the default cache's tok/s measured right before it (paired, load-robust)."""
    fp = EvalConfig("fp", "fp")
    tok_s: dict[str, list[float]] = {c.name: [] for c in [fp, *configs]}
    ratio: dict[str, list[float]] = {c.name: [] for c in [fp, *configs]}
    for _ in range(settings.repeats):
        for c in configs or [fp]:
            pair = []
            for cfg in (fp, c):
                cache = decode_cache(cfg, model, settings)
                pair.append(decode_tokens_per_s(model, prompt, cache, settings.steps))
                tok_s[cfg.name].append(pair[-1])
            ratio[c.name].append(pair[1] / pair[0])
    ratio["fp"] = ratio["fp"] or [1.0]
    return {
        name: {"tok_s": statistics.median(tok_s[name]), "ratio": statistics.median(ratio[name])}
        for name in tok_s
    }
