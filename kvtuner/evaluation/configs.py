"""EvalConfig: one row of an evaluation (fp, a uniform baseline, a profile, or HF's quanto cache).

Uniform baseline names (all asymmetric, group size 32, the ``QuantSpec`` default, so every config
pays the same metadata: 8 bytes of fp16 scale+zero per 32 elements = +1 bit per element):
- ``kvB``  = K and V at B bits, per-token (groups of 32 along head_dim), e.g. ``kv8 kv4 kv2``;
- ``kBvC`` = K at B bits, V at C bits, per-token, e.g. ``k8v4 k4v2``;
- ``kiviB`` = KIVI-style: keys per-channel (groups of 32 tokens), values per-token, both B bits;
  ``kivi-kBvC`` for unequal bits (e.g. ``kivi-k4v2``);
- a rotation prefix rotates over head_dim with a Hadamard matrix: ``had-`` K and V, ``hadk-``
  keys only (the ``per-token`` search preset's format), ``hadv-`` values only; it combines with
  KIVI-style keys after ``kivi-``: ``kivi-hadv-kv4`` = KIVI keys, rotated per-token values (the
  ``kivi-hadv`` search preset's format);
- ``prerope-`` (after ``kivi-``, before a rotation prefix) stores the keys before RoPE
  (``QuantSpec.pre_rope``): ``kivi-prerope-kv4``, ``kivi-prerope-hadv-kv3`` (the ``kivi-prerope``
  and ``kivi-prerope-hadv`` presets' formats).
Group 32 because the search presets and the SGLang pool use 32; a ``-gN`` suffix sets another
group for K and V: ``kivi-prerope-k4v3-g64`` (the ``kivi-prerope-g64`` preset's format; 64
tokens per key scale, 64 values per value scale); ``-gh`` a group of the model's head_dim, one
scale and zero per token-head (``k5v4-gh``, ``had-kv4-gh``: the ``per-token-head`` and
``per-token-head-had`` presets' formats).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import KVTunerError
from ..profile import LayerSpec, ModelFingerprint, Profile
from ..quant import QuantSpec

KINDS = ("fp", "uniform", "profile", "hf-quanto")
GROUP_SIZE = 32
DEFAULT_UNIFORM = ("kv8", "kv4", "kv2", "k8v4", "k4v2", "kivi4", "kivi2")
QUANTO_BITS = (4, 2)
_NAME = re.compile(
    r"^(kivi-)?(prerope-)?(?:(had|hadk|hadv)-)?(?:kv(\d+)|k(\d+)v(\d+))(?:-g(\d+|h))?$"
)
_ROTATED = {None: (), "had": ("k", "v"), "hadk": ("k",), "hadv": ("v",)}  # prefix -> tensors

__all__ = [
    "DEFAULT_UNIFORM",
    "EvalConfig",
    "check_uniform_name",
    "parse_uniform",
    "profile_config",
    "requested_configs",
    "uniform_specs",
]


@dataclass(frozen=True)
class EvalConfig:
    """``specs`` for uniform/profile rows, ``quanto_bits`` for the HF quanto peer, none for fp."""

    name: str
    kind: str
    specs: tuple[LayerSpec, ...] | None = None
    quanto_bits: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise KVTunerError(f"unknown evaluation kind {self.kind!r}")
        if (self.specs is not None) != (self.kind in ("uniform", "profile")):
            raise KVTunerError(f"{self.name}: layer specs go with uniform/profile rows only")
        if (self.quanto_bits is not None) != (self.kind == "hf-quanto"):
            raise KVTunerError(f"{self.name}: quanto bits go with hf-quanto rows only")
        if self.quanto_bits is not None and self.quanto_bits not in QUANTO_BITS:
            raise KVTunerError(f"quanto supports {QUANTO_BITS} bits, got {self.quanto_bits}")

    def specs_hash(self, fingerprint: ModelFingerprint) -> str | None:
        """The profile hash of this row's layer specs (None for fp and quanto rows)."""
        return None if self.specs is None else Profile(self.name, fingerprint, self.specs).hash

    def accounting(
        self, fingerprint: ModelFingerprint, context_length: int | None = None
    ) -> dict[str, float]:
        """Nominal and effective bits and KV bytes per token (all layers, K+V, metadata in);
        with ``context_length``, window layers hold at most window - 1 of its tokens."""
        if self.specs is not None:
            budget = {} if context_length is None else {"context_length": context_length}
            p = Profile(self.name, fingerprint, self.specs, budget=budget)
            return {
                "nominal_bits": p.nominal_bits,
                "effective_bits": p.effective_bits,
                "bytes_per_token": p.bytes_per_token,
            }
        n = context_length
        fp16 = fingerprint.fp16_bytes_per_token if n is None else fingerprint.fp16_bytes(n) / n
        if self.kind == "fp":
            return {"nominal_bits": 16.0, "effective_bits": 16.0, "bytes_per_token": float(fp16)}
        # quanto (fp32 model): codes + an fp32 scale and an fp32 shift per GROUP_SIZE elements;
        # evaluate_configs() replaces this with the bytes it measures on quanto's stored tensors
        bits = self.quanto_bits + 2 * 32 / GROUP_SIZE
        return {
            "nominal_bits": float(self.quanto_bits),
            "effective_bits": bits,
            "bytes_per_token": fp16 * bits / 16,
        }


