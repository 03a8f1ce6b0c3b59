"""Export a model (GGUF, alias, HF folder) to the plain HF folder SGLang serves: SGLang cannot
load the GGUF checkpoints the aliases ship. Command: ``kvtuner export-hf --model M --output DIR``.

The model loads as :func:`~kvtuner.models.load_model` loads it (a GGUF's converted copy
included) and is written by :mod:`kvtuner.models.hf_folder`: atomic and safe to race, two
processes exporting the same model at once both succeed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import KVTunerError
from ..models import load_model
from ..models.hf_folder import is_hf_folder, save_plain, write_folder

__all__ = ["ExportResult", "export_hf"]

DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ExportResult:
    """Where the HF folder is, and whether this call wrote it (False: it was there already, or
    another process exporting at the same time renamed its folder into place first)."""

    path: Path
    written: bool


def _save(model_name: str, tmp: Path, dtype: str) -> None:
    import torch

    model, tokenizer = load_model(model_name, device="cpu", dtype=getattr(torch, dtype))
    save_plain(model, tokenizer, tmp)


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
    if is_hf_folder(output) and finish is not None:
        raise KVTunerError(f"--output {output} exists; a checkpoint with a recipe is a new folder")
    if is_hf_folder(output):
        return ExportResult(output, written=False)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise KVTunerError(f"--output {output} exists and is not an HF model folder")

    def write(tmp: Path) -> None:
        _save(os.fspath(model), tmp, dtype)
        if finish is not None:
            finish(tmp)

    return ExportResult(output, write_folder(output, write))
