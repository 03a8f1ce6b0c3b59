"""The search's objective: mean KL(fp || quantized) of next-token distributions.

Quantized runs go through the HF runtime's packed cache (``make_cache(..., residual_length=0)``):
every token's K and V, prefill included, are quantized before any query reads them. There is no
second fake-quant path here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KVTunerError
from ..placement import model_device
from ..profile import LayerSpec
from ..runtime_loader.hf.keyword import cache_kwargs
from .head import HeadMoments, OutputHead

LOGITS_CHUNK_BYTES = 256 * 2**20  # bound on one chunk's fp32 logits [B, T, V]

__all__ = [
    "FpReference",
    "check_batch_size",
    "final_hidden",
    "fp_reference",
    "kl_sum",
    "measure_kl",
    "measure_with_cache",
    "sample_chunks",
]


@dataclass(frozen=True)
class FpReference:
    """fp next-token distributions of the calibration tokens, as the KL needs them.

    tokens: int64 [N, T] as given (CPU).
    head: the model's output head; quantized runs are scored through it from hidden states.
    moments: for a linear head, fp's per-position moments (:class:`HeadMoments`, [N, T, hidden]
        on the model's device); else None and ``log_probs`` holds fp32 [N, T, V].
    nll: mean next-token negative log-likelihood over the N*(T-1) predicted tokens (nats).
    """

    tokens: torch.Tensor = field(repr=False)
    head: OutputHead = field(repr=False)
    moments: HeadMoments | None = field(repr=False)
    log_probs: torch.Tensor | None = field(repr=False)
    nll: float
    batch_size: int | None = None  # windows per forward (None: bounded by logits bytes)

    def __post_init__(self) -> None:
        if (self.moments is None) == (self.log_probs is None):
            raise KVTunerError("fp reference: exactly one of moments and log_probs")
        held = self.log_probs if self.moments is None else self.moments.mass
        if held.shape[:2] != self.tokens.shape:
            raise KVTunerError("fp reference: its distributions must match tokens [N, T]")

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)

    def check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.shape != self.tokens.shape or not torch.equal(tokens, self.tokens):
            raise KVTunerError("fp reference was computed on different tokens")

    def chunks(self) -> list[slice]:
        """The row slices every quantized run of these tokens goes through (same as fp's)."""
        return sample_chunks(self.tokens, self.head.weight.shape[0], self.batch_size)

    def kl_sum(self, rows: slice, hidden: torch.Tensor) -> float:
        """Σ KL(fp ‖ q) over the positions of ``rows``; q from final hidden states [rows, T, d]."""
        if self.moments is not None:
            return self.head.kl_sum(self.moments.rows(rows), hidden)
        return kl_sum(self.log_probs[rows], self.head.logits(hidden))


def _check_tokens(tokens: torch.Tensor) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        raise KVTunerError("tokens must be an int64 tensor [num_samples, seq_len]")


def check_batch_size(batch_size: int | None) -> None:
    bad = isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    if batch_size is not None and bad:
        raise KVTunerError(f"--batch-size must be a positive integer, got {batch_size!r}")


def sample_chunks(
    tokens: torch.Tensor, vocab_size: int, batch_size: int | None = None
) -> list[slice]:
    """Row slices of ``tokens``: ``batch_size`` windows per forward, or (None) as many as keep
    their fp32 logits under :data:`LOGITS_CHUNK_BYTES`."""
    check_batch_size(batch_size)
    per_sample = tokens.shape[1] * vocab_size * 4
    rows = batch_size or max(1, LOGITS_CHUNK_BYTES // per_sample)
    return [slice(i, i + rows) for i in range(0, tokens.shape[0], rows)]


def kl_sum(ref_log_probs: torch.Tensor, logits: torch.Tensor) -> float:
    """Sum over positions of KL(p_ref || softmax(logits)); inputs [..., V], summed in fp64."""
    log_q = torch.log_softmax(logits.float(), dim=-1)
    kl = (ref_log_probs.exp() * (ref_log_probs - log_q)).sum(-1)
    return float(kl.double().sum())


def final_hidden(model, ids: torch.Tensor, cache=None) -> torch.Tensor:
    """The decoder's final (normed) hidden states [B, T, hidden] of ``ids``: what the head reads;
    ``cache``: a transformers Cache that stores K/V as a runtime would, or None (fp)."""
    out = model.get_decoder()(input_ids=ids, **cache_kwargs(cache), use_cache=cache is not None)
    return out.last_hidden_state


@torch.inference_mode()
def fp_reference(model, tokens: torch.Tensor, *, batch_size: int | None = None) -> FpReference:
    """Run the unquantized model once and keep what the KL of later runs needs: its head's
    moments (a linear head) or its log-probs; ``batch_size`` windows per forward (None: as many
    as keep one forward's fp32 logits under :data:`LOGITS_CHUNK_BYTES`)."""
    _check_tokens(tokens)
    head, parts, nll = OutputHead.of(model), [], 0.0
    device = model_device(model)
    for rows in sample_chunks(tokens, head.weight.shape[0], batch_size):
        ids = tokens[rows].to(device)
        hidden = final_hidden(model, ids)
        log_probs = torch.log_softmax(head.logits(hidden), dim=-1)
        nll -= float(log_probs[:, :-1].gather(-1, ids[:, 1:, None]).double().sum())
        parts.append(head.moments(log_probs, hidden) if head.linear else log_probs)
    nll /= max(1, tokens.shape[0] * (tokens.shape[1] - 1))
    if head.linear:
        return FpReference(tokens, head, HeadMoments.cat(parts), None, nll, batch_size)
    return FpReference(tokens, head, None, torch.cat(parts), nll, batch_size)


@torch.inference_mode()
def measure_kl(
    model, tokens: torch.Tensor, layer_specs: Sequence[LayerSpec], reference: FpReference
) -> float:
    """Mean over all N*T positions of KL(fp || quantized) with every layer's K/V stored per
    ``layer_specs`` (packed, prefill included) before attention reads them."""
    from ..runtime_loader.hf import make_cache

    return measure_with_cache(model, tokens, reference, lambda: make_cache(model, layer_specs))[0]


@torch.inference_mode()
def measure_with_cache(
    model,
    tokens: torch.Tensor,
    reference: FpReference,
    new_cache: Callable[[], Any],
    *,
    nll: bool = False,
) -> tuple[float, float | None]:
    """(mean KL(fp || quantized) over all N*T positions, mean next-token NLL in nats) with a
    fresh cache from ``new_cache()`` per chunk (any transformers Cache that stores K/V as a
    runtime would, prefill included); the NLL only when ``nll`` (else None)."""
    _check_tokens(tokens)
    reference.check_tokens(tokens)
    total, nll_sum, device = 0.0, 0.0, model_device(model)
    for rows in reference.chunks():
        ids = tokens[rows].to(device)
        hidden = final_hidden(model, ids, new_cache())
        total += reference.kl_sum(rows, hidden)
        if nll:
            nll_sum += reference.head.nll_sum(hidden[:, :-1], ids[:, 1:])
    predicted = tokens.shape[0] * (tokens.shape[1] - 1)
    return total / tokens.numel(), nll_sum / max(1, predicted) if nll else None
