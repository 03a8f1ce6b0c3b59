"""Calibration text -> token windows: local files/folders and hub datasets read by ``datasets``.

``--dataset`` forms:
- omitted: the embedded WikiText-2 validation slice (``data/``, CC BY-SA 3.0), works offline;
- a local ``.txt``/``.jsonl``/``.json``/``.parquet``/``.csv`` file, or a folder of one such kind;
- ``hf:NAME:CONFIG:SPLIT`` (CONFIG may be empty), e.g. ``hf:wikitext:wikitext-2-raw-v1:validation``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import KVTunerError
from ..models.hub import hub_unreachable_reason

EMBEDDED_NAME = "embedded:wikitext-2-valid"
EMBEDDED_FILE = Path(__file__).parent / "data" / "wikitext2_valid_head.txt"
BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}
MAX_CHARS = 20_000_000  # tokenizing more text than this buys nothing for calibration

__all__ = ["EMBEDDED_NAME", "check_dataset", "read_corpus"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _local_files(path: Path) -> tuple[str, list[str]]:
    """(datasets builder, sorted file list) for a file or a folder of one file kind."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    kinds = {BUILDERS.get(p.suffix.lower()) for p in files} - {None}
    files = [p for p in files if p.suffix.lower() in BUILDERS]
    if not files:
        known = ", ".join(sorted(BUILDERS))
        raise KVTunerError(f"dataset {path}: no readable text file ({known})")
    if len(kinds) > 1:
        raise KVTunerError(f"dataset folder {path} mixes file kinds ({', '.join(sorted(kinds))})")
    return kinds.pop(), [str(p) for p in files]


def _text_column(ds, name: str) -> str:
    if "text" in ds.column_names:
        return "text"
    strings = [
        c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")
    ]
    if len(strings) != 1:
        raise KVTunerError(
            f"dataset {name}: no 'text' column (columns: {', '.join(ds.column_names)})"
        )
    return strings[0]


def _join(ds, name: str, builder: str) -> str:
    """Rows -> one string; the text builder yields lines (newline stripped), others documents."""
    column = _text_column(ds, name)
    sep = "\n" if builder == "text" else "\n\n"
    parts, size = [], 0
    for row in ds[column]:
        if row is None:
            continue
        parts.append(row)
        size += len(row) + len(sep)
        if size >= MAX_CHARS:
            break
    return sep.join(parts)


def _read_local(path: Path, name: str) -> tuple[str, str]:
    import datasets

    builder, files = _local_files(path)
    try:
        ds = datasets.load_dataset(builder, data_files=files, split="train")
    except Exception as exc:  # datasets raises many types for malformed files
        raise KVTunerError(f"cannot read dataset {name}: {_first_line(exc)}") from None
    return _join(ds, name, builder), "train"


def _read_hub(spec: str) -> tuple[str, str]:
    parts = spec.split(":")
    if len(parts) != 4 or not parts[1] or not parts[3]:
        raise KVTunerError(f"bad hub dataset {spec!r}: expected hf:NAME:CONFIG:SPLIT")
    _, repo, config, split = parts
    reason = hub_unreachable_reason()
    if reason:
        raise KVTunerError(f"cannot load hub dataset {spec}: {reason}; pass a local file instead")
    import datasets

    try:
        ds = datasets.load_dataset(repo, config or None, split=split)
    except Exception as exc:  # network, auth, missing config/split: all one line
        raise KVTunerError(f"cannot load hub dataset {spec}: {_first_line(exc)}") from None
    return _join(ds, spec, "hub"), split


def check_dataset(dataset: str | None) -> None:
    """Cheap checks of a ``--dataset`` value (syntax, existence) before any model is loaded."""
    if dataset is None:
        return
    if not isinstance(dataset, str) or not dataset.strip():
        raise KVTunerError("empty dataset name")
    if dataset.startswith("hf:"):
        if len(dataset.split(":")) != 4:
            raise KVTunerError(f"bad hub dataset {dataset!r}: expected hf:NAME:CONFIG:SPLIT")
        return
    path = Path(dataset).expanduser()
    if not path.exists():
        raise KVTunerError(
            f"dataset not found: {dataset} (a local file/folder or hf:NAME:CONFIG:SPLIT)"
        )
    _local_files(path)


def read_corpus(dataset: str | None) -> tuple[str, str, str]:
    """Return ``(text, dataset_name, split)`` for a ``--dataset`` value (None: embedded)."""
    if dataset is None:
        text, split = _read_local(EMBEDDED_FILE, EMBEDDED_NAME)
        return text, EMBEDDED_NAME, "validation"
    check_dataset(dataset)
    if dataset.startswith("hf:"):
        text, split = _read_hub(dataset)
        return text, dataset, split
    path = Path(dataset).expanduser()
    text, split = _read_local(path, dataset)
    return text, str(path.resolve()), split
