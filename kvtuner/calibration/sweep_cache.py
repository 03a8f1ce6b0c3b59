"""On-disk cache of sweep results: one JSON file per layer, written atomically.

Keyed by everything the numbers depend on: model fingerprint and a digest of its weights, the
calibration token ids, bits and K/V spec templates. A re-run with the same key reads every
layer back (no forward pass); an interrupted run keeps the layers it finished.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..profile import write_json_atomic

MEASURE_VERSION = 1  # bump when the measurement itself changes meaning
_SAMPLE = 256  # leading values per parameter that enter the weights digest

__all__ = ["SweepCache", "default_cache_dir", "weights_digest"]


def default_cache_dir() -> Path:
    """``$KVTUNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvtuner``, else ``~/.cache/kvtuner``."""
    if os.environ.get("KVTUNER_CACHE_DIR"):
        return Path(os.environ["KVTUNER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvtuner"


@torch.inference_mode()
def weights_digest(model) -> str:
    """Cheap identity of the weights: name, shape, dtype and leading values of every parameter
    (two checkpoints of one architecture must not share cached results)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        h.update(p.detach().reshape(-1)[:_SAMPLE].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class SweepCache:
    """``root/<key hash>/`` holding key.json, fp.json and layer_<l>.json."""

    def __init__(self, root: str | os.PathLike, key: dict[str, Any]):
        facts = {"measure_version": MEASURE_VERSION, **key}
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]
        self.dir = Path(root) / "sensitivity" / digest
        self.key = facts

    def _read(self, name: str) -> Any:
        try:
            return json.loads((self.dir / name).read_text())
        except (OSError, ValueError):
            return None  # absent or unreadable: measure again

    def _write(self, name: str, data: Any) -> None:
        if not (self.dir / "key.json").exists():
            write_json_atomic(self.dir / "key.json", self.key)
        write_json_atomic(self.dir / name, data)

    def layer(self, layer: int) -> dict[str, Any] | None:
        entry = self._read(f"layer_{layer}.json")
        return entry if isinstance(entry, dict) and entry.get("layer") == layer else None

    def put_layer(self, layer: int, entry: dict[str, Any]) -> None:
        self._write(f"layer_{layer}.json", entry)

    def fp_ppl(self) -> float | None:
        doc = self._read("fp.json")
        return doc.get("ppl") if isinstance(doc, dict) else None

    def put_fp_ppl(self, ppl: float) -> None:
        self._write("fp.json", {"ppl": ppl})
