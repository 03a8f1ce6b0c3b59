"""Token windows for calibration, deterministic given the seed, with their provenance."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KVTunerError
from .corpus import read_corpus

DEFAULT_NUM_SAMPLES = 1  # 1 x 256: docs/results/calibration.md has the measured trade-off
DEFAULT_SEQ_LEN = 256
DEFAULT_SEED = 0

__all__ = ["CalibrationData", "load_calibration_data", "load_token_batches", "special_prefix"]


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KVTunerError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class CalibrationData:
    """``tokens``: int64 [num_samples, seq_len], non-overlapping windows of the tokenized text."""

    dataset: str
    split: str
    num_samples: int
    seq_len: int
    seed: int
    tokens: torch.Tensor = field(repr=False, compare=False)
    prefix: tuple[int, ...] = ()  # special ids each window starts with (e.g. Gemma's BOS)

    def __post_init__(self) -> None:
        _positive_int("num_samples", self.num_samples)
        _positive_int("seq_len", self.seq_len)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise KVTunerError(f"seed must be an integer, got {self.seed!r}")
        if tuple(self.tokens.shape) != (self.num_samples, self.seq_len):
            raise KVTunerError(
                f"tokens must be [{self.num_samples}, {self.seq_len}], "
                f"got {tuple(self.tokens.shape)}"
            )

    @property
    def token_hash(self) -> str:
        """Hash of the token ids themselves: what a cache of measurements must be keyed on."""
        return hashlib.sha256(self.tokens.to(torch.int64).numpy().tobytes()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """The ``data`` section of a sensitivity file / ``calibration`` section of a profile."""
        return {
            "dataset": self.dataset,
            "split": self.split,
            "num_samples": self.num_samples,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "tokens": self.tokens.numel(),
            **({"prefix_ids": list(self.prefix)} if self.prefix else {}),
        }


def special_prefix(tokenizer: Any) -> tuple[int, ...]:
    """The ids the tokenizer puts before any text by default (Gemma: BOS; SmolLM2: none).

    A model trained with such a prefix is far off its distribution without it (Gemma 3 270M,
    first 128 tokens of WikiText-2 test: ppl 155 without BOS, 39 with it), so every window of
    calibration and evaluation starts with it.
    """
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    cut = len(full) - len(plain)
    if cut <= 0 or list(full[cut:]) != list(plain):
        return ()
    return tuple(int(i) for i in full[:cut])


def text_ids(tokenizer: Any, text: str) -> torch.Tensor:
    """int64 [n] ids of ``text`` alone, no special tokens."""
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def with_prefix(windows: torch.Tensor, prefix: tuple[int, ...]) -> torch.Tensor:
    """[n, seq_len - len(prefix)] text windows -> [n, seq_len], each led by ``prefix``."""
    if not prefix:
        return windows
    head = torch.tensor(prefix, dtype=windows.dtype).expand(windows.shape[0], -1)
    return torch.cat([head, windows], dim=1)


def _order(count: int, seed: int) -> torch.Tensor:
    """The seeded order windows are drawn in: a permutation of range(count)."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed))


def _taken_spans(
    num_ids: int, data: CalibrationData | None, prefix_len: int
) -> tuple[tuple[int, int], ...]:
    """(start, end) token spans of ``data``'s windows in the text (none without ``data``)."""
    if data is None:
        return ()
    length = data.seq_len - prefix_len
    starts = _order(num_ids // length, data.seed)[: data.num_samples] * length
    return tuple((int(a), int(a) + length) for a in starts)


def _windows(
    ids: torch.Tensor,
    num_samples: int,
    seq_len: int,
    seed: int,
    offset: int = 0,
    taken: tuple[tuple[int, int], ...] = (),
) -> torch.Tensor:
    """Pick ``num_samples`` of the non-overlapping ``seq_len`` windows, seeded; ``offset`` skips
    the first picks of the same permutation, ``taken`` every window overlapping one of those
    token spans (windows disjoint from an earlier draw)."""
    count = ids.numel() // seq_len
    order = [
        int(p) for p in _order(count, seed)
        if all(p * seq_len >= end or (p + 1) * seq_len <= start for start, end in taken)
    ]  # fmt: skip
    if len(order) < num_samples + offset:
        raise KVTunerError(
            f"calibration text has {ids.numel()} tokens: too few for {num_samples + offset} "
            f"sample(s) of {seq_len} tokens; lower --num-samples/--seq-len (or "
            "--confirm-samples) or pass a larger --dataset"
        )
    picks = torch.tensor(order[offset : offset + num_samples])
    return ids[: count * seq_len].view(count, seq_len)[picks].clone()


def load_calibration_data(
    tokenizer: Any,
    *,
    dataset: str | None = None,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seq_len: int = DEFAULT_SEQ_LEN,
    seed: int = DEFAULT_SEED,
    offset: int = 0,
    disjoint_from: CalibrationData | None = None,
) -> CalibrationData:
    """Read ``dataset`` (see :mod:`.corpus`), tokenize it and cut windows, each led by the
    tokenizer's :func:`special_prefix`. ``offset=n`` skips the windows a draw of n samples with
    the same seed took; ``disjoint_from`` skips every window that shares a token with that
    draw's (one made with offset 0 from the same text, of any window length)."""
    _positive_int("num_samples", num_samples)
    _positive_int("seq_len", seq_len)
    text, name, split = read_corpus(dataset)
    if not text.strip():
        raise KVTunerError(f"dataset {name} holds no text")
    prefix = special_prefix(tokenizer)
    if seq_len <= len(prefix):
        raise KVTunerError(f"seq_len {seq_len} leaves no room for text after the special prefix")
    ids = text_ids(tokenizer, text)
    taken = _taken_spans(ids.numel(), disjoint_from, len(prefix))
    body = _windows(ids, num_samples, seq_len - len(prefix), seed, offset, taken)
    tokens = with_prefix(body, prefix)
    return CalibrationData(name, split, num_samples, seq_len, seed, tokens, prefix)


def load_token_batches(
    tokenizer: Any,
    *,
    dataset: str | None = None,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seq_len: int = DEFAULT_SEQ_LEN,
    seed: int = DEFAULT_SEED,
) -> torch.Tensor:
    """int64 [num_samples, seq_len] token windows; :func:`load_calibration_data` adds provenance."""
    return load_calibration_data(
        tokenizer, dataset=dataset, num_samples=num_samples, seq_len=seq_len, seed=seed
    ).tokens
