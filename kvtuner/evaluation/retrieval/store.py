"""The results file of a retrieval run: JSON lines, one per answered sample, for resume.

Line 1 is the run's settings (model, task, haystack, seed, cache settings, chat); every other
line one answered sample, keyed by (config name, layer-specs hash, length, depth, index). A rerun
with the same file skips the keys it holds; a file written under other settings is refused (its
answers would not be comparable). A line is appended and flushed whole once its answer is
scored, so an interrupted run loses at most the sample in flight (a torn last line is dropped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import KVTunerError

FORMAT = "kvtuner-retrieval-results"

__all__ = ["ResultsFile", "record_key"]


def record_key(r: dict[str, Any]) -> tuple:
    return (r["config"], r["hash"], r["length"], round(float(r["depth"]), 6), r["sample"])


class ResultsFile:
    """Answered samples of one run, in memory and (when ``path`` is given) on disk."""

    def __init__(self, path: str | Path | None, settings: dict[str, Any]):
        self.path = None if path is None else Path(path)
        self.settings = settings
        self.records: dict[tuple, dict[str, Any]] = {}
        if self.path is not None and self.path.exists():
            self._load()
        elif self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_line({"format": FORMAT, "version": 1, "settings": settings}, mode="w")

    def _load(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            head = {}
        if head.get("format") != FORMAT:
            raise KVTunerError(f"{self.path} is not a kvtuner retrieval results file")
        if head.get("settings") != self.settings:
            diff = sorted(
                k for k in {*self.settings, *head["settings"]}
                if self.settings.get(k) != head["settings"].get(k)
            )  # fmt: skip
            raise KVTunerError(
                f"{self.path} was written with other settings ({', '.join(diff)}); "
                "pass another --results file"
            )
        for i, line in enumerate(lines[1:], start=2):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines):
                    continue  # torn last line of an interrupted run
                raise KVTunerError(f"{self.path}:{i}: not a JSON line") from None
            self.records[record_key(r)] = r

    def _write_line(self, obj: dict[str, Any], mode: str = "a") -> None:
        with open(self.path, mode, encoding="utf-8") as f:
            f.write(json.dumps(obj, sort_keys=True) + "\n")
            f.flush()

    def has(self, key: tuple) -> bool:
        return key in self.records

    def add(self, record: dict[str, Any]) -> None:
        self.records[record_key(record)] = record
        if self.path is not None:
            self._write_line(record)
