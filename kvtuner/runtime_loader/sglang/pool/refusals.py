"""What the kvtuner pool stores, from the profile and the pool's constructor arguments: the
one-line refusals checked before any KV memory is sized (the server-level ones, which read
SGLang's configurator: :mod:`..hooks.refusals`), and the one across ranks: under tensor/pipeline
parallelism every rank must serve the same profile (the profile is per layer; a TP rank holds its
own KV heads, a PP stage its own layers), so all ranks exchange the profile hash and all refuse
on a mismatch."""

from __future__ import annotations

from typing import Any

from ....errors import KVTunerError
from ....profile import Profile
from ....profile.channel_sides import channel_sides

__all__ = [
    "FLOAT_DTYPES",
    "check_profile_servable",
    "check_same_profile",
    "check_staging_bound",
    "pool_refusal",
    "sglang_rank_group",
]

FLOAT_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32")


def check_profile_servable(profile: Profile, page_size: int | None) -> None:
    """Token-axis specs are quantized token by token at write time; channel-axis specs a page
    at a time, so their group size must be the page size (``None``: SGLang's default, 1).
    Pre-RoPE keys are served channel-axis only (:mod:`.slot_rope`)."""
    page_size = page_size or 1
    for spec in profile.layers:
        if spec.k.pre_rope and spec.k.axis != "channel":
            raise KVTunerError(
                f"layer {spec.layer} K is token-axis and stored pre-RoPE (pre_rope); the pool "
                "serves pre-RoPE keys channel-axis (KIVI) only: serve a profile without it"
            )
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


def pool_refusal(args: dict[str, Any]) -> str | None:
    """What v1 cannot store, from the parent's constructor arguments."""
    checks = {
        "hybrid sliding-window (SWA) layers": args.get("swa_head_num") is not None,
        "speculative decoding (KV slot copies)": args.get("enable_kv_cache_copy"),
        f"kv_cache_layout={args.get('kv_cache_layout')!r}": args.get("kv_cache_layout")
        not in (None, "nhd"),
        "quantized (fp4/fp8) KV cache methods": args.get("quant_method") is not None,
        "post-capture KV backing": args.get("post_capture_active"),
        f"KV dtype {args['dtype']}": str(args["dtype"]) not in FLOAT_DTYPES,
        "different K and V head dims": args.get("v_head_dim") not in (None, args["head_dim"]),
    }
    return next((what for what, bad in checks.items() if bad), None)


def sglang_rank_group() -> Any:
    """The CPU (gloo) group of all of SGLang's ranks (every TP rank of every PP stage, on every
    node) when its model parallel state is up and has several ranks, else None."""
    from sglang.srt.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    world = parallel_state.get_world_group()
    return world.cpu_group if world.world_size > 1 else None


def check_same_profile(profile_hash: str, group: Any) -> None:
    """All-gather ``profile_hash`` over ``group`` (a torch.distributed group, None = no-op);
    every rank raises the same one-line error if any rank differs."""
    if group is None:
        return
    import torch.distributed as dist

    hashes: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hashes, profile_hash, group=group)
    if len(set(hashes)) > 1:
        listing = ", ".join(f"rank {r}: {h}" for r, h in enumerate(hashes))
        raise KVTunerError(
            f"--kvtuner-profile differs across ranks ({listing}); "
            "give every node the same profile file"
        )
