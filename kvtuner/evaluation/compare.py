"""evaluate_configs(): fp and every requested config on the same windows, in one run, one table."""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KVTunerError
from ..placement import placement_of
from ..profile import ModelFingerprint
from .configs import EvalConfig
from .data import EvalWindows
from .perplexity import PerplexityResult, perplexity
from .speed import DecodeSettings, measure_decode

__all__ = ["EvalReport", "evaluate_configs", "hardware"]


def hardware() -> dict[str, Any]:
    """CPU model (from /proc/cpuinfo), logical cores, torch threads, versions."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import os

    import transformers

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }


@dataclass
class EvalReport:
    model: str
    fingerprint: ModelFingerprint
    data: dict[str, Any]
    settings: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    hardware: dict[str, Any] = field(default_factory=hardware)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "kvtuner-eval",
            "version": 1,
            "model": self.model,
            "fingerprint": self.fingerprint.to_dict(),
            "data": self.data,
            "settings": self.settings,
            "hardware": self.hardware,
            "wall_s": round(self.wall_s, 1),
            "rows": self.rows,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalReport:
        """A report as written by :meth:`to_dict` (e.g. a results JSON), to re-present it."""
        fingerprint = ModelFingerprint.from_dict(data["fingerprint"])
        fields = ("data", "settings", "rows", "hardware", "wall_s")
        return cls(data["model"], fingerprint, **{f: data[f] for f in fields})


def _stored_bytes(cache: Any) -> int:
    if hasattr(cache, "nbytes"):
        return cache.nbytes()
    from .quanto import quanto_nbytes

    return quanto_nbytes(cache)


def _row(
    config: EvalConfig,
    fingerprint: ModelFingerprint,
    res: PerplexityResult,
    fp: PerplexityResult,
    stored_per_token: float | None,
    seq_len: int,
) -> dict[str, Any]:
    """One table row; bytes/token as measured on the first window's cache when there is one.
    Ratios are to an fp16 cache of the same layout (window layers capped, as the default)."""
    acct = config.accounting(fingerprint, seq_len)
    fp16 = fingerprint.fp16_bytes(seq_len) / seq_len
    per_token = acct["bytes_per_token"] if stored_per_token is None else stored_per_token
    return {
        "name": config.name,
        "kind": config.kind,
        "source": config.source,
        "hash": config.specs_hash(fingerprint),
        "nominal_bits": round(acct["nominal_bits"], 4),
        "effective_bits": round(16.0 * per_token / fp16, 4),
        "bytes_per_token": round(per_token, 2),
        "ratio_to_fp16": round(per_token / fp16, 4),
        "ppl": round(res.ppl, 4),
        "delta_ppl_pct": round(res.delta_pct(fp), 3),
        "delta_se_pct": round(res.delta_se_pct(fp), 3),
        "window_nll": [round(x, 4) for x in res.window_nll],
    }


def stderr_line(msg: str) -> None:
    """The default ``log``: one flushed line on stderr (results go to stdout)."""
    print(msg, file=sys.stderr, flush=True)


def _check_prompt(decode: DecodeSettings | None, windows: EvalWindows) -> None:
    if decode is not None and decode.prompt_tokens > windows.tokens.numel():
        raise KVTunerError(
            f"decode prompt of {decode.prompt_tokens} tokens is longer than "
            f"the evaluation text ({windows.tokens.numel()} tokens)"
        )


def _ppl_row(
    model, windows, config, fingerprint, fp_result, log, score_last=None
) -> tuple[dict, PerplexityResult]:
    t0, stored = time.perf_counter(), []

    def first_window_bytes(i: int, cache: Any) -> None:
        if i == 0 and cache is not None:
            stored.append(_stored_bytes(cache) / windows.seq_len)

    res = perplexity(
        model, windows.tokens, config, on_window=first_window_bytes, score_last=score_last
    )
    stored_per_token = stored[0] if stored else None
    row = _row(config, fingerprint, res, fp_result or res, stored_per_token, windows.seq_len)
    log(f"[eval] {config.name}: ppl {res.ppl:.4f} ({time.perf_counter() - t0:.0f} s)")
    return row, res


def evaluate_configs(
    model: Any,
    windows: EvalWindows,
    configs: list[EvalConfig],
    *,
    model_name: str = "",
    decode: DecodeSettings | None = None,
    on_row: Callable[[EvalReport], None] | None = None,
    fp_result: PerplexityResult | None = None,
    log: Callable[[str], None] = stderr_line,
    score_last: int | None = None,
) -> EvalReport:
    """fp first, then each config: perplexity (+ bytes stored), then its decode speed (paired
    with a default-cache run) if asked; ``on_row(report)`` after each row (partial results).
    ``fp_result``: fp perplexity of these windows from an earlier run (no fp row is added).
    ``log``: where the per-row progress lines go (default stderr). ``score_last``: score only the
    last that many tokens of each window (long-context perplexity; None: every token)."""
    _check_prompt(decode, windows)
    start = time.perf_counter()
    fingerprint = ModelFingerprint.from_config(model.config)
    settings: dict[str, Any] = {"ppl_residual_length": 0, **placement_of(model).describe()}
    if score_last is not None:
        settings.update(scored_tokens_per_window=score_last)
    if decode is not None:
        settings.update(decode=decode.__dict__)
    report = EvalReport(model_name, fingerprint, windows.describe(), settings)
    first = [] if fp_result is not None else [EvalConfig("fp", "fp")]
    for config in [*first, *configs]:
        row, res = _ppl_row(model, windows, config, fingerprint, fp_result, log, score_last)
        fp_result = fp_result or res
        if decode is not None:
            prompt = windows.tokens.flatten()[: decode.prompt_tokens]
            speeds = measure_decode(model, prompt, [config] if configs else [], decode)
            for key, value in speeds[config.name].items():
                row[f"decode_{key}"] = round(value, 3)
        report.rows.append(row)
        report.wall_s = time.perf_counter() - start
        if on_row is not None:
            on_row(report)
    return report
