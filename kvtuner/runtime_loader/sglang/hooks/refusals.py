"""The server-level refusals, from SGLang's KV-cache configurator and server args (the profile-
level ones: :mod:`..pool.refusals`). What the v1 pool serves (plain MHA/GQA, token-axis specs,
channel-axis specs whose group is the page, pre-RoPE channel-axis keys, model-dtype KV) and the
one-line refusals for the rest. Checked in the scheduler before any KV memory is sized.

Channel-axis (KIVI) specs are packed a page at a time (:mod:`.channel_pages`), so their group size
must be SGLang's ``--page-size``, and the fp staging of filling pages is sized from
``--max-running-requests`` (one filling page per running request).

Hybrid sliding-window models: when SGLang keeps every layer in its one MHA pool (SGLang 0.5.23
does that for Gemma 2/3 on its own, ``arg_groups/model_overrides/gemma2_gemma3.py`` sets
``disable_hybrid_swa_memory``, and for any model with ``--disable-hybrid-swa-memory``), each
layer, window or global, is packed at its own spec and attention applies the window. When SGLang
builds its separate window pool (``SWAKVPool``), both sub-pools are kvtuner pools
(:mod:`..swa.sub_pools`), served with lazy reads (``torch_native``) only; channel-axis specs,
HiCache and SGLang's unified memory pool are refused with it.
"""

from __future__ import annotations

from typing import Any

from ....errors import KVTunerError
from ....profile import Profile
from ....profile.channel_sides import channel_sides
from ..pool.cell_size import PACKED_BACKEND, read_mode
from ..pool.refusals import FLOAT_DTYPES, check_profile_servable, check_staging_bound
from ..swa.sub_pools import swa_refusal
from .backend_choice import serves_on_cuda

__all__ = ["channel_refusal", "check_configurator"]

# storage backends that copy pages through the host pool's get_data_page/set_from_flat_data_page
HICACHE_STORAGE_BACKENDS = (None, "file")


def channel_refusal(
    server_args: Any, profile: Profile, *, hybrid_swa: bool = False, decode_graphs: str = "disabled"
) -> str:
    """Channel-axis sides live in staged pages (channel_pages.py): the CPU read paths and the
    kvtuner backend's kernels read them (keys only); HiCache's row copies do not, nor SWAKVPool
    (its window slots are not filled page by page in token order). Their pages are written on
    the host, so the kvtuner backend serves them without decode CUDA graphs (``decode_graphs``:
    SGLang's decode graph backend)."""
    if not channel_sides(profile):
        return ""
    if hybrid_swa:
        return "channel-axis (KIVI) specs with SGLang's separate sliding-window KV pool (SWAKVPool)"
    if server_args.enable_hierarchical_cache:
        return (
            "channel-axis (KIVI) specs with --enable-hierarchical-cache (serve a per-token profile)"
        )
    if read_mode(server_args) != "packed":
        return ""
    if any(s.v.axis == "channel" and s.v.is_quantized for s in profile.layers):
        return (
            "channel-axis (KIVI) values with the kvtuner attention backend on CUDA (its kernels "
            "read channel-axis keys only; serve token-axis values)"
        )
    if decode_graphs != "disabled":
        return (
            "channel-axis (KIVI) keys with decode CUDA graphs (their pages are packed on the "
            "host; add --cuda-graph-backend-decode disabled)"
        )
    return ""


