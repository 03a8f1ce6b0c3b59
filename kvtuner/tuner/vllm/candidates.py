"""Which vLLM skip sets the study measures, and the rule that proposed each.

A skip set is a sorted tuple of layers kept at the model dtype (the rest in the vLLM dtype).
Ranking layers by single-layer sensitivity (KL with only layer l in D) assumes their damage adds
up; it need not (errors compound through later layers), and two cheap rules from practice,
vLLM's boundary layers and the largest keys, cost a trial each. So four rules propose sets, and
the study measures them all (on SmolLM2's int4_per_token_head greedy found a set of lower
calibration KL that the additive rule missed, which confirmation did not keep; on Qwen2.5 all
four agree; docs/results/vllm.md):

- ``additive``: the k most sensitive layers, k = cap..0, and swaps of its least sensitive member;
- ``greedy``: forward selection from D on every layer, each step adding the layer whose skip
  lowers the measured KL most (interactions included, sum(L - j) sets for j < cap);
- ``boundary``: the first ceil(k/2) and last floor(k/2) layers, k = cap;
- ``largest-keys``: the cap layers whose fp keys reach the largest |k| (fp8 saturates there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["additive", "boundary", "greedy", "largest_keys", "merge_rules"]

Skip = tuple[int, ...]
MeasureAll = Callable[[list[Skip]], dict[Skip, float]]


def additive(order: Sequence[int], cap: int, limit: int) -> list[Skip]:
    """At most ``limit`` sets: top-k of ``order`` (most sensitive first) for k = cap and cap - 1,
    the top-cap set with its least sensitive member swapped for each next layer, then k < cap - 1;
    D on every layer (no skip) first, always."""
    seeds = [tuple(sorted(order[:k])) for k in range(cap, -1, -1)]
    swaps = [tuple(sorted([*order[: cap - 1], order[j]])) for j in range(cap, len(order))]
    if cap == 0:
        swaps = []
    unique = list(dict.fromkeys([(), *seeds[:2], *swaps, *seeds[2:]]))
    return unique[: max(limit, 2)]


def boundary(num_layers: int, cap: int) -> list[Skip]:
    """The first ceil(cap/2) and the last floor(cap/2) layers: where attention sinks and the
    output head make the cache most fragile."""
    head = list(range((cap + 1) // 2))
    tail = list(range(num_layers - cap // 2, num_layers))
    return [tuple(sorted({*head, *tail}))] if cap > 0 else []


def largest_keys(key_peaks: Sequence[float], cap: int) -> list[Skip]:
    """The ``cap`` layers with the largest fp max|k| (``key_peaks``: one float per layer)."""
    if cap <= 0:
        return []
    order = sorted(range(len(key_peaks)), key=lambda i: (-key_peaks[i], i))
    return [tuple(sorted(order[:cap]))]


def greedy(measure_all: MeasureAll, num_layers: int, cap: int, log) -> list[Skip]:
    """Forward selection from D on every layer: the best set of each size 1..cap. Stops early
    when no further layer lowers the KL. ``measure_all`` measures a batch of sets (cached) and
    returns the KL of every set measured so far."""
    chain: list[Skip] = []
    current: Skip = ()
    measured = measure_all([current])
    for size in range(1, cap + 1):
        batch = [tuple(sorted({*current, i})) for i in range(num_layers) if i not in current]
        measured = measure_all(batch)
        best = min(batch, key=lambda s: (measured[s], s))
        if measured[best] >= measured[current]:
            log(f"greedy: no layer lowers the KL past {size - 1} skipped")
            break
        current = best
        chain.append(current)
        log(f"greedy: skip {list(current)} -> KL {measured[current]:.5g}")
    return chain


def merge_rules(proposals: dict[str, list[Skip]]) -> dict[Skip, str]:
    """Every proposed set once, with the rules that proposed it (``"greedy+boundary"``)."""
    rules: dict[Skip, list[str]] = {}
    for rule, sets in proposals.items():
        for skip in sets:
            rules.setdefault(skip, []).append(rule)
    return {skip: "+".join(names) for skip, names in rules.items()}
