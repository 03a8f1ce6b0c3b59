"""Calibration test helpers: a real byte-level tokenizer and tiny models saved as checkpoints.

Not a conftest.py: other test files import ``tiny_model`` from the top-level ``conftest``."""

from __future__ import annotations

from pathlib import Path

from conftest import tiny_model


def byte_tokenizer():
    """A real fast tokenizer with exactly 256 byte-level tokens (fits the tiny models' vocab)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def save_tiny(path: Path, family: str = "llama", **overrides) -> Path:
    """A tiny random model + byte tokenizer written with save_pretrained into ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    tiny_model(family, **overrides).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path
