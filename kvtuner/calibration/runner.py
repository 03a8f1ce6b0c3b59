"""Run the upper part of a decoder from the fp activations entering layer ``l``.

The fp pass records the hidden states entering layer 0 and, per decoder layer, the exact keyword
arguments the model itself passes to it (causal mask, rotary position embeddings, position ids);
the sweep then carries the fp activations up one layer at a time (:func:`advance_to`). A
single-layer sensitivity run then starts at layer ``l`` instead of recomputing layers
``0..l-1``: layer ``l`` runs once per variant with a packed KV cache from
:func:`kvtuner.runtime_loader.hf.make_cache` (only layer ``l`` quantized), and the variants'
outputs run together, as one batch, through the unquantized layers ``l+1..L-1``, norm, lm_head.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..profile import LayerSpec
from ..quant import QuantSpec
from ..runtime_loader.hf.keyword import cache_kwargs
from .kl import FpReference, fp_reference

_FP16 = QuantSpec(16)
_LAYER_KWARGS = ("attention_mask", "position_embeddings", "position_ids")

__all__ = ["FpActivations", "LayerResult", "advance_to", "capture_fp", "run_layer_variants"]


@dataclass(frozen=True)
class LayerResult:
    """Summed over one row chunk: KL over positions, squared attention-output error and norm."""

    kl_sum: float
    err_sq: float
    ref_sq: float


@dataclass
class FpActivations:
    """fp run of the calibration tokens in row chunks c (the reference's chunks), held for one
    layer at a time: the sweep walks the layers upward with :func:`advance_to`, so memory holds
    the model plus one layer's activations, whatever the depth.

    layer: the layer whose fp state is held.
    inputs[c]: hidden states entering ``layer``, [rows, T, hidden].
    attn[c]: ``layer``'s fp self-attention output (after o_proj), [rows, T, hidden].
    outputs[c]: ``layer``'s output, the hidden states entering the next layer.
    kwargs[c][l]: the model's own keyword arguments to layer l (mask, rope cos/sin, positions);
        the same tensors for every layer, so they cost one layer's worth, not L.
    """

    reference: FpReference
    chunks: list[slice]
    kwargs: list[list[dict]]
    layer: int = 0
    inputs: list[torch.Tensor] = field(default_factory=list)
    attn: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)  # [c]: entering layer + 1


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    return model.get_decoder().layers


@contextmanager
def _recording(layers: Sequence[torch.nn.Module], record: dict) -> Iterator[None]:
    """Hooks appending layer 0's input and every layer's kwargs, per forward, to ``record``."""

    def pre(i):
        def hook(_module, args, kwargs):
            if i == 0:
                record["inputs"].append(args[0] if args else kwargs["hidden_states"])
            record["kwargs"][i].append({k: kwargs[k] for k in _LAYER_KWARGS if k in kwargs})

        return hook

    handles = [
        layer.register_forward_pre_hook(pre(i), with_kwargs=True) for i, layer in enumerate(layers)
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _run_layer(layer, hidden: torch.Tensor, kwargs: dict, cache) -> tuple[torch.Tensor, ...]:
    """One decoder layer on ``hidden`` with the model's kwargs: (its output, attention output);
    ``cache``: None for fp, else a packed cache quantizing this layer's K/V."""
    seen = []
    handle = layer.self_attn.register_forward_hook(lambda _m, _a, out: seen.append(out[0]))
    try:
        out = layer(hidden, **kwargs, **cache_kwargs(cache), use_cache=cache is not None)
    finally:
        handle.remove()
    return out, seen[0]


def _fp_layer(model, fp: FpActivations, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``fp.layer`` unquantized on chunk ``c``: (its output, its attention output)."""
    layer = decoder_layers(model)[fp.layer]
    return _run_layer(layer, fp.inputs[c], fp.kwargs[c][fp.layer], None)


@torch.inference_mode()
def advance_to(model, fp: FpActivations, layer: int) -> None:
    """Move ``fp`` up to ``layer``: each layer on the way runs once, unquantized."""
    if layer < fp.layer:
        raise ValueError(f"fp activations are at layer {fp.layer}, cannot go back to {layer}")
    while True:
        if not fp.attn:
            outs = [_fp_layer(model, fp, c) for c in range(len(fp.chunks))]
            fp.outputs, fp.attn = [out for out, _ in outs], [attn for _, attn in outs]
        if fp.layer == layer:
            return
        fp.inputs, fp.outputs, fp.attn = fp.outputs, [], []
        fp.layer += 1


@torch.inference_mode()
def capture_fp(model, tokens: torch.Tensor, *, batch_size: int | None = None) -> FpActivations:
    """One fp forward: the reference log-probs, layer 0's inputs and every layer's kwargs;
    ``fp`` then holds layer 0 (``batch_size`` windows per forward, see :func:`fp_reference`)."""
    layers = decoder_layers(model)
    record = {"inputs": [], "kwargs": [[] for _ in layers]}
    with _recording(layers, record):
        reference = fp_reference(model, tokens, batch_size=batch_size)
    kwargs = [list(x) for x in zip(*record["kwargs"], strict=True)]  # [layer][chunk] -> [c][l]
    fp = FpActivations(reference, reference.chunks(), kwargs, inputs=record["inputs"])
    advance_to(model, fp, 0)
    return fp


def _repeat_batch(value, copies: int, rows: int):
    """Tile a layer kwarg along the batch for ``copies`` stacked variants (batch-1 broadcasts)."""
    if isinstance(value, tuple):
        return tuple(_repeat_batch(v, copies, rows) for v in value)
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows > 1:
        return value.repeat(copies, *([1] * (value.dim() - 1)))
    return value


def _single_layer_specs(num_layers: int, spec: LayerSpec) -> list[LayerSpec]:
    return [spec if i == spec.layer else LayerSpec(i, _FP16, _FP16) for i in range(num_layers)]


def _quantized_layer(model, fp: FpActivations, c: int, spec: LayerSpec):
    """Layer ``spec.layer`` on fp inputs with its K/V packed per ``spec``: (output, attn out)."""
    from ..runtime_loader.hf import make_cache

    layers, li = decoder_layers(model), spec.layer
    cache = make_cache(model, _single_layer_specs(len(layers), spec), residual_length=0)
    return _run_layer(layers[li], fp.inputs[c], fp.kwargs[c][li], cache)


@torch.inference_mode()
def run_layer_variants(
    model, fp: FpActivations, c: int, variants: Sequence[LayerSpec]
) -> list[LayerResult]:
    """For row chunk ``c``: each variant quantizes only its own layer (all share one layer
    index); returns their summed KL vs fp and attention-output error, in order."""
    layers, li = decoder_layers(model), variants[0].layer
    if li != fp.layer:
        raise ValueError(f"fp activations hold layer {fp.layer}, variants are for layer {li}")
    outs, errs = [], []
    ref_attn = fp.attn[c].double()
    for spec in variants:
        out, attn = _quantized_layer(model, fp, c, spec)
        outs.append(out)
        errs.append(float((attn.double() - ref_attn).pow(2).sum()))
    rows = outs[0].shape[0]
    hidden = torch.cat(outs)  # [V*rows, T, hidden], variant-major
    for j in range(li + 1, len(layers)):
        kwargs = {k: _repeat_batch(v, len(variants), rows) for k, v in fp.kwargs[c][j].items()}
        hidden = layers[j](hidden, **kwargs, **cache_kwargs(None), use_cache=False)
    hidden = model.get_decoder().norm(hidden)
    ref_sq = float(ref_attn.pow(2).sum())
    kls = [fp.reference.kl_sum(fp.chunks[c], h) for h in hidden.split(rows)]
    return [LayerResult(kl, err, ref_sq) for kl, err in zip(kls, errs, strict=True)]
