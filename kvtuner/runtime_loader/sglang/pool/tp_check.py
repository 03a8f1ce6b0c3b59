"""Tensor/pipeline parallel: every rank must serve the same profile (the profile is per layer;
a TP rank holds its own KV heads, a PP stage its own layers). All ranks of the server exchange
the profile hash and all refuse on a mismatch."""

from __future__ import annotations

from typing import Any

from ....errors import KVTunerError

__all__ = ["check_same_profile", "sglang_rank_group"]


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
