"""The scheduler-side hooks that put the kvtuner pool in SGLang's place and keep it informed.

- ``KVCacheConfigurator._resolve_kv_pool_class`` (around, :func:`pool_class_hook`): the MHA pool
  class becomes :class:`KVTunerMHATokenToKVPool` bound to the profile and the read mode;
  unsupported setups are refused here.
- ``PagedTokenToKVPoolAllocator._release_page_ids`` / ``clear`` (after): freed pages drop their
  staged values (:meth:`KVTunerMHATokenToKVPool.release_pages`).
- ``ModelRunner._forward_raw`` (before, :func:`before_forward`): tells the pool which slots the
  batch reads, and the positions of the slots it writes (pre-RoPE keys).
- ``hybrid_pool_assembler._mha_host_inputs`` (around, :func:`host_pool_class_hook`): HiCache's
  host pool class.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ....errors import KVTunerError
from ..pool.cell_size import read_mode
from ..pool.lazy_reads.batch_reads import batch_read_slots
from ..pool.slot_rope import pre_rope_frequencies
from ..swa.sub_pools import kvtuner_sub_pools
from .capacity import scheduler_profile, stage_pages
from .check import prove_hooks
from .server_flag import decode_cache_tokens

logger = logging.getLogger(__name__)

__all__ = [
    "allocator_cleared",
    "before_forward",
    "host_pool_class_hook",
    "pages_released",
    "pool_class_hook",
]


def pages_released(result: Any, allocator: Any, *page_ids: torch.Tensor) -> None:
    pool = _kvtuner_pool(allocator)
    if pool is not None and page_ids:
        pool.release_pages(*page_ids)


def allocator_cleared(result: Any, allocator: Any) -> None:
    pool = _kvtuner_pool(allocator)
    if pool is not None:
        pool.clear_staging()


def _kvtuner_pool(allocator: Any):
    from ..pool.store import KVTunerMHATokenToKVPool

    pool = getattr(allocator, "_kvcache", None)
    return pool if isinstance(pool, KVTunerMHATokenToKVPool) else None


def pool_class_hook(original: Any, self: Any, *, kind: str, default: type) -> type:
    pool_cls = original(self, kind=kind, default=default)
    profile = scheduler_profile(self)
    if profile is None or kind != "mha":
        return pool_cls
    prove_hooks()  # a scheduler process: its own SGLang modules, hooked by its load_plugins
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from ..pool.store import KVTunerMHATokenToKVPool

    if pool_cls is not MHATokenToKVPool:
        raise KVTunerError(
            f"--kvtuner-profile needs SGLang's MHATokenToKVPool, but this "
            f"platform/layout selects {pool_cls.__name__}"
        )
    return KVTunerMHATokenToKVPool.bound(
        profile,
        read_mode(self.server_args),
        decode_cache_tokens(),
        stage_pages(self.server_args),
        pre_rope_frequencies(profile, self.model),
    )


def host_pool_class_hook(original: Any, *args: Any, **kwargs: Any) -> tuple:
    """HiCache's MHA host pool: packed rows for a kvtuner device pool; on SGLang's CPU engine,
    SGLang's own pool with unpinned memory and index copies (it has no CPU transfers)."""
    host_cls, info, host_kwargs = original(*args, **kwargs)
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    from ..hicache.host_pool import KVTunerMHATokenToKVPoolHost
    from ..hicache.host_transfers import CpuMHATokenToKVPoolHost
    from ..pool.store import KVTunerMHATokenToKVPool

    device_pool = args[0] if args else kwargs["pool"]
    if isinstance(device_pool, KVTunerMHATokenToKVPool):
        host_cls = KVTunerMHATokenToKVPoolHost.bound(
            device_pool.profile.hash, device_pool.storage_layout()
        )
    elif host_cls is MHATokenToKVPoolHost and info.device.type == "cpu":
        host_cls = CpuMHATokenToKVPoolHost
    logger.info("kvtuner: HiCache host pool %s", host_cls.__name__)
    return host_cls, info, host_kwargs


def before_forward(self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> None:
    """Pre-RoPE keys learn the positions of the slots the batch writes; the lazy and scratch
    read modes learn which slots it reads."""
    pools = kvtuner_sub_pools(getattr(self, "token_to_kv_pool", None))
    if not pools:
        return
    for pool in pools:
        pool.note_positions(forward_batch)
    if pools[0].read_mode == "packed":
        return
    slots = batch_read_slots(forward_batch, self.req_to_token_pool.req_to_token)
    for pool in pools:  # a window sub-pool translates the full-pool slots itself
        pool.prepare_reads(slots)
