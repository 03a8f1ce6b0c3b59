"""The SGLang plugin (entry point group ``sglang.srt.plugins``): hooks registered through
SGLang's ``HookRegistry``, applied by ``load_plugins()`` in the launcher and in every scheduler.

- ``ServerArgs.add_cli_args`` (after): adds ``--kvtuner-profile PATH``.
- ``ServerArgs.from_cli_args`` (after): makes the path absolute, exports it to child processes
  (``KVTUNER_PROFILE``) and checks the profile against the model's config before anything starts;
  a bad profile prints one line and exits 2.
- ``DefaultPoolConfigurator._compute_cell_size`` / ``calculate_pool_sizes`` and
  ``HybridSWAPoolConfigurator``'s cell prices (around, :mod:`.capacity`): the bytes per token
  SGLang divides its KV budget by become the profile's packed bytes.
- ``SWAKVPool.__init__`` (around, :mod:`.swa_pool`): SGLang's separate sliding-window pool gets
  two kvtuner sub-pools, each bound to its layers' global ids; the window one translates reads.
- ``PagedTokenToKVPoolAllocator._release_page_ids`` / ``clear`` (after): freed pages drop their
  staged values (:meth:`KVTunerMHATokenToKVPool.release_pages`).
- ``KVCacheConfigurator._resolve_kv_pool_class`` (around): the MHA pool class becomes
  :class:`KVTunerMHATokenToKVPool` bound to the profile and the read mode; unsupported setups are
  refused here.
- ``ModelRunner._forward_raw`` (before): tells the pool which slots the batch reads, and the
  positions of the slots it writes (pre-RoPE keys, :mod:`.slot_rope`).
- ``hybrid_pool_assembler._mha_host_inputs`` (around): with ``--enable-hierarchical-cache``,
  the host pool of a kvtuner pool is :class:`KVTunerMHATokenToKVPoolHost` (packed rows); on
  SGLang's CPU engine a stock pool gets :class:`CpuMHATokenToKVPoolHost` (:mod:`.host_transfers`).
- ``parallel_state.init_model_parallel_group`` (around): CPU groups without PyNccl
  (:mod:`.cpu_groups`), so ``--tp-size``/``--pp-size`` run on SGLang's CPU engine.
- ``models.utils.enable_fused_set_kv_buffer`` (around): False over a kvtuner pool, so models
  with fused rope+KV writes (Qwen3-MoE, GPT-OSS, ...) store K/V through ``set_kv_buffer``.
- SGLang's attention registry gains ``kvtuner`` (:mod:`.backend`), chosen on CUDA
  (:mod:`.backend_choice`).

Read mode (:func:`read_mode`): "packed" with the kvtuner backend (CUDA), "lazy" (no scratch)
when every attention backend of the server only gathers K/V by slot ids (``LAZY_BACKENDS``),
else the safe "scratch" mode (CPU only; refused on CUDA). In lazy mode the
pool's decode cache holds at most ``KVTUNER_DECODE_CACHE_TOKENS`` tokens per layer (environment;
default ``DEFAULT_DECODE_CACHE_TOKENS``, 0 turns it off).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch

from ...errors import KVTunerError
from ...profile import ModelFingerprint
from .activation import ENV_VAR, activate, active_profile
from .backend_choice import choose_packed_backend, register_backend, skip_fused_kv_writes
from .batch_reads import batch_read_slots
from .capacity import (
    cell_size_hook,
    full_cell_hook,
    pool_sizes_hook,
    scheduler_profile,
    stage_pages,
    swa_cell_hook,
    swa_configurator_init,
)
from .cpu_groups import cpu_group_without_pynccl
from .decode_cache import DEFAULT_DECODE_CACHE_TOKENS
from .hook_check import check_hooks, check_private_names
from .sizing import LAZY_BACKENDS, read_mode
from .slot_rope import pre_rope_frequencies
from .support import check_profile_servable, check_staging_bound
from .swa_pool import kvtuner_sub_pools, swa_pool_init
from .version import check_sglang_version

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_ENV_VAR",
    "FLAG",
    "LAZY_BACKENDS",
    "batch_read_slots",
    "decode_cache_tokens",
    "read_mode",
    "register",
]

FLAG = "--kvtuner-profile"
CACHE_ENV_VAR = "KVTUNER_DECODE_CACHE_TOKENS"
_registered = False
_proven = False


def _die(exc: KVTunerError) -> None:
    print(f"kvtuner: error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def decode_cache_tokens() -> int:
    """Decode-cache bound of the lazy mode (tokens per layer), from the environment."""
    raw = os.environ.get(CACHE_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_DECODE_CACHE_TOKENS
    if not raw.isdigit():
        raise KVTunerError(f"{CACHE_ENV_VAR} must be a whole number of tokens >= 0, got {raw!r}")
    return int(raw)


# -- launcher side ---------------------------------------------------------------------------
def _add_flag(result: Any, parser: Any) -> None:
    if _flag_requested():  # the launcher, after SGLang applied the plugins' hooks
        try:
            prove_hooks()
        except KVTunerError as exc:
            _die(exc)
    group = parser.add_argument_group("kvtuner")
    group.add_argument(
        FLAG,
        type=str,
        default=None,
        metavar="PATH",
        help="Serve with the per-layer quantized KV pool of this kvtuner profile "
        "(JSON). Multi-node: the same path on every node.",
    )


def _model_fingerprint(server_args: Any) -> ModelFingerprint | None:
    """The served model's shape facts from its HF config; None if it cannot be read here
    (the scheduler checks again against the config it loads)."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(
            server_args.model_path, trust_remote_code=bool(server_args.trust_remote_code)
        )
    except (OSError, ValueError) as exc:
        logger.warning("kvtuner: model config not readable before start-up (%s)", exc)
        return None
    return ModelFingerprint.from_config(config)


