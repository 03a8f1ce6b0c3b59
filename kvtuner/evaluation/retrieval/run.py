"""evaluate_retrieval(): every config x length x depth x sample, answered, scored, resumable."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import KVTunerError
from ..configs import EvalConfig
from .answer import answer, task_cache
from .haystack import HAYSTACKS
from .samples import SampleKey, make_sample
from .scoring import is_correct
from .store import ResultsFile
from .summary import summarize
from .tasks import TASKS

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)

__all__ = ["DEFAULT_DEPTHS", "RetrievalSettings", "evaluate_retrieval"]


@dataclass(frozen=True)
class RetrievalSettings:
    """What a retrieval run measures; recorded in its results file (a resume must match)."""

    task: str
    lengths: tuple[int, ...]
    depths: tuple[float, ...] = DEFAULT_DEPTHS
    samples: int = 5
    haystack: str = "noise"
    seed: int = 0
    residual_length: int = 128
    pack_chunk: int = 32
    chat: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise KVTunerError(f"unknown retrieval task {self.task!r} (use {', '.join(TASKS)})")
        if self.haystack not in HAYSTACKS:
            raise KVTunerError(f"unknown haystack {self.haystack!r} (use {', '.join(HAYSTACKS)})")
        if not self.lengths or any(n < 64 for n in self.lengths):
            raise KVTunerError("--context-length: give lengths of at least 64 tokens")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise KVTunerError("--depths must be fractions in [0, 1]")
        if self.samples < 1 or self.residual_length < 0 or self.pack_chunk < 1:
            raise KVTunerError("--samples and --pack-chunk must be >= 1, --residual-length >= 0")

    def recorded(self, model: str, fingerprint_hash: str) -> dict[str, Any]:
        """The settings a results file must share to be resumed (lengths/depths may grow)."""
        keep = ("task", "haystack", "seed", "residual_length", "pack_chunk", "chat")
        return {"model": model, "fingerprint": fingerprint_hash} | {
            k: getattr(self, k) for k in keep
        }


def _kv_bytes(model, config: EvalConfig, settings: RetrievalSettings, fingerprint, n: int):
    fp16 = fingerprint.fp16_bytes(n)
    cache = task_cache(
        model, config, residual_length=settings.residual_length, pack_chunk=settings.pack_chunk
    )
    return {"kv_bytes": fp16 if cache is None else cache.predicted_nbytes(n), "fp16_bytes": fp16}


def _plan(settings: RetrievalSettings) -> list[SampleKey]:
    return [
        SampleKey(settings.task, settings.haystack, n, d, i, settings.seed)
        for n in settings.lengths
        for d in settings.depths
        for i in range(settings.samples)
    ]


def evaluate_retrieval(
    model: Any,
    tokenizer: Any,
    configs: Sequence[EvalConfig],
    settings: RetrievalSettings,
    *,
    model_name: str = "",
    results_path: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """fp first, then each config, on the same samples; answered samples already in
    ``results_path`` are skipped. Returns the report dict (settings, rows, cells, records)."""
    from tqdm.auto import tqdm

    from ...profile import ModelFingerprint

    fingerprint = ModelFingerprint.from_config(model.config)
    store = ResultsFile(results_path, settings.recorded(model_name, fingerprint.hash))
    rows = [EvalConfig("fp", "fp"), *configs]
    plan = _plan(settings)
    todo = [(c, k) for k in plan for c in rows]
    bar = tqdm(total=len(todo), disable=not progress, unit="answer", desc=settings.task)
    for key in plan:
        sample = None
        for config in rows:
            rkey = (
                config.name,
                config.specs_hash(fingerprint),
                key.length,
                round(key.depth, 6),
                key.index,
            )  # record_key's form
            if not store.has(rkey):
                sample = sample or make_sample(tokenizer, key, chat=settings.chat)
                store.add(_answered(model, tokenizer, sample, config, rkey, settings))
            bar.update(1)
    bar.close()
    wanted = {(c.name, c.specs_hash(fingerprint)) for c in rows}
    keys = {(k.length, round(k.depth, 6), k.index) for k in plan}
    records = [r for k, r in store.records.items() if (k[0], k[1]) in wanted and k[2:] in keys]
    kv = {(c.name, n): _kv_bytes(model, c, settings, fingerprint, n) for c in rows
          for n in settings.lengths}  # fmt: skip
    return {
        "format": "kvtuner-retrieval",
        "version": 1,
        "model": model_name,
        "settings": {
            **settings.__dict__,
            "lengths": list(settings.lengths),
            "depths": list(settings.depths),
        },  # fmt: skip
        **summarize(records, kv),
        "records": records,
    }


def _answered(model, tokenizer, sample, config: EvalConfig, rkey: tuple, settings) -> dict:
    t0 = time.perf_counter()
    reply = answer(
        model,
        tokenizer,
        sample,
        config,
        residual_length=settings.residual_length,
        pack_chunk=settings.pack_chunk,
    )
    name, specs_hash, length, depth, index = rkey
    return {
        "config": name,
        "hash": specs_hash,
        "length": length,
        "depth": depth,
        "sample": index,
        "correct": is_correct(reply, sample.draw.answers),
        "answers": list(sample.draw.answers),
        "reply": reply,
        "seconds": round(time.perf_counter() - t0, 2),
    }
