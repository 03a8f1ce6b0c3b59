"""What the v1 pool serves (plain MHA/GQA, token-axis specs, channel-axis specs whose group is the
page, model-dtype KV) and the one-line refusals for the rest. Checked in the scheduler before any KV
memory is sized.

Channel-axis (KIVI) specs are packed a page at a time (:mod:`.channel_pages`), so their group size
must be SGLang's ``--page-size``, and the fp staging of filling pages is sized from
``--max-running-requests`` (one filling page per running request).

Hybrid sliding-window models are served when SGLang keeps every layer in its one MHA pool: then
each layer, window or global, is packed at its own spec, and attention applies the window. SGLang
0.5.23 does that for Gemma 2/3 on its own (``arg_groups/model_overrides/gemma2_gemma3.py`` sets
``disable_hybrid_swa_memory``) and for any model with ``--disable-hybrid-swa-memory``. Its
separate window pool (``SWAKVPool``, ``mem_cache/swa_memory_pool.py``) is refused: its sub-pools
are built with pool-local layer ids (``layer_num`` = the window or the full layer count,
``set_kv_buffer(..., layer_id_override=...)``), the global ids arriving only after construction
(``pool.model_layer_ids``), and window layers are read through ``translate_loc_from_full_to_swa``
slots, not the ``req_to_token`` slots the pool's lazy reads are told about.
"""

from __future__ import annotations

from typing import Any

from ...errors import KVTunerError
from ...profile import Profile
from .fused_writes import fused_write_refusal
from .sizing import channel_sides

__all__ = [
    "check_configurator",
    "check_profile_servable",
    "check_staging_bound",
    "pool_refusal",
]

_FLOAT_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32")


def check_profile_servable(profile: Profile, page_size: int | None) -> None:
    """Token-axis specs are quantized token by token at write time; channel-axis specs a page
    at a time, so their group size must be the page size (``None``: SGLang's default, 1)."""
    page_size = page_size or 1
    for spec in profile.layers:
        for name, qs in (("K", spec.k), ("V", spec.v)):
            if qs.axis == "channel" and qs.is_quantized and qs.group_size != page_size:
                raise KVTunerError(
                    f"layer {spec.layer} {name} is channel-axis (KIVI) with groups of "
                    f"{qs.group_size} tokens, but --page-size is {page_size}; start the "
                    f"server with --page-size {qs.group_size}"
                )


def check_staging_bound(profile: Profile, max_running_requests: int | None) -> None:
    """Channel-axis specs stage one filling page per running request: the bound must be given."""
    if max_running_requests is None and channel_sides(profile):
        raise KVTunerError(
            "channel-axis (KIVI) specs keep each running request's filling page in an fp "
            "staging area sized by --max-running-requests; give it (e.g. "
            "--max-running-requests 64)"
        )


def _refusals(kvc: Any) -> list[str]:
    from sglang.srt.runtime_context import get_exec

    sa = kvc.server_args
    graphs = get_exec().graph.cuda_graph_config
    return [
        "MLA models" if kvc.use_mla_backend else "",
        "SGLang's separate sliding-window KV pool (SWAKVPool; add --disable-hybrid-swa-memory: "
        "the packed pool then holds every layer at its own spec)"
        if kvc.is_hybrid_swa
        else "",
        "hybrid linear-attention (Mamba-like) models" if kvc.mambaish_config else "",
        "speculative decoding" if not kvc.spec_algorithm.is_none() else "",
        f"--kv-cache-dtype {kvc.kv_cache_dtype_str}"
        if str(kvc.kv_cache_dtype) not in _FLOAT_DTYPES
        else "",
        "--enable-kv-cache-sharding" if kvc.kv_shard_rank is not None else "",
        "--enable-page-major-kv-layout" if kvc._page_major_enabled() else "",
        "--enable-hierarchical-cache" if sa.enable_hierarchical_cache else "",
        "--enable-hisparse" if getattr(sa, "enable_hisparse", False) else "",
        "PD disaggregation" if sa.disaggregation_mode not in (None, "null") else "",
        "CUDA graphs (add --cuda-graph-backend-decode disabled "
        "--cuda-graph-backend-prefill disabled)"
        if (graphs.decode.backend, graphs.prefill.backend) != ("disabled", "disabled")
        else "",
        fused_write_refusal(kvc.model_config, kvc.device) or "",
    ]


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


def pool_refusal(args: dict[str, Any]) -> str | None:
    """What v1 cannot store, from the parent's constructor arguments."""
    checks = {
        "hybrid sliding-window (SWA) layers": args.get("swa_head_num") is not None,
        "speculative decoding (KV slot copies)": args.get("enable_kv_cache_copy"),
        f"kv_cache_layout={args.get('kv_cache_layout')!r}": args.get("kv_cache_layout")
        not in (None, "nhd"),
        "quantized (fp4/fp8) KV cache methods": args.get("quant_method") is not None,
        "post-capture KV backing": args.get("post_capture_active"),
        f"KV dtype {args['dtype']}": str(args["dtype"]) not in _FLOAT_DTYPES,
        "different K and V head dims": args.get("v_head_dim") not in (None, args["head_dim"]),
    }
    return next((what for what, bad in checks.items() if bad), None)
