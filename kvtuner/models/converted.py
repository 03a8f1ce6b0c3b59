"""GGUF checkpoints as transformers converted them, kept so that the next load skips converting.

transformers parses a GGUF's metadata once for the config, once for the tokenizer and once for
the weights, and dequantizes every tensor in Python: Gemma 3 270M (a 262k-token vocabulary) took
103 s to load on a 2-core CPU, and 3 s from its converted copy. The copy is a plain HF folder
(:mod:`.hf_folder`) in ``$XDG_CACHE_HOME/kvtuner/converted/<file>-<key>-<dtype>/``, the key
naming the GGUF (path, size, modification time) and transformers' version, and holds the config
as read from the GGUF, so a fingerprint from it is the GGUF's. ``KVTUNER_GGUF_COPIES=0`` neither
reads nor writes copies.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

from .hf_folder import is_hf_folder, save_plain, write_folder
from .packaged_gguf import cache_dir

ENV_VAR = "KVTUNER_GGUF_COPIES"

logger = logging.getLogger(__name__)

__all__ = ["ENV_VAR", "existing_copy", "keep_copy"]


def _stem(gguf: Path) -> str | None:
    """``<file>-<key>``; None when copies are off or the file cannot be read."""
    if os.environ.get(ENV_VAR, "1") == "0":
        return None
    import transformers

    try:
        stat = gguf.stat()
    except OSError:
        return None
    facts = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return f"{gguf.stem}-{hashlib.sha256(facts.encode()).hexdigest()[:16]}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def existing_copy(gguf: Path, dtype: torch.dtype | None = None) -> Path | None:
    """The converted copy of ``gguf`` with weights in ``dtype`` (None: in any dtype, for its
    config and tokenizer), if one was written."""
    stem = _stem(gguf)
    if stem is None:
        return None
    folders = cache_dir("converted").glob(f"{stem}-{_dtype_name(dtype) if dtype else '*'}")
    return next((f for f in sorted(folders) if is_hf_folder(f)), None)


def keep_copy(gguf: Path, dtype: torch.dtype, model: Any, tokenizer: Any, config: Any) -> None:
    """Write the converted copy of ``gguf`` (``config`` as read from it, before loading filled
    it in). Weights transformers kept packed are not copied; a copy that cannot be written (a
    full disk, a read-only cache) is a warning: the model in hand is loaded already."""
    stem = _stem(gguf)
    if stem is None or not all(p.is_floating_point() for p in model.parameters()):
        return
    folder = cache_dir("converted") / f"{stem}-{_dtype_name(dtype)}"
    try:
        write_folder(folder, lambda tmp: save_plain(model, tokenizer, tmp, config))
    except (OSError, ValueError, RuntimeError) as exc:
        logger.warning("kvtuner: no converted copy of %s kept (%s)", gguf.name, exc)
