"""SGLang's hybrid sliding-window pool (``SWAKVPool``) with both sub-pools packed by kvtuner.

``SWAKVPool`` (``mem_cache/swa_memory_pool.py``) builds a full-attention sub-pool of ``size``
slots and a window sub-pool of ``size_swa`` slots from one pool class, each with ``start_layer``
0 and its own layer count, and addresses a sub-pool's layers by their index in
``full_attention_layer_ids`` / ``swa_attention_layer_ids``. The plugin's AROUND hook on its
``__init__`` (:func:`swa_pool_init`) gives each sub-pool the kvtuner pool class bound to its
global layer ids (:mod:`..pool.layer_ids`), so every layer is packed at its own profile spec.

Reads: SGLang's ``torch_native`` backend (the CPU backend; the lazy read mode) indexes every
layer's buffer with ``req_to_token`` slots, which are full-pool slots; a window layer's rows live
at the window slots ``full_to_swa_index_mapping[slot]`` (0, the padding slot, once a token has
left the window and the allocator freed its window slot; the window mask hides it). The window
sub-pool's lazy reads therefore translate the slots they are given (:class:`WindowSlots`);
writes already arrive translated (``KVWriteLoc.swa_loc``). Other read modes are refused with
SWAKVPool (:func:`swa_refusal`): the scratch read's announced slots and the kvtuner backend's
paged kernels would need the same translation.

Capacity: SGLang's ``HybridSWAPoolConfigurator`` prices a full token at the full layers' bytes
and a window token at the window layers' bytes; the plugin's hooks make those the profile's
packed bytes of each sub-pool's layers (:func:`sub_pool_cells`). How many window tokens there
are (``--swa-full-tokens-ratio``, or the per-request window cap) stays SGLang's choice.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

import torch

from ....errors import KVTunerError
from ....profile import Profile
from ..pool.cell_size import cell_size

logger = logging.getLogger(__name__)

__all__ = [
    "SubPoolCells",
    "WindowSlots",
    "check_window_layers",
    "kvtuner_sub_pools",
    "sub_pool_cells",
    "swa_pool_init",
    "swa_refusal",
]


class WindowSlots:
    """Full-pool slots → the window sub-pool's slots, through ``SWAKVPool``'s mapping.

    torch_native reads a layer's K and V with the same index tensor: the last translation is
    kept, so both reads get one tensor (the pool's decode cache relies on that identity)."""

    __slots__ = ("_swa_pool", "_last")

    def __init__(self, swa_pool: Any) -> None:
        self._swa_pool = swa_pool  # the SWAKVPool; its mapping is registered after start-up
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, loc: torch.Tensor) -> torch.Tensor:
        last = self._last
        if last is not None and last[0] is loc:
            return last[1]
        mapped = self._swa_pool.translate_loc_from_full_to_swa(loc)
        self._last = (loc, mapped)
        return mapped

    def forget(self) -> None:
        """The mapping may have changed (a new forward): translate again."""
        self._last = None


def _pool_class() -> type:
    from ..pool.store import KVTunerMHATokenToKVPool

    return KVTunerMHATokenToKVPool


def _swa_signature() -> inspect.Signature:
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    return inspect.signature(SWAKVPool.__init__)


