"""Capacity hooks of the plugin: the bytes per token SGLang divides its KV budget by.

- ``DefaultPoolConfigurator._compute_cell_size`` (around, :func:`cell_size_hook`): the profile's
  packed bytes (plus the read scratch in "scratch" read mode).
- ``DefaultPoolConfigurator.calculate_pool_sizes`` (around, :func:`pool_sizes_hook`): the fp
  staging of channel-axis (KIVI) sides comes off the KV budget first.
- ``HybridSWAPoolConfigurator.__init__`` / ``_full_cell_bytes`` / ``_swa_cell_bytes`` (around,
  :func:`swa_configurator_init`, :func:`full_cell_hook`, :func:`swa_cell_hook`): with SGLang's
  separate sliding-window pool, a full token costs the full layers' packed bytes and a window
  token the window layers' packed bytes (:func:`..swa.sub_pools.sub_pool_cells`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ....profile import Profile
from ..pool.cell_size import cell_size, read_mode, stage_pages_for, staging_bytes
from ..swa.sub_pools import SubPoolCells, sub_pool_cells
from .profile_env import active_profile
from .refusals import check_configurator

logger = logging.getLogger(__name__)

__all__ = [
    "cell_size_hook",
    "full_cell_hook",
    "pool_sizes_hook",
    "scheduler_profile",
    "stage_pages",
    "swa_cell_hook",
    "swa_configurator_init",
]


def scheduler_profile(kvc: Any) -> Profile | None:
    """The active profile, checked against the loaded model and the configuration."""
    profile = active_profile(kvc.model_config.hf_config)
    if profile is not None:
        check_configurator(kvc, profile)
    return profile


def cell_size_hook(original: Any, self: Any, kvc: Any, num_layers: int) -> int:
    stock = original(self, kvc, num_layers)
    profile = scheduler_profile(kvc)
    if profile is None:
        logger.info("kvtuner: no profile; SGLang KV cell size %d B/token", stock)
        return stock
    mode = read_mode(kvc.server_args)
    shape = dict(
        heads=_kv_heads(kvc),
        start_layer=kvc.layer_info.start_layer,
        num_layers=num_layers,
        dtype_bytes=torch._utils._element_size(kvc.kv_cache_dtype),
    )
    cell = cell_size(profile, **shape, read_mode=mode)
    # taken off the KV budget by _pool_sizes_hook (a fixed cost, not per token)
    self._kvtuner_staging_bytes = staging_bytes(
        profile, **shape, stage_pages=stage_pages(kvc.server_args)
    )
    logger.info(
        "kvtuner: KV cell size %d B/token (packed %d + read scratch %d + pre-RoPE positions "
        "%d, %s reads) instead of SGLang's %d B/token: %.2fx tokens for the same bytes",
        cell.total,
        cell.packed,
        cell.scratch,
        cell.positions,
        mode,
        stock,
        stock / cell.total,
    )
    if self._kvtuner_staging_bytes:
        logger.info(
            "kvtuner: fp staging of filling channel-axis pages: %d bytes (%d pages per side), "
            "taken off the KV budget",
            self._kvtuner_staging_bytes,
            stage_pages(kvc.server_args),
        )
    return cell.total


def stage_pages(server_args: Any) -> int:
    """Staged pages per channel-axis side (0 when --max-running-requests is not given: then
    the profile has no channel-axis side, see check_staging_bound)."""
    limit = server_args.max_running_requests
    return 0 if limit is None else stage_pages_for(limit)


def pool_sizes_hook(original: Any, self: Any, available_bytes: int, page_size: int) -> Any:
    staging = getattr(self, "_kvtuner_staging_bytes", 0)
    return original(self, max(available_bytes - staging, 0), page_size)


def _kv_heads(kvc: Any) -> int:
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    return kvc.model_config.get_num_kv_heads(par.attn_tp_size, par.attn_dcp_size)


def swa_configurator_init(original: Any, self: Any, kvc: Any) -> None:
    """Before SGLang prices its two pools, note each sub-pool's packed bytes per token."""
    profile = scheduler_profile(kvc)
    self._kvtuner_cells = None
    if profile is not None:
        self._kvtuner_cells = sub_pool_cells(
            profile,
            heads=_kv_heads(kvc),
            dtype_bytes=torch._utils._element_size(kvc.kv_cache_dtype),
            full_ids=list(kvc.layer_info.full_attention_layer_ids),
            swa_ids=list(kvc.layer_info.swa_attention_layer_ids),
        )
    original(self, kvc)
    if self._kvtuner_cells is not None:
        _log_swa_cells(self._kvtuner_cells, self)


def _log_swa_cells(cells: SubPoolCells, conf: Any) -> None:
    logger.info(
        "kvtuner: SWAKVPool cell sizes: full %d B/token (%d layers), window %d B/token "
        "(%d layers) instead of SGLang's %d and %d",
        cells.full,
        conf._full_layers_num,
        cells.swa,
        conf._swa_layers_num,
        conf._full_per_token * conf._full_layers_num,
        conf._swa_per_token * conf._swa_layers_num,
    )


def full_cell_hook(original: Any, self: Any) -> int:
    cells = getattr(self, "_kvtuner_cells", None)
    return original(self) if cells is None else cells.full


def swa_cell_hook(original: Any, self: Any) -> int:
    cells = getattr(self, "_kvtuner_cells", None)
    return original(self) if cells is None else cells.swa
