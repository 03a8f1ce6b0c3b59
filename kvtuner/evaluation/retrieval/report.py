"""The retrieval report as JSON (atomic write)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["write_retrieval_report"]


def write_retrieval_report(report: dict[str, Any], path: str | os.PathLike) -> Path:
    from ...profile import write_json_atomic

    write_json_atomic(path, report)
    return Path(path)
