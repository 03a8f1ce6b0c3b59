"""Tuner: the search targets and what they share.

- the targets, one subpackage each, every one a :class:`~.target.Target` (its stages: settings,
  prepare, candidates, measure, choose, profile, export) in :data:`.registry.TARGETS`, run by
  :func:`.registry.search` (``kvtuner.search``) and ``kvtuner search --target``:
  :mod:`.pool` (per-layer K/V bits in kvtuner's packed format, an Optuna study over a
  sensitivity-pruned space), :mod:`.vllm` (the layers vLLM's ``--kv-cache-dtype-skip-layers``
  keeps at the model dtype), :mod:`.recipe` (a format per layer among those an engine serves);
- what they share: the study (:mod:`.study`: one opener for every target, resumable, a killed
  run's trials repaired), the model and text (:mod:`.loading`), the settings' checks
  (:mod:`.checks`), budget arithmetic (:mod:`.budget`), the exact knapsack (:mod:`.knapsack`),
  the additive optimum and local-search sampler the study seeds and samples with, the
  confirmation on held-back windows, the results and report tables, the sensitivity file, the
  KL of an engine plan (:mod:`.plan_kl`);
- the import of KVTuner's YAML configurations (:mod:`.import_kvtuner`). The exported-configs
  index generator is :mod:`kvtuner.profile.index` (it reads profiles only).
"""

from .budget import Budget, layer_bytes
from .knapsack import solve_knapsack

__all__ = ["Budget", "layer_bytes", "solve_knapsack"]
