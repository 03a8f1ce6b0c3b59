"""Which profile layers a kvtuner pool holds: SGLang names a pool's layers by ids local to it.

A plain pool holds the contiguous global layers ``[start_layer, start_layer + layer_num)`` (a PP
stage's slice). SGLang's hybrid sliding-window pool (``SWAKVPool``) builds two sub-pools, one for
the full-attention layers and one for the window layers, each with ``start_layer`` 0 and
``layer_num`` = its layer count, and addresses them with the sub-pool's own index
(``layer_id_override``); the global ids are a list (``full_attention_layer_ids`` /
``swa_attention_layer_ids``). ``layer_ids[i]`` is the global id of the pool's i-th layer, so each
layer is packed at its own profile spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ....errors import KVTunerError
from ....profile import Profile

__all__ = ["pool_layer_ids"]


def pool_layer_ids(
    profile: Profile, args: dict[str, Any], layer_ids: Sequence[int] | None
) -> tuple[int, ...]:
    """Global layer ids of a pool built with SGLang's constructor ``args`` (start_layer,
    layer_num, head_dim); ``layer_ids`` given: those, checked against the pool and profile."""
    fp = profile.fingerprint
    if args["head_dim"] != fp.head_dim:
        raise KVTunerError(f"profile head_dim {fp.head_dim} != served head_dim {args['head_dim']}")
    start, count = args.get("start_layer") or 0, args["layer_num"]
    ids = tuple(range(start, start + count)) if layer_ids is None else tuple(layer_ids)
    if len(ids) != count:
        raise KVTunerError(f"the pool holds {count} layers but {len(ids)} layer ids were given")
    outside = [i for i in ids if not 0 <= i < fp.num_layers]
    if outside:
        raise KVTunerError(
            f"pool layers {list(ids)} include {outside}, outside the profile's "
            f"{fp.num_layers} layers"
        )
    return ids
