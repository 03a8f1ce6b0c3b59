"""On-disk cache of sweep results: one JSON file per layer, written atomically.

Keyed by everything the numbers depend on: model fingerprint and a digest of its weights, the
calibration token ids, bits and the spec template of the tensor measured (K and V are cached as
separate halves, see :class:`SideCache`). A re-run with the same key reads every
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

__all__ = ["SideCache", "SweepCache", "default_cache_dir", "weights_digest"]


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

    @staticmethod
    def read_dir(folder: Path, name: str) -> Any:
        try:
            return json.loads((folder / name).read_text())
        except (OSError, ValueError):
            return None  # absent or unreadable: measure again

    def _read(self, name: str) -> Any:
        return self.read_dir(self.dir, name)

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


class SideCache:
    """The K or the V half of a sweep, cached on its own: one tensor's sensitivity depends only
    on its own spec (the other tensor stays fp while it is measured), so presets that share a
    value spec (or a key spec) share that half. Also reads the half it needs from a combined
    K+V cache of an earlier kvtuner version, when that cache's facts match."""

    def __init__(self, root: str | os.PathLike, common: dict[str, Any], part: str, spec: dict):
        self.part = part
        self.own = SweepCache(root, {**common, "part": part, "spec": spec})
        self.legacy = _legacy_dirs(Path(root), common, part, spec)

    def layer(self, layer: int) -> dict[str, Any] | None:
        """This half of layer ``layer``'s entry (``{bits: {...}}``), None if not measured."""
        entry = self.own.layer(layer)
        if entry is not None:
            return entry.get(self.part)
        for folder in self.legacy:
            entry = SweepCache.read_dir(folder, f"layer_{layer}.json")
            if isinstance(entry, dict) and entry.get("layer") == layer and self.part in entry:
                return entry[self.part]
        return None

    def put_layer(self, layer: int, half: dict[str, Any]) -> None:
        self.own.put_layer(layer, {"layer": layer, self.part: half})

    def fp_ppl(self) -> float | None:
        ppl = self.own.fp_ppl()
        for folder in self.legacy if ppl is None else ():
            doc = SweepCache.read_dir(folder, "fp.json")
            ppl = doc.get("ppl") if isinstance(doc, dict) else None
            if ppl is not None:
                break
        return ppl

    def put_fp_ppl(self, ppl: float) -> None:
        self.own.put_fp_ppl(ppl)


def _legacy_dirs(root: Path, common: dict[str, Any], part: str, spec: dict) -> list[Path]:
    """Combined K+V cache folders (key.json without "part") whose facts give this half."""
    spec_name = "key_spec" if part == "k" else "value_spec"
    want = {"measure_version": MEASURE_VERSION, **common, spec_name: spec}
    found = []
    for key_file in sorted((root / "sensitivity").glob("*/key.json")):
        facts = SweepCache.read_dir(key_file.parent, "key.json")
        if not isinstance(facts, dict) or "part" in facts:
            continue
        if part == "v":  # the key side's smoothing does not touch the values
            facts = {k: v for k, v in facts.items() if k != "key_smoothing"}
        mine = {k: v for k, v in facts.items() if k not in ("key_spec", "value_spec")}
        mine[spec_name] = facts.get(spec_name)
        if mine == want:
            found.append(key_file.parent)
    return found
