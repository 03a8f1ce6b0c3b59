"""Evaluation text: the first N non-overlapping windows of a tokenized test file."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import KVTunerError

DEFAULT_NUM_WINDOWS = 32
DEFAULT_SEQ_LEN = 1024
# The evaluation text is WikiText-2 test. The whole test split ships inside the package (gzip,
# 0.4 MB, CC BY-SA 3.0, see data/ATTRIBUTION.md), so an installed wheel evaluates offline.
EMBEDDED_TEST_NAME = "embedded:wikitext-2-test"
EMBEDDED_TEST_FILE = Path(__file__).parent / "data" / "wikitext2_test.txt.gz"
# the same split next to a repository checkout (tests compare the two)
SHARED_TEST_FILE = (
    Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2" / "test.txt"
)

__all__ = ["EvalWindows", "default_dataset", "embedded_test_text", "load_eval_windows"]


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
    """The name of the evaluation text used when no ``--dataset`` is given (embedded)."""
    return EMBEDDED_TEST_NAME


def embedded_test_text() -> str:
    """The embedded WikiText-2 test split, lines joined by newlines: the same string
    ``read_corpus`` gives for the plain ``test.txt`` (its text builder yields lines)."""
    with gzip.open(EMBEDDED_TEST_FILE, "rt", encoding="utf-8") as f:
        return "\n".join(f.read().splitlines())


def _read_text(dataset: str | None) -> tuple[str, str]:
    """(text, name) of ``dataset``; None or the embedded name: the embedded test split."""
    from ..calibration.corpus import read_corpus

    if dataset is None or dataset == EMBEDDED_TEST_NAME:
        return embedded_test_text(), EMBEDDED_TEST_NAME
    text, name, _split = read_corpus(dataset)
    return text, name


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

    _positive("num_windows", num_windows)
    _positive("seq_len", seq_len)
    text, name = _read_text(dataset)
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
