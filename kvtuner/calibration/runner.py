"""Run the upper part of a decoder from the fp activations entering layer ``l``.

The fp pass records, per decoder layer, its input hidden states and the exact keyword arguments
the model itself passes to it (causal mask, rotary position embeddings, position ids), plus the
fp attention output. A single-layer sensitivity run then starts at layer ``l`` instead of
recomputing layers ``0..l-1``: layer ``l`` runs once per variant with a packed KV cache from
:func:`kvtuner.runtime_loader.hf.make_cache` (only layer ``l`` quantized), and the variants'
outputs run together, as one batch, through the unquantized layers ``l+1..L-1``, norm, lm_head.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..profile import LayerSpec
from ..quant import QuantSpec
from .kl import FpReference, fp_reference, kl_sum, sample_chunks

_FP16 = QuantSpec(16)
_LAYER_KWARGS = ("attention_mask", "position_embeddings", "position_ids")

__all__ = ["FpActivations", "LayerResult", "capture_fp", "run_layer_variants"]


@dataclass(frozen=True)
class LayerResult:
    """Summed over one row chunk: KL over positions, squared attention-output error and norm."""

    kl_sum: float
    err_sq: float
    ref_sq: float


@dataclass
class FpActivations:
    """fp run of the calibration tokens, split into row chunks c (same chunks as the reference).

    inputs[c][l]: hidden states entering layer l, [rows, T, hidden].
    attn[c][l]: layer l's fp self-attention output (after o_proj), [rows, T, hidden].
    kwargs[c][l]: the model's own keyword arguments to layer l (mask, rope cos/sin, positions).
    """

    reference: FpReference
    chunks: list[slice]
    inputs: list[list[torch.Tensor]]
    attn: list[list[torch.Tensor]]
    kwargs: list[list[dict]]


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    return model.get_decoder().layers


@contextmanager
def _recording(layers: Sequence[torch.nn.Module], record: dict) -> Iterator[None]:
    """Hooks appending each layer's (input, kwargs) and attention output to ``record``."""

    def pre(i):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            kept = {k: kwargs[k] for k in _LAYER_KWARGS if k in kwargs}
            record["inputs"][i].append(hidden)
            record["kwargs"][i].append(kept)

        return hook

    def post(i):
        def hook(_module, _args, output):
            record["attn"][i].append(output[0] if isinstance(output, tuple) else output)

        return hook

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(pre(i), with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(post(i)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.inference_mode()
def capture_fp(model, tokens: torch.Tensor) -> FpActivations:
    """One fp forward: the reference log-probs and every layer's inputs and attention output."""
    layers = decoder_layers(model)
    record = {name: [[] for _ in layers] for name in ("inputs", "attn", "kwargs")}
    with _recording(layers, record):
        reference = fp_reference(model, tokens)
    chunks = sample_chunks(tokens, reference.log_probs.shape[-1])
    # record[name][layer][chunk] -> [chunk][layer]
    per_chunk = {k: [list(x) for x in zip(*v, strict=True)] for k, v in record.items()}
    return FpActivations(
        reference, chunks, per_chunk["inputs"], per_chunk["attn"], per_chunk["kwargs"]
    )


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
    seen = []
    handle = layers[li].self_attn.register_forward_hook(lambda _m, _a, out: seen.append(out[0]))
    try:
        out = layers[li](
            fp.inputs[c][li], **fp.kwargs[c][li], past_key_values=cache, use_cache=True
        )
    finally:
        handle.remove()
    return out, seen[0]


@torch.inference_mode()
def run_layer_variants(
    model, fp: FpActivations, c: int, variants: Sequence[LayerSpec]
) -> list[LayerResult]:
    """For row chunk ``c``: each variant quantizes only its own layer (all share one layer
    index); returns their summed KL vs fp and attention-output error, in order."""
    layers, li = decoder_layers(model), variants[0].layer
    outs, errs = [], []
    ref_attn = fp.attn[c][li].double()
    for spec in variants:
        out, attn = _quantized_layer(model, fp, c, spec)
        outs.append(out)
        errs.append(float((attn.double() - ref_attn).pow(2).sum()))
    rows = outs[0].shape[0]
    hidden = torch.cat(outs)  # [V*rows, T, hidden], variant-major
    for j in range(li + 1, len(layers)):
        kwargs = {k: _repeat_batch(v, len(variants), rows) for k, v in fp.kwargs[c][j].items()}
        hidden = layers[j](hidden, **kwargs, past_key_values=None, use_cache=False)
    hidden = model.get_decoder().norm(hidden)
    ref_log_probs = fp.reference.log_probs[fp.chunks[c]]
    ref_sq = float(ref_attn.pow(2).sum())
    results = []
    for i, h in enumerate(hidden.split(rows)):
        kl = kl_sum(ref_log_probs, model.lm_head(h))
        results.append(LayerResult(kl, errs[i], ref_sq))
    return results
