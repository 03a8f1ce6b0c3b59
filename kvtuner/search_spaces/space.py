"""SearchSpace: groups of layers, each choosing one (k_bits, v_bits) pair from its options.

Options per group = the Pareto-optimal pairs (additive loss vs budget cost) plus every pair whose
uniform configuration fits the budget (so uniform baselines are points of the space).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import product

from ..errors import KVTunerError
from ..profile import LayerSpec, ModelFingerprint
from .budget import Budget
from .clustering import cluster_layers
from .losses import LossTable
from .pareto import pareto_front
from .preset import SearchPreset

__all__ = ["Group", "Pair", "SearchSpace", "build_space", "pair_label", "parse_pair"]

Pair = tuple[int, int]  # (k_bits, v_bits)


def pair_label(pair: Pair) -> str:
    return f"k{pair[0]}v{pair[1]}"


def parse_pair(label: str) -> Pair:
    k, v = label[1:].split("v")
    return int(k), int(v)


@dataclass(frozen=True)
class Group:
    """Layers that share one pair, and the pairs they may choose (cheapest first)."""

    layers: tuple[int, ...]
    options: tuple[Pair, ...]

    def __post_init__(self) -> None:
        if not self.layers or not self.options:
            raise KVTunerError("a search group needs layers and options")


@dataclass(frozen=True, eq=False)
class SearchSpace:
    preset: SearchPreset
    fingerprint: ModelFingerprint
    budget: Budget
    losses: LossTable
    groups: tuple[Group, ...]
    uniform_pairs: tuple[Pair, ...]  # uniform configurations that fit the budget
    widths: tuple[int, ...] = ()  # the bits pairs were drawn from (before pruning)

    def __post_init__(self) -> None:
        covered = sorted(i for g in self.groups for i in g.layers)
        if covered != list(range(self.fingerprint.num_layers)):
            raise KVTunerError("search groups must cover every layer exactly once")
        object.__setattr__(self, "_memo", {})

    def param_name(self, index: int) -> str:
        return f"g{index:02d}"

    def layer_specs(self, choice: Sequence[Pair]) -> tuple[LayerSpec, ...]:
        by_layer = {i: pair for g, pair in zip(self.groups, choice, strict=True) for i in g.layers}
        return tuple(self.preset.layer_spec(i, *by_layer[i]) for i in sorted(by_layer))

    def cost(self, group: int, pair: Pair) -> Fraction:
        """Exact budget cost of ``pair`` on every layer of the group (memoised: hot in repair)."""
        key = (group, pair)
        if key not in self._memo:
            layers = self.groups[group].layers
            self._memo[key] = sum(
                (
                    self.budget.layer_cost(self.preset.layer_spec(i, *pair), self.fingerprint)
                    for i in layers
                ),
                Fraction(0),
            )
        return self._memo[key]

    def loss(self, group: int, pair: Pair) -> float:
        return self.losses.group_loss(self.groups[group].layers, *pair)

    def total_cost(self, choice: Sequence[Pair]) -> Fraction:
        return sum((self.cost(i, p) for i, p in enumerate(choice)), Fraction(0))

    def fits(self, choice: Sequence[Pair]) -> bool:
        return self.total_cost(choice) <= self.budget.capacity(self.fingerprint)

    def uniform(self, pair: Pair) -> tuple[Pair, ...]:
        return tuple(pair for _ in self.groups)

    def to_params(self, choice: Sequence[Pair]) -> dict[str, str]:
        return {self.param_name(i): pair_label(p) for i, p in enumerate(choice)}

    def from_params(self, params: dict[str, str]) -> tuple[Pair, ...]:
        return tuple(parse_pair(params[self.param_name(i)]) for i in range(len(self.groups)))

    def describe(self) -> dict:
        described = {
            "preset": self.preset.to_dict(),
            "budget": self.budget.label,
            "widths": list(self.widths),
            "groups": [
                {"layers": list(g.layers), "options": [pair_label(p) for p in g.options]}
                for g in self.groups
            ],
        }
        if self.budget.context_length is not None:  # window layers weigh by it
            described["context_length"] = self.budget.context_length
        return described

    @property
    def hash(self) -> str:
        """Identifies the space (a resumed optuna study must have the same distributions)."""
        canon = json.dumps(self.describe(), sort_keys=True) + self.fingerprint.hash
        return hashlib.sha256(canon.encode()).hexdigest()[:8]


def build_space(
    losses: LossTable,
    preset: SearchPreset,
    fingerprint: ModelFingerprint,
    budget: Budget,
    *,
    num_clusters: int | None = None,
    bits: Sequence[int] | None = None,
) -> SearchSpace:
    """Per-layer (or per-cluster) Pareto-pruned pairs from ``bits`` x ``bits`` (default: every
    width the loss table holds); raises if nothing fits the budget."""
    if losses.num_layers != fingerprint.num_layers:
        raise KVTunerError(
            f"sensitivity covers {losses.num_layers} layers, the model has {fingerprint.num_layers}"
        )
    layers = (
        cluster_layers(losses, num_clusters)
        if num_clusters
        else [[i] for i in range(fingerprint.num_layers)]
    )
    widths = tuple(sorted({*(losses.bits if bits is None else bits), 16}))
    missing = [b for b in widths if b not in losses.bits]
    if missing:
        raise KVTunerError(
            f"the sensitivity holds bits {losses.bits[:-1]}, not {missing}: calibrate those widths"
        )
    pairs = list(product(widths, repeat=2))
    capacity = budget.capacity(fingerprint)
    draft = SearchSpace(
        preset,
        fingerprint,
        budget,
        losses,
        tuple(Group(tuple(g), tuple(pairs)) for g in layers),
        (),
        widths,
    )
    uniform = tuple(p for p in pairs if draft.total_cost(draft.uniform(p)) <= capacity)
    groups = tuple(_prune(draft, i, uniform) for i in range(len(layers)))
    space = SearchSpace(preset, fingerprint, budget, losses, groups, uniform, widths)
    cheapest = tuple(g.options[0] for g in groups)
    if not space.fits(cheapest):
        need = float(space.total_cost(cheapest))
        raise KVTunerError(
            f"budget {budget.label} is below the cheapest configuration "
            f"({need:g} vs capacity {float(capacity):g})"
        )
    return space


def _prune(draft: SearchSpace, index: int, uniform: Sequence[Pair]) -> Group:
    items = [(draft.cost(index, p), draft.loss(index, p), p) for p in draft.groups[index].options]
    kept = set(pareto_front(items)) | set(uniform)
    options = sorted(kept, key=lambda p: (draft.cost(index, p), draft.loss(index, p), p))
    return Group(draft.groups[index].layers, tuple(options))
