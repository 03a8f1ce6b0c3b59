"""A plain HF model folder (config, tokenizer, safetensors), written whole or not at all.

transformers dequantizes a GGUF on load; ``save_pretrained`` refuses such a model ("quantized with
gguf and is not serializable") until the GGUF quantizer's marks are dropped: the weights in
memory are already plain tensors.

Atomic and safe to race: each writer fills its own temp folder beside the target and renames it
into place. Two processes writing the same folder at once both succeed: the first rename wins,
the loser (its rename meets the winner's non-empty folder) removes its copy and uses the winner's.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["is_hf_folder", "save_plain", "write_folder"]


def is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def save_plain(model: Any, tokenizer: Any, folder: Path, config: Any = None) -> None:
    """``model`` and ``tokenizer`` -> ``folder``; ``config``, when given, is written as the
    folder's ``config.json`` in place of the model's (the config as read, before loading
    filled in its dtype)."""
    model.hf_quantizer = None  # weights are dequantized already; let save_pretrained run
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if config is not None:
        config.save_pretrained(folder)


def write_folder(output: Path, write: Callable[[Path], None]) -> bool:
    """``write(tmp)`` into a temp folder beside ``output``, then rename it to ``output``; False
    when another process's folder got there first (this one's copy is removed)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would follow the folder into place
    try:
        write(tmp)
        return _move_into_place(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename won


def _move_into_place(tmp: Path, output: Path) -> bool:
    try:
        os.rename(tmp, output)  # replaces an empty folder; fails on a non-empty one
        return True
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not is_hf_folder(output):
            raise
        return False
