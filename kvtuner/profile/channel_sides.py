"""Which sides of a profile are channel-axis (KIVI): what a paged runtime stages and packs a page
at a time. Used by the SGLang pool's sizing and refusals and by the exported-profile index."""

from __future__ import annotations

from ..errors import KVTunerError
from .profile import LayerSpec, Profile

__all__ = ["channel_sides", "layer_slice"]


def layer_slice(profile: Profile, start_layer: int, num_layers: int) -> list[LayerSpec]:
    """Layers ``[start_layer, start_layer + num_layers)`` of the profile; one line if outside."""
    if start_layer < 0 or start_layer + num_layers > len(profile.layers):
        raise KVTunerError(
            f"layers {start_layer}..{start_layer + num_layers - 1} are outside the profile's "
            f"{len(profile.layers)} layers"
        )
    return list(profile.layers[start_layer : start_layer + num_layers])


def channel_sides(profile: Profile, start_layer: int = 0, num_layers: int | None = None) -> list:
    """The quantized channel-axis specs of layers ``[start_layer, start_layer + num_layers)``
    (K and V of each layer, in order): the sides that stage filling pages."""
    count = len(profile.layers) - start_layer if num_layers is None else num_layers
    return [
        qs
        for s in layer_slice(profile, start_layer, count)
        for qs in (s.k, s.v)
        if qs.axis == "channel" and qs.is_quantized
    ]