def _take_flag(server_args: Any, cls: Any, args: Any) -> None:
    path = getattr(args, "kvtuner_profile", None)
    if path is None:
        return
    try:
        prove_hooks()
        decode_cache_tokens()
        activate(path)
        profile = active_profile()
        check_profile_servable(profile, server_args.page_size)
        check_staging_bound(profile, server_args.max_running_requests)
        fingerprint = _model_fingerprint(server_args)
        if fingerprint is not None:
            profile.check_model(fingerprint)
        choose_packed_backend(server_args)
    except KVTunerError as exc:
        _die(exc)
    logger.info(
        "kvtuner: serving with profile %s (hash %s, %.2f nominal bits)",
        os.environ[ENV_VAR],
        profile.hash,
        profile.nominal_bits,
    )


# -- scheduler side (capacity hooks: capacity.py) --------------------------------------------
def _pages_released(result: Any, allocator: Any, *page_ids: torch.Tensor) -> None:
    pool = _kvtuner_pool(allocator)
    if pool is not None and page_ids:
        pool.release_pages(*page_ids)


def _allocator_cleared(result: Any, allocator: Any) -> None:
    pool = _kvtuner_pool(allocator)
    if pool is not None:
        pool.clear_staging()


def _kvtuner_pool(allocator: Any):
    from .pool import KVTunerMHATokenToKVPool

    pool = getattr(allocator, "_kvcache", None)
    return pool if isinstance(pool, KVTunerMHATokenToKVPool) else None


def _pool_class_hook(original: Any, self: Any, *, kind: str, default: type) -> type:
    pool_cls = original(self, kind=kind, default=default)
    profile = scheduler_profile(self)
    if profile is None or kind != "mha":
        return pool_cls
    prove_hooks()  # a scheduler process: its own SGLang modules, hooked by its load_plugins
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from .pool import KVTunerMHATokenToKVPool

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


def _host_pool_class_hook(original: Any, *args: Any, **kwargs: Any) -> tuple:
    """HiCache's MHA host pool: packed rows for a kvtuner device pool; on SGLang's CPU engine,
    SGLang's own pool with unpinned memory and index copies (it has no CPU transfers)."""
    host_cls, info, host_kwargs = original(*args, **kwargs)
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    from .host_pool import KVTunerMHATokenToKVPoolHost
    from .host_transfers import CpuMHATokenToKVPoolHost
    from .pool import KVTunerMHATokenToKVPool

    device_pool = args[0] if args else kwargs["pool"]
    if isinstance(device_pool, KVTunerMHATokenToKVPool):
        host_cls = KVTunerMHATokenToKVPoolHost.bound(device_pool.profile.hash)
    elif host_cls is MHATokenToKVPoolHost and info.device.type == "cpu":
        host_cls = CpuMHATokenToKVPoolHost
    logger.info("kvtuner: HiCache host pool %s", host_cls.__name__)
    return host_cls, info, host_kwargs


def _before_forward(self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> None:
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


_SWA_CONF = "sglang.srt.model_executor.pool_configurator.HybridSWAPoolConfigurator"
_HOOKS = (
    ("sglang.srt.server_args.ServerArgs.add_cli_args", _add_flag, "AFTER"),
    ("sglang.srt.server_args.ServerArgs.from_cli_args", _take_flag, "AFTER"),
    (
        "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size",
        cell_size_hook,
        "AROUND",
    ),
    (
        "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class",
        _pool_class_hook,
        "AROUND",
    ),
    (
        "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator.calculate_pool_sizes",
        pool_sizes_hook,
        "AROUND",
    ),
    (
        "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator._release_page_ids",
        _pages_released,
        "AFTER",
    ),
    (
        "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.clear",
        _allocator_cleared,
        "AFTER",
    ),
    ("sglang.srt.model_executor.model_runner.ModelRunner._forward_raw", _before_forward, "BEFORE"),
    (
        "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler._mha_host_inputs",
        _host_pool_class_hook,
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


def _flag_requested() -> bool:
    return bool(os.environ.get(ENV_VAR)) or any(
        a == FLAG or a.startswith(FLAG + "=") for a in sys.argv
    )


def prove_hooks() -> None:
    """Every hook of :data:`_HOOKS` took and every private name kvtuner reads exists (once per
    process; :mod:`.hook_check`)."""
    global _proven
    if not _proven:
        check_hooks(_HOOKS)
        check_private_names()
        _proven = True


def register() -> None:
    """Entry point of the plugin (idempotent: the fallback launcher calls it too)."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        check_sglang_version()
    except KVTunerError as exc:
        if _flag_requested():
            _die(exc)
        logger.warning("kvtuner: %s; the kvtuner plugin stays inactive", exc)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in _HOOKS:
        HookRegistry.register(target, hook, HookType[kind])
    register_backend()
