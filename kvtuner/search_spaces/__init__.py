"""Search spaces: the memory budget, candidate (k_bits, v_bits) pairs, Pareto pruning, layer
clustering, presets."""

from .clustering import cluster_layers
from .losses import BITS, DEFAULT_BITS, LossTable
from .pareto import pareto_front
from .preset import PRESETS, SearchPreset, load_preset
from .space import Group, Pair, SearchSpace, build_space, pair_label, parse_pair

__all__ = [
    "BITS",
    "DEFAULT_BITS",
    "PRESETS",
    "Group",
    "LossTable",
    "Pair",
    "SearchPreset",
    "SearchSpace",
    "build_space",
    "cluster_layers",
    "load_preset",
    "pair_label",
    "pareto_front",
    "parse_pair",
]
