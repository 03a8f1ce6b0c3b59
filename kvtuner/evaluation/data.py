"""Evaluation text: the first N non-overlapping windows of a tokenized test file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import KVTunerError

DEFAULT_NUM_WINDOWS = 32
DEFAULT_SEQ_LEN = 1024
# DESIGN.md: evaluate on WikiText-2 test, kept next to the repository (../shared/data/...)
_REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_TEST_FILE = _REPO_ROOT.parent / "shared" / "data" / "wikitext-2" / "test.txt"

__all__ = ["EvalWindows", "default_dataset", "load_eval_windows"]


@dataclass(frozen=True)
class EvalWindows:
    """``tokens``: int64 [num_windows, seq_len], windows 0..N-1 of the text, in order."""

    dataset: str
    num_windows: int
    seq_len: int
    tokens: torch.Tensor = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if tuple(self.tokens.shape) != (self.num_windows, self.seq_len):
            raise KVTunerError(f"eval tokens must be [{self.num_windows}, {self.seq_len}]")

    def describe(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "num_windows": self.num_windows,
            "seq_len": self.seq_len,
            "tokens": self.tokens.numel(),
        }


def default_dataset() -> str:
    """WikiText-2 test next to the repository; a clear error when it is not there."""
    if SHARED_TEST_FILE.is_file():
        return str(SHARED_TEST_FILE)
    raise KVTunerError(
        f"no --dataset given and the default WikiText-2 test file {SHARED_TEST_FILE} does not "
        "exist; pass --dataset PATH (a local .txt/.jsonl/.parquet file or hf:NAME:CONFIG:SPLIT)"
    )


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KVTunerError(f"{name} must be a positive integer, got {value!r}")


def load_eval_windows(
    tokenizer: Any,
    *,
    dataset: str | None = None,
    num_windows: int = DEFAULT_NUM_WINDOWS,
    seq_len: int = DEFAULT_SEQ_LEN,
) -> EvalWindows:
    """Read ``dataset`` with calibration's reader (same file forms), tokenize it, cut the first
    ``num_windows`` non-overlapping windows; each is led by the tokenizer's special prefix (the
    BOS Gemma needs; none for SmolLM2) and is ``seq_len`` tokens long with it."""
    from ..calibration.batches import special_prefix, text_ids, with_prefix
    from ..calibration.corpus import read_corpus

    _positive("num_windows", num_windows)
    _positive("seq_len", seq_len)
    text, name, _split = read_corpus(dataset or default_dataset())
    prefix = special_prefix(tokenizer)
    body_len = seq_len - len(prefix)
    ids = text_ids(tokenizer, text)
    if body_len <= 0 or ids.numel() < num_windows * body_len:
        raise KVTunerError(
            f"dataset {name} has {ids.numel()} tokens, fewer than {num_windows} windows of "
            f"{seq_len}; lower --num-windows/--seq-len"
        )
    body = ids[: num_windows * body_len].view(num_windows, body_len)
    return EvalWindows(name, num_windows, seq_len, with_prefix(body, prefix))
