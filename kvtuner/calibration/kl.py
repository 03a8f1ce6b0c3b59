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

LOGITS_CHUNK_BYTES = 256 * 2**20  # bound on one chunk's fp32 logits [B, T, V]

__all__ = [
    "FpReference",
    "check_batch_size",
    "fp_reference",
    "kl_sum",
    "measure_kl",
    "measure_with_cache",
    "sample_chunks",
]


@dataclass(frozen=True)
class FpReference:
    """fp next-token log-probs of the calibration tokens.

    tokens: int64 [N, T] as given (CPU); log_probs on the model's device.
    log_probs: fp32 [N, T, V], log_softmax of the fp model's logits at every position.
    nll: mean next-token negative log-likelihood over the N*(T-1) predicted tokens (nats).
    """

    tokens: torch.Tensor = field(repr=False)
    log_probs: torch.Tensor = field(repr=False)
    nll: float
    batch_size: int | None = None  # windows per forward (None: bounded by logits bytes)

    def __post_init__(self) -> None:
        if self.log_probs.shape[:2] != self.tokens.shape or self.log_probs.dtype != torch.float32:
            raise KVTunerError("fp reference: log_probs must be fp32 [N, T, V] matching tokens")

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)

    def check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.shape != self.tokens.shape or not torch.equal(tokens, self.tokens):
            raise KVTunerError("fp reference was computed on different tokens")

    def chunks(self) -> list[slice]:
        """The row slices every quantized run of these tokens goes through (same as fp's)."""
        return sample_chunks(self.tokens, self.log_probs.shape[-1], self.batch_size)


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


@torch.inference_mode()
def fp_reference(model, tokens: torch.Tensor, *, batch_size: int | None = None) -> FpReference:
    """Run the unquantized model once and keep its next-token log-probs (fp32 [N, T, V]),
    ``batch_size`` windows per forward (None: as many as fit :data:`LOGITS_CHUNK_BYTES`)."""
    _check_tokens(tokens)
    chunks, nll = [], 0.0
    device = model_device(model)
    for rows in sample_chunks(tokens, model.config.get_text_config().vocab_size, batch_size):
        ids = tokens[rows].to(device)
        log_probs = torch.log_softmax(model(ids, use_cache=False).logits.float(), dim=-1)
        target = log_probs[:, :-1].gather(-1, ids[:, 1:, None])
        nll -= float(target.double().sum())
        chunks.append(log_probs)
    predicted = tokens.shape[0] * (tokens.shape[1] - 1)
    return FpReference(tokens, torch.cat(chunks), nll / max(1, predicted), batch_size)


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
        logits = model(ids, past_key_values=new_cache(), use_cache=True).logits
        total += kl_sum(reference.log_probs[rows], logits)
        if nll:
            log_q = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            nll_sum -= float(log_q.gather(-1, ids[:, 1:, None]).double().sum())
    predicted = tokens.shape[0] * (tokens.shape[1] - 1)
    return total / tokens.numel(), nll_sum / max(1, predicted) if nll else None
