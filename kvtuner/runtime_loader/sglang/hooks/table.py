"""Every hook the SGLang plugin registers through SGLang's ``HookRegistry``, applied by
``load_plugins()`` in the launcher and in every scheduler.

- ``ServerArgs.add_cli_args`` (after): adds ``--kvtuner-profile PATH``.
- ``ServerArgs.from_cli_args`` (after): makes the path absolute, exports it to child processes
  (``KVTUNER_PROFILE``) and checks the profile against the model's config before anything starts;
  a bad profile prints one line and exits 2.
- ``DefaultPoolConfigurator._compute_cell_size`` / ``calculate_pool_sizes`` and
  ``HybridSWAPoolConfigurator``'s cell prices (around, :mod:`.capacity`): the bytes per token
  SGLang divides its KV budget by become the profile's packed bytes.
- ``SWAKVPool.__init__`` (around, :mod:`..swa.sub_pools`): SGLang's separate sliding-window
  pool gets two kvtuner sub-pools, each bound to its layers' global ids; the window one
  translates reads.
- ``PagedTokenToKVPoolAllocator._release_page_ids`` / ``clear`` (after): freed pages drop their
  staged values (:meth:`KVTunerMHATokenToKVPool.release_pages`).
- ``KVCacheConfigurator._resolve_kv_pool_class`` (around): the MHA pool class becomes
  :class:`KVTunerMHATokenToKVPool` bound to the profile and the read mode; unsupported setups are
  refused here.
- ``ModelRunner._forward_raw`` (before): tells the pool which slots the batch reads, and the
  positions of the slots it writes (pre-RoPE keys, :mod:`..pool.slot_rope`).
- ``hybrid_pool_assembler._mha_host_inputs`` (around): with ``--enable-hierarchical-cache``,
  the host pool of a kvtuner pool is :class:`KVTunerMHATokenToKVPoolHost` (packed rows); on
  SGLang's CPU engine a stock pool gets :class:`CpuMHATokenToKVPoolHost`
  (:mod:`..hicache.host_transfers`).
- ``parallel_state.init_model_parallel_group`` (around): CPU groups without PyNccl
  (:mod:`.cpu_groups`), so ``--tp-size``/``--pp-size`` run on SGLang's CPU engine.
- ``models.utils.enable_fused_set_kv_buffer`` (around): False over a kvtuner pool, so models
  with fused rope+KV writes (Qwen3-MoE, GPT-OSS, ...) store K/V through ``set_kv_buffer``.
- SGLang's attention registry gains ``kvtuner`` (:mod:`..cuda.backend`), chosen on CUDA
  (:mod:`.backend_choice`).

Read mode (:func:`read_mode`): "packed" with the kvtuner backend (CUDA), "lazy" (no scratch)
when every attention backend of the server only gathers K/V by slot ids (``LAZY_BACKENDS``),
else the safe "scratch" mode (CPU only; refused on CUDA). In lazy mode the
pool's decode cache holds at most ``KVTUNER_DECODE_CACHE_TOKENS`` tokens per layer (environment;
default ``DEFAULT_DECODE_CACHE_TOKENS``, 0 turns it off).
"""

from __future__ import annotations

from ..swa.sub_pools import swa_pool_init
from .backend_choice import skip_fused_kv_writes
from .capacity import (
    cell_size_hook,
    full_cell_hook,
    pool_sizes_hook,
    swa_cell_hook,
    swa_configurator_init,
)
from .cpu_groups import cpu_group_without_pynccl
from .pool_hooks import (
    allocator_cleared,
    before_forward,
    host_pool_class_hook,
    pages_released,
    pool_class_hook,
)
from .server_flag import add_flag, take_flag

__all__ = ["HOOKS"]

_SWA_CONF = "sglang.srt.model_executor.pool_configurator.HybridSWAPoolConfigurator"
HOOKS = (
    ("sglang.srt.server_args.ServerArgs.add_cli_args", add_flag, "AFTER"),
    ("sglang.srt.server_args.ServerArgs.from_cli_args", take_flag, "AFTER"),
    (
        "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size",
        cell_size_hook,
        "AROUND",
    ),
    (
        "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class",
        pool_class_hook,
        "AROUND",
    ),
    (
        "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator.calculate_pool_sizes",
        pool_sizes_hook,
        "AROUND",
    ),
    (
        "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator._release_page_ids",
        pages_released,
        "AFTER",
    ),
    (
        "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.clear",
        allocator_cleared,
        "AFTER",
    ),
    ("sglang.srt.model_executor.model_runner.ModelRunner._forward_raw", before_forward, "BEFORE"),
    (
        "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler._mha_host_inputs",
        host_pool_class_hook,
        "AROUND",
    ),
    (
        "sglang.srt.distributed.parallel_state.init_model_parallel_group",
        cpu_group_without_pynccl,
        "AROUND",
    ),
    ("sglang.srt.models.utils.enable_fused_set_kv_buffer", skip_fused_kv_writes, "AROUND"),
    ("sglang.srt.mem_cache.swa_memory_pool.SWAKVPool.__init__", swa_pool_init, "AROUND"),
    (f"{_SWA_CONF}.__init__", swa_configurator_init, "AROUND"),
    (f"{_SWA_CONF}._full_cell_bytes", full_cell_hook, "AROUND"),
    (f"{_SWA_CONF}._swa_cell_bytes", swa_cell_hook, "AROUND"),
)