def _spec(
    name: str,
    bits: int,
    axis: str = "token",
    rotation: str = "none",
    pre_rope: bool = False,
    group: int = GROUP_SIZE,
) -> QuantSpec:
    try:
        if bits == 16:
            return QuantSpec(16, group, False, "token", rotation)
        return QuantSpec(bits, group, False, axis, rotation, pre_rope)
    except ValueError as exc:
        raise KVTunerError(f"unknown uniform config {name!r}: {exc}") from None


def _uniform_formats(name: str, head_dim: int) -> tuple[QuantSpec, QuantSpec]:
    """(K, V) formats of a uniform baseline name; ``head_dim`` is the group of a ``-gh`` name."""
    key = name.strip().lower()
    key = re.sub(r"^kivi(\d+)$", r"kivi-kv\1", key)
    m = _NAME.match(key)
    if not m:
        raise KVTunerError(
            f"unknown uniform config {name!r} (use kvB, kBvC, kiviB, kivi-kBvC, optionally "
            "rotated: had-/hadk-/hadv-kvB, kivi-hadv-kvB, keys before RoPE: kivi-prerope-kvB; "
            "another group: a -gN suffix, -gh for head_dim; B, C in 2, 3, 4, 5, 6, 8, 16)"
        )
    kivi, prerope, rotation, both, kb, vb, group = m.groups()
    k_bits, v_bits = (int(both), int(both)) if both else (int(kb), int(vb))
    g = head_dim if group == "h" else int(group) if group else GROUP_SIZE
    rot = {t: "hadamard" if t in _ROTATED[rotation] else "none" for t in ("k", "v")}
    k = _spec(name, k_bits, "channel" if kivi else "token", rot["k"], bool(prerope), g)
    return k, _spec(name, v_bits, "token", rot["v"], group=g)


def check_uniform_name(name: str) -> None:
    """One line for a name that names no uniform baseline, before any model is known (whether
    its group fits the model's head_dim is checked by :func:`uniform_specs`)."""
    _uniform_formats(name, GROUP_SIZE)


def uniform_specs(name: str, fingerprint: ModelFingerprint) -> tuple[LayerSpec, ...]:
    """Layer specs of a uniform baseline name (see the module docstring)."""
    k, v = _uniform_formats(name, fingerprint.head_dim)
    return tuple(LayerSpec(i, k, v) for i in range(fingerprint.num_layers))


def parse_uniform(names: str | list[str], fingerprint: ModelFingerprint) -> list[EvalConfig]:
    """``"kv8,kv4"`` (or a list of such strings) -> uniform EvalConfigs, order kept, no repeats."""
    items = names if isinstance(names, list) else [names]
    flat = [n.strip() for item in items for n in item.split(",") if n.strip()]
    seen: dict[str, EvalConfig] = {}
    for n in flat:
        seen.setdefault(n.lower(), EvalConfig(n.lower(), "uniform", uniform_specs(n, fingerprint)))
    return list(seen.values())


def profile_config(path: str, model_config: Any) -> EvalConfig:
    """A profile file as an evaluation row, validated against the model (one-line errors)."""
    from pathlib import Path

    from ..profile import load_profile

    profile = load_profile(path, model_config)
    return EvalConfig(Path(path).stem, "profile", profile.layers, source=str(path))


def _quanto_rows(mode: str, fingerprint: ModelFingerprint) -> list[EvalConfig]:
    """HF quanto peers: ``off`` none; ``auto`` where transformers runs them; ``on`` or fail."""
    from .quanto import quanto_missing

    if mode == "off":
        return []
    missing = quanto_missing()
    if fingerprint.layer_types is not None:
        missing = "transformers' QuantizedCache refuses sliding-window layers"
    if missing:
        if mode == "on":
            raise KVTunerError(f"--hf-quanto on: {missing}")
        return []
    return [EvalConfig(f"hf-quanto{b}", "hf-quanto", quanto_bits=b) for b in QUANTO_BITS]


def requested_configs(
    profiles: tuple[str, ...],
    uniform: tuple[str, ...],
    hf_quanto: str,
    fingerprint: ModelFingerprint,
) -> list[EvalConfig]:
    """Every requested row, validated against the model's fingerprint (before loading weights):
    the profiles, the uniform baselines, then the HF quanto peers (``auto``/``on``/``off``)."""
    configs = [profile_config(p, fingerprint) for p in profiles]
    configs += parse_uniform(list(uniform), fingerprint) if uniform else []
    configs += _quanto_rows(hf_quanto, fingerprint)
    names = [c.name for c in configs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise KVTunerError(f"two configs share the name {dupes[0]!r}; rename a profile file")
    return configs
