"""A small search problem whose measured objective is not additive (shared by the study tests
and the subprocess the resume test kills)."""

from __future__ import annotations

import time

import numpy as np

from kvtuner import ModelFingerprint
from kvtuner.search_spaces import BITS, PRESETS, LossTable, build_space
from kvtuner.tuner import Budget

FP = ModelFingerprint("LlamaForCausalLM", num_layers=8, num_kv_heads=2, head_dim=64)


def losses(num_layers: int = 8) -> LossTable:
    rng = np.random.default_rng(1)
    kl = np.zeros((num_layers, 2, len(BITS)))
    for i in range(num_layers):
        base = rng.uniform(0.2, 3.0)
        kl[i, 0, :3] = 3 * base * np.array([1.0, 0.1, 0.004])
        kl[i, 1, :3] = base * np.array([1.0, 0.08, 0.003])
    return LossTable(kl)


def space(budget: str = "4bit", preset: str = "per-token"):
    return build_space(losses(), PRESETS[preset], FP, Budget.parse(budget))


def evaluate_factory(delay: float = 0.0):
    """The "truth" differs from the sensitivity table the space was pruned with: each layer's K
    and V matter up to ~3x more or less in context, and 2-bit keys compound (an interaction)."""
    table = losses()
    skew = np.exp(np.random.default_rng(7).normal(0.0, 0.8, size=(table.num_layers, 2)))

    def evaluate(specs) -> float:
        time.sleep(delay)
        kl = table.kl
        total = sum(
            skew[s.layer, 0] * kl[s.layer, 0, BITS.index(s.k.bits)]
            + skew[s.layer, 1] * kl[s.layer, 1, BITS.index(s.v.bits)]
            for s in specs
        )
        two_bit_keys = sum(s.k.bits == 2 for s in specs) / len(specs)
        return float(total * (1.0 + 0.5 * two_bit_keys))

    return evaluate
