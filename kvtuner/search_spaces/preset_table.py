"""The one list of search presets, written out: the CLI's ``--preset`` help and the docs table
(docs/search.md, between the ``presets`` markers) are both generated from :data:`PRESETS`, so
they cannot disagree with it (tests/search_spaces/test_preset_table.py checks the docs)."""

from __future__ import annotations

from ..quant.spec import QuantSpec
from .preset import PRESETS, SearchPreset

__all__ = ["DOCS_BEGIN", "DOCS_END", "preset_help", "presets_markdown"]

DOCS_BEGIN = "<!-- presets: generated from PRESETS by kvtuner.search_spaces.preset_table -->"
DOCS_END = "<!-- presets: end -->"


def _side(spec: QuantSpec, per_head: bool = False) -> str:
    """One template in words, e.g. "token axis, group 32, Hadamard"."""
    unit = "tokens" if spec.axis == "channel" else "values"
    group = "head_dim" if per_head else str(spec.group_size)
    parts = [f"{spec.axis} axis", f"groups of {group} {unit}"]
    if spec.rotation != "none":
        parts.append(f"{spec.rotation} rotated")
    if spec.pre_rope:
        parts.append("stored before RoPE")
    parts.append("symmetric" if spec.symmetric else "asymmetric")
    return ", ".join(parts)


def _sglang(preset: SearchPreset) -> str:
    if preset.servable_by_sglang:
        return "yes, any `--page-size`"
    sizes = {s.group_size for s in (preset.key, preset.value) if s.axis == "channel"}
    return f"yes, with `--page-size {'/'.join(map(str, sorted(sizes)))}`"


def presets_markdown() -> str:
    """The docs table of every preset (name, keys, values, key smoothing, SGLang)."""
    rows = [
        "| preset | keys | values | key smoothing | SGLang |",
        "|---|---|---|---|---|",
    ]
    for name, p in PRESETS.items():
        smoothing = f"α = {p.smooth_alpha}" if p.smooth_alpha is not None else "no"
        rows.append(
            f"| `{name}` | {_side(p.key, p.group_per_head)} | {_side(p.value, p.group_per_head)} "
            f"| {smoothing} | {_sglang(p)} |"
        )
    return "\n".join(rows)


def preset_help(default: str) -> str:
    """``--preset`` help: every named preset, grouped by how SGLang serves it."""
    any_page = [n for n, p in PRESETS.items() if p.servable_by_sglang]
    paged = [n for n, p in PRESETS.items() if not p.servable_by_sglang]
    return (
        f"a named preset (default {default}): {', '.join(any_page)} (SGLang-servable at any "
        f"page size); {', '.join(paged)} (channel-axis keys: SGLang with --page-size = their "
        "group); or a JSON file of specs (table: docs/search.md)"
    )
