"""transformers' own ``QuantizedCache`` (optimum-quanto backend) as a peer baseline.

Settings: ``axis_key = axis_value = 0`` (transformers' default; quanto then groups 32 consecutive
elements along head_dim, i.e. per-token groups like kvtuner's ``kvB``), ``q_group_size = 32``,
2 or 4 bits. Decode speed runs the unmodified ``QuantizedCache``. Perplexity needs K/V quantized
before attention reads them, which ``QuantizedLayer`` never does for the prefill (its first update
returns the input unquantized), so the perplexity pass uses :class:`QuantoPrefillLayer`: the same
quanto quantizer (``QuantoQuantizedLayer._quantize/_dequantize``), applied to the whole history
before it is returned.
"""

from __future__ import annotations

from typing import Any

import torch

GROUP_SIZE = 32

__all__ = ["quanto_decode_cache", "quanto_missing", "quanto_nbytes", "quanto_ppl_cache"]


def quanto_missing() -> str | None:
    """None when transformers can run its quanto cache here, else the reason (one line)."""
    try:
        import optimum.quanto  # noqa: F401
        from transformers.utils import is_optimum_quanto_available
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"optimum-quanto is not importable ({type(exc).__name__}: {exc})".splitlines()[0]
    return None if is_optimum_quanto_available() else "transformers does not detect optimum-quanto"


def _prefill_layer_class():
    from transformers.cache_utils import QuantoQuantizedLayer

    class QuantoPrefillLayer(QuantoQuantizedLayer):
        """Quantizes the whole history (prefill included) before attention reads it."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.cumulative_length += key_states.shape[-2]
            keys, values = key_states, value_states
            if self._quantized_keys is not None:
                keys = torch.cat([self._dequantize(self._quantized_keys), keys], -2)
                values = torch.cat([self._dequantize(self._quantized_values), values], -2)
            self._quantized_keys = self._quantize(keys.contiguous(), axis=self.axis_key)
            self._quantized_values = self._quantize(values.contiguous(), axis=self.axis_value)
            return self._dequantize(self._quantized_keys), self._dequantize(self._quantized_values)

    return QuantoPrefillLayer


def quanto_ppl_cache(model: Any, bits: int):
    from transformers.cache_utils import Cache

    layer_cls = _prefill_layer_class()
    n = model.config.get_text_config(decoder=True).num_hidden_layers
    kw = dict(nbits=bits, axis_key=0, axis_value=0, q_group_size=GROUP_SIZE, residual_length=0)
    return Cache(layers=[layer_cls(**kw) for _ in range(n)])


def quanto_decode_cache(model: Any, bits: int, residual_length: int):
    from transformers import QuantizedCache

    return QuantizedCache(
        "quanto",
        model.config,
        nbits=bits,
        axis_key=0,
        axis_value=0,
        q_group_size=GROUP_SIZE,
        residual_length=residual_length,
    )


def _storage_bytes(t: Any) -> int:
    """Bytes of a (possibly nested quanto) tensor's own storage: packed data, scale, shift."""
    if t is None:
        return 0
    if type(t) is torch.Tensor or not hasattr(t, "__tensor_flatten__"):
        return t.numel() * t.element_size()
    names, _ = t.__tensor_flatten__()
    return sum(_storage_bytes(getattr(t, n)) for n in names)


def quanto_nbytes(cache: Any) -> int:
    """Bytes a quanto cache stores: its packed tensors as stored; unquantized residual tokens
    accounted at 2 bytes per element (fp16), as kvtuner's cache counts its own."""
    total = 0
    for layer in cache.layers:
        total += _storage_bytes(layer._quantized_keys) + _storage_bytes(layer._quantized_values)
        for t in (layer.keys, layer.values):
            total += 0 if t is None else t.numel() * 2
    return total