def swa_pool_init(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """AROUND ``SWAKVPool.__init__``: a kvtuner pool class becomes one class per sub-pool,
    bound to its global layer ids; afterwards the window sub-pool translates its reads."""
    bound = _swa_signature().bind(self, *args, **kwargs)
    given = bound.arguments
    cls = given.get("token_to_kv_pool_class")
    kvtuner = isinstance(cls, type) and issubclass(cls, _pool_class())
    if kvtuner:
        _check_sub_pool_classes(given)
        kwargs = _with_sub_pool_classes(cls, given)
        args = ()
    original(self, *args, **kwargs)
    if kvtuner:
        self.swa_kv_pool.read_slot_map = WindowSlots(self)


def _check_sub_pool_classes(given: dict[str, Any]) -> None:
    for name in ("full_kv_pool_class", "swa_kv_pool_class"):
        if given.get(name) is not None:
            raise KVTunerError(f"the kvtuner pool does not support SWAKVPool with {name} set")
    cls = given["token_to_kv_pool_class"]
    if cls.bound_read_mode != "lazy":
        raise KVTunerError(f"--kvtuner-profile does not support {swa_refusal(cls.bound_read_mode)}")
    if cls.bound_profile is not None:
        full, swa = given["full_attention_layer_ids"], given["swa_attention_layer_ids"]
        check_window_layers(cls.bound_profile, full, swa)


def check_window_layers(profile: Profile, full_ids: list[int], swa_ids: list[int]) -> None:
    """SGLang's window layers must be sliding layers of the profile's fingerprint, and its full
    layers full ones (a PP stage holds a slice of each)."""
    fp = profile.fingerprint
    wrong = [i for i in swa_ids if i < fp.num_layers and fp.window_of(i) is None]
    wrong += [i for i in full_ids if i < fp.num_layers and fp.window_of(i) is not None]
    if wrong:
        sliding = [i for i in range(fp.num_layers) if fp.window_of(i) is not None]
        raise KVTunerError(
            f"SGLang keeps layers {sorted(swa_ids)} in its sliding-window pool, but the "
            f"profile's sliding-window layers are {sliding}; export the profile from this model"
        )


def _with_sub_pool_classes(cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """SWAKVPool's arguments, by name, with a bound class per sub-pool."""
    out = {k: v for k, v in given.items() if k not in ("self", "kwargs")}
    out.update(given.get("kwargs", {}))
    out["full_kv_pool_class"] = _bind_layers(cls, given["full_attention_layer_ids"])
    out["swa_kv_pool_class"] = _bind_layers(cls, given["swa_attention_layer_ids"])
    return out


def _bind_layers(cls: type, layer_ids: list[int]) -> type:
    attrs = {"bound_layer_ids": tuple(layer_ids), "__module__": cls.__module__}
    return type(cls.__name__, (cls,), attrs)


def swa_refusal(mode: str) -> str:
    """Why SWAKVPool is refused in read mode ``mode`` (empty: served)."""
    if mode == "lazy":
        return ""
    return (
        f"SGLang's separate sliding-window KV pool (SWAKVPool) with {mode} reads (served with "
        "--attention-backend torch_native only: its window slots are translated on read)"
    )


def kvtuner_sub_pools(pool: Any) -> list[Any]:
    """The kvtuner pools a model runner's KV pool is made of: itself, or SWAKVPool's two."""
    cls = _pool_class()
    if isinstance(pool, cls):
        return [pool]
    subs = (getattr(pool, "full_kv_pool", None), getattr(pool, "swa_kv_pool", None))
    return [p for p in subs if isinstance(p, cls)]


@dataclass(frozen=True)
class SubPoolCells:
    """Packed bytes per token of SWAKVPool's full sub-pool and of its window sub-pool."""

    full: int
    swa: int

    def __post_init__(self) -> None:
        if self.full < 0 or self.swa < 0 or self.full + self.swa == 0:
            raise KVTunerError(f"invalid SWA cell sizes: full={self.full} swa={self.swa}")


def sub_pool_cells(
    profile: Profile, *, heads: int, dtype_bytes: int, full_ids: list[int], swa_ids: list[int]
) -> SubPoolCells:
    """Each sub-pool's packed bytes per token: its layers' K and V rows (lazy reads: no
    scratch), every layer at its own spec."""

    def packed(ids: list[int]) -> int:
        if not ids:
            return 0
        shape = dict(heads=heads, start_layer=0, num_layers=len(ids), dtype_bytes=dtype_bytes)
        return cell_size(profile, **shape, read_mode="lazy", layer_ids=ids).packed

    return SubPoolCells(full=packed(full_ids), swa=packed(swa_ids))
