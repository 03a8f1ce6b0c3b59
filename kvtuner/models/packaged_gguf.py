"""GGUF models that PyPI packages ship in parts, assembled once into kvtuner's cache folder.

Both packaged aliases (``gemma3-270m``, ``qwen2.5-0.5b``) are one GGUF file split across several
packages. The assembled file lives in ``$XDG_CACHE_HOME/kvtuner/<alias>/``, written to a temp file
and renamed, so a crash or a second process never leaves a half-written GGUF behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["assemble_atomic", "cache_dir"]


def cache_dir(name: str) -> Path:
    """kvtuner's folder ``name`` among the model files it keeps: an alias's assembled GGUF, or
    ``converted`` (:mod:`.converted`)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvtuner" / name


def assemble_atomic(target: Path, write: Callable[[str], None]) -> Path:
    """Run ``write(tmp_path)`` into a temp file beside ``target``, then rename it to ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp made it private; a model file is no secret
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target