def _refusals(kvc: Any) -> list[str]:
    from sglang.srt.runtime_context import get_exec

    sa = kvc.server_args
    graphs = get_exec().graph.cuda_graph_config
    return [
        "MLA models" if kvc.use_mla_backend else "",
        _swa_pool_refusal(kvc),
        "hybrid linear-attention (Mamba-like) models" if kvc.mambaish_config else "",
        "speculative decoding" if not kvc.spec_algorithm.is_none() else "",
        f"--kv-cache-dtype {kvc.kv_cache_dtype_str}"
        if str(kvc.kv_cache_dtype) not in FLOAT_DTYPES
        else "",
        "--enable-kv-cache-sharding" if kvc.kv_shard_rank is not None else "",
        "--enable-page-major-kv-layout" if kvc._page_major_enabled() else "",
        _hicache_refusal(sa),
        "--enable-hisparse" if getattr(sa, "enable_hisparse", False) else "",
        "PD disaggregation" if sa.disaggregation_mode not in (None, "null") else "",
        _graph_refusal(graphs, read_mode(sa)),
        f"attention backends other than {PACKED_BACKEND} on CUDA (add --attention-backend "
        f"{PACKED_BACKEND}: the dequantizing scratch read is retired there)"
        if serves_on_cuda(sa) and read_mode(sa) != "packed"
        else "",
    ]


def _swa_pool_refusal(kvc: Any) -> str:
    """SWAKVPool's sub-pools are kvtuner pools with lazy reads (swa/sub_pools.py), nothing else."""
    if not kvc.is_hybrid_swa:
        return ""
    sa, what = kvc.server_args, "SGLang's separate sliding-window KV pool (SWAKVPool)"
    if sa.enable_hierarchical_cache:
        return f"{what} with --enable-hierarchical-cache"
    if getattr(sa, "enable_unified_memory", False):
        return f"{what} with --enable-unified-memory"
    return swa_refusal(read_mode(sa))


def _graph_refusal(graphs: Any, mode: str) -> str:
    """The kvtuner backend captures decode graphs ("full"); other read modes capture none."""
    decode, prefill = str(graphs.decode.backend), str(graphs.prefill.backend)
    if mode == "packed" and decode in ("full", "disabled") and prefill == "disabled":
        return ""
    if mode != "packed" and (decode, prefill) == ("disabled", "disabled"):
        return ""
    wanted = "--cuda-graph-backend-prefill disabled"
    if mode != "packed":
        wanted = "--cuda-graph-backend-decode disabled " + wanted
    return f"CUDA graphs {decode}/{prefill} (decode/prefill; add {wanted})"


def _hicache_refusal(sa: Any) -> str:
    """HiCache holds packed rows in the layouts whose layers index by token, and writes pages
    through ``get_data_page`` (the file backend); anything else is refused."""
    from ..hicache.host_transfers import TOKEN_INDEXED_LAYOUTS

    if not sa.enable_hierarchical_cache:
        return ""
    if sa.hicache_mem_layout not in TOKEN_INDEXED_LAYOUTS:
        return f"--hicache-mem-layout {sa.hicache_mem_layout} (use layer_first or page_first)"
    if sa.hicache_storage_backend not in HICACHE_STORAGE_BACKENDS:
        return f"--hicache-storage-backend {sa.hicache_storage_backend} (use file)"
    return ""


def check_configurator(kvc: Any, profile: Profile) -> None:
    """Refuse what v1 does not serve; ``kvc`` is SGLang's KVCacheConfigurator."""
    cfg = kvc.model_config
    if cfg.head_dim != cfg.v_head_dim:
        raise KVTunerError(
            f"the kvtuner pool needs equal K and V head dims (got {cfg.head_dim} and "
            f"{cfg.v_head_dim})"
        )
    refused = [r for r in _refusals(kvc) if r]
    if refused:
        raise KVTunerError(
            f"--kvtuner-profile does not support {refused[0]} in v1 "
            "(supported: plain MHA/GQA models, model-dtype KV, no speculative decoding)"
        )
    check_profile_servable(profile, kvc.page_size)
    check_staging_bound(profile, kvc.server_args.max_running_requests)
    from sglang.srt.runtime_context import get_exec

    graphs = str(get_exec().graph.cuda_graph_config.decode.backend)
    refusal = channel_refusal(
        kvc.server_args, profile, hybrid_swa=kvc.is_hybrid_swa, decode_graphs=graphs
    )
    if refusal:
        raise KVTunerError(f"--kvtuner-profile does not support {refusal} yet")
