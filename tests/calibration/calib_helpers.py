"""Calibration test helpers: a real byte-level tokenizer and tiny models saved as checkpoints.

Not a conftest.py: other test files import ``tiny_model`` from the top-level ``conftest``."""

from __future__ import annotations

from pathlib import Path

from conftest import tiny_model


def byte_tokenizer(*, bos: bool = False):
    """A real fast tokenizer with exactly 256 byte-level tokens (fits the tiny models' vocab);
    ``bos=True`` adds a 257th, ``<bos>``, put before every text as Gemma's tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    if bos:
        vocab["<bos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if not bos:
        return PreTrainedTokenizerFast(tokenizer_object=tok)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>")


def save_tiny(path: Path, family: str = "llama", **overrides) -> Path:
    """A tiny random model + byte tokenizer written with save_pretrained into ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    tiny_model(family, **overrides).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path
