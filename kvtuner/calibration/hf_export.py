"""Export a model (GGUF, alias, HF folder) to the plain HF folder SGLang serves: SGLang cannot
load the GGUF checkpoints the aliases ship. Command: ``kvtuner export-hf --model M --output DIR``.

transformers dequantizes a GGUF on load; ``save_pretrained`` refuses such a model ("quantized with
gguf and is not serializable") until the GGUF quantizer marks are dropped: the weights in memory
are already plain tensors.

Atomic and safe to race: each process writes its own temp folder beside ``output`` and renames it
into place. Two processes exporting the same model at once both succeed: the first rename wins,
the loser (its rename meets the winner's non-empty folder) removes its copy and uses the winner's.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import KVTunerError
from ..models import resolve_model

__all__ = ["ExportResult", "export_hf"]

DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ExportResult:
    """Where the HF folder is, and whether this call wrote it (False: it was there already, or
    another process exporting at the same time renamed its folder into place first)."""

    path: Path
    written: bool


def _is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def _save(model_name: str, tmp: Path, dtype: str) -> None:
    import torch
    import transformers

    source = resolve_model(model_name)
    kwargs = source.kwargs()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            source.path, dtype=getattr(torch, dtype), **kwargs
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(source.path, **kwargs)
    except (OSError, ValueError) as exc:
        raise source.load_error(exc) from None
    model.hf_quantizer = None  # weights are dequantized already; let save_pretrained run
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)


def _move_into_place(tmp: Path, output: Path) -> bool:
    """Rename ``tmp`` to ``output``; False when another process's folder got there first."""
    try:
        os.rename(tmp, output)  # replaces an empty folder; fails on a non-empty one
        return True
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not _is_hf_folder(output):
            raise
        return False


def export_hf(
    model: str | os.PathLike,
    output: str | os.PathLike,
    *,
    dtype: str = "bfloat16",
    finish: Callable[[Path], None] | None = None,
) -> ExportResult:
    """Write model + tokenizer of ``model`` (``--model`` forms: alias, .gguf, HF folder, hub id)
    to the folder ``output``; an existing HF folder there is used as is. ``finish(folder)``
    adds to the folder before it moves into place (an existing folder is then an error)."""
    if dtype not in DTYPES:
        raise KVTunerError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    output = Path(output).expanduser()
    if _is_hf_folder(output) and finish is not None:
        raise KVTunerError(f"--output {output} exists; a checkpoint with a recipe is a new folder")
    if _is_hf_folder(output):
        return ExportResult(output, written=False)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise KVTunerError(f"--output {output} exists and is not an HF model folder")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would follow the folder into place
    try:
        _save(os.fspath(model), tmp, dtype)
        if finish is not None:
            finish(tmp)
        written = _move_into_place(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename won
    return ExportResult(output, written)
