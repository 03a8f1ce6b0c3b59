"""Gemma-like (sliding window, tanh logit cap) and GPT-OSS-like (attention sinks) layers through
the kvtuner backend, with the real SGLang classes on CPU tensors (kernels under
TRITON_INTERPRET), over the pool the shared fixture builds:
- a window alone against SGLang's stock TorchNativeAttnBackend over the dequantized pool;
- window, cap and sinks together against SGLang's own Triton attention kernels (the ones its
  TritonAttnBackend launches: ``decode_attention_fwd``, ``extend_attention_fwd``) over the
  dequantized pool, run by Triton's interpreter.

Window convention: SGLang's ``sliding_window_size`` W lets a query at p attend p - W .. p (its
extend kernel, torch_native, FlashInfer, FA3; HF's ``sliding_window`` is W + 1). The decode
reference below gathers those W + 1 slots. SGLang's Triton backend builds decode windows of W
slots (``update_sliding_window_buffer``: ``min(seq_lens, W)``), one fewer than its own extend.
"""

from __future__ import annotations

import pytest
import torch
from test_backend import (
    HEADS,
    NEW,
    PREFIX,
    Q_HEADS,
    SPECS,
    D,
    dequantized_copy,
    fill_prefix,
    forward_batch,
    place,
    radix,
    runner,
    sglang_parts,  # noqa: F401 (the fixture)
)

from kvtuner.errors import KVTunerError

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

ROWS = [3, 1, 6, 2]  # req_pool_indices: not in order
WINDOW, CAP = 9, 2.0  # SGLang's sliding_window_size (exclusive); a cap that bends the scores


def step(mode, parts, seed):
    """A batch (decode: one new token each; extend: ragged) with its prefix stored."""
    packed, _, req_to_token_pool = parts
    g = torch.Generator().manual_seed(seed)
    new = [1] * 4 if mode == "decode" else NEW
    prefix = [p if mode == "extend" else p + 1 for p in PREFIX]
    place(req_to_token_pool, ROWS, [p + n for p, n in zip(prefix, new, strict=True)], seed=seed)
    fill_prefix(packed, req_to_token_pool, ROWS, prefix, g)
    return forward_batch(mode, ROWS, prefix, new, req_to_token_pool), g


def qkv(n, g):
    q = torch.randn(n, Q_HEADS * D, generator=g) * 3
    return q, *(torch.randn(n, HEADS, D, generator=g) for _ in range(2))


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_window_layers_match_torch_native_over_the_dequantized_pool(sglang_parts, mode):  # noqa: F811
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    packed, stock, req_to_token_pool = sglang_parts
    fb, g = step(mode, sglang_parts, seed=11)
    ours = KVTunerAttnBackend(runner(packed, req_to_token_pool))
    theirs = TorchNativeAttnBackend(runner(stock, req_to_token_pool))
    ours.init_forward_metadata(fb)
    theirs.init_forward_metadata(fb)
    for layer_id in range(len(SPECS)):
        layer = radix(layer_id, sliding_window_size=WINDOW)
        q, k, v = qkv(fb.input_ids.numel(), g)
        got = ours.forward(q, k, v, layer, fb)  # stores the new tokens (quantized), attends
        dequantized_copy(packed, stock)  # extend attends the new tokens exact: stock stores them
        want = theirs.forward(q, k, v, layer, fb, save_kv_cache=mode == "extend")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def sglang_decode(stock, layer, fb, req_to_token_pool, q, k, v, sinks):
    """SGLang's Triton decode kernel over each request's last W + 1 slots."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    table, lens = req_to_token_pool.req_to_token, fb.seq_lens.tolist()
    starts = [max(0, n - WINDOW - 1) for n in lens]
    slots = [table[r, s:n] for r, s, n in zip(ROWS, starts, lens, strict=True)]
    indptr = torch.tensor([0, *torch.tensor([len(x) for x in slots]).cumsum(0)], dtype=torch.int32)
    q3, splits = q.view(-1, Q_HEADS, D), 2
    out = torch.empty_like(q3)
    logits = torch.empty(len(ROWS), Q_HEADS, splits, D)
    lse = torch.empty(len(ROWS), Q_HEADS, splits)
    decode_attention_fwd(
        q3, stock.k_buffer[layer.layer_id], stock.v_buffer[layer.layer_id], out, indptr,
        torch.cat(slots).long(), logits, lse, torch.full((len(ROWS),), splits, dtype=torch.int32),
        splits, layer.scaling, 1.0, 1.0, logit_cap=CAP, sinks=sinks,
    )  # fmt: skip
    return out.view(q.shape)


def sglang_extend(stock, layer, fb, req_to_token_pool, q, k, v, sinks):
    """SGLang's Triton extend kernel: prefix slots from req_to_token, the new tokens' K/V as
    computed (k, v [N, Hkv·D]), as SGLang serves its own quantized caches."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    table = req_to_token_pool.req_to_token
    prefix = fb.extend_prefix_lens.tolist()
    slots = torch.cat([table[r, :p] for r, p in zip(ROWS, prefix, strict=True)]).long()
    kv_indptr = torch.tensor([0, *torch.tensor(prefix).cumsum(0)], dtype=torch.int32)
    qo_indptr = torch.tensor([0, *torch.tensor(NEW).cumsum(0)], dtype=torch.int32)
    k_buf, v_buf = stock.k_buffer[layer.layer_id], stock.v_buffer[layer.layer_id]
    q3 = q.view(-1, Q_HEADS, D)
    out = torch.empty_like(q3)
    extend_attention_fwd(
        q3, k.view(-1, HEADS, D), v.view(-1, HEADS, D), out, k_buf, v_buf, qo_indptr,
        kv_indptr, slots, None, True, None, max(NEW), 1.0, 1.0, sm_scale=layer.scaling,
        logit_cap=CAP, sliding_window_size=WINDOW, sinks=sinks,
    )  # fmt: skip
    return out.view(q.shape)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_window_cap_and_sinks_match_sglangs_triton_kernels(sglang_parts, mode):  # noqa: F811
    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    packed, stock, req_to_token_pool = sglang_parts
    fb, g = step(mode, sglang_parts, seed=12)
    ours = KVTunerAttnBackend(runner(packed, req_to_token_pool))
    ours.init_forward_metadata(fb)
    theirs = sglang_decode if mode == "decode" else sglang_extend
    for layer_id in range(len(SPECS)):
        layer = radix(layer_id, sliding_window_size=WINDOW, logit_cap=CAP)
        q, k, v = qkv(fb.input_ids.numel(), g)
        sinks = torch.randn(Q_HEADS, generator=g)
        got = ours.forward(q, k, v, layer, fb, sinks=sinks)
        dequantized_copy(packed, stock)
        want = theirs(stock, layer, fb, req_to_token_pool, q, k, v, sinks)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_gemma_and_gpt_oss_layers_are_served_and_other_keywords_refused(sglang_parts):  # noqa: F811
    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend, layer_softmax

    packed, _, req_to_token_pool = sglang_parts
    layers = [radix(0, sliding_window_size=WINDOW, logit_cap=CAP), radix(1), radix(2)]
    backend = KVTunerAttnBackend(runner(packed, req_to_token_pool, torch.nn.ModuleList(layers)))
    assert layer_softmax(layers[0]) == dict(window=WINDOW + 1, logit_cap=CAP)
    assert layer_softmax(layers[1]) == dict(window=None, logit_cap=None)
    fb, g = step("decode", sglang_parts, seed=13)
    backend.init_forward_metadata(fb)
    q, k, v = qkv(4, g)
    with pytest.raises(KVTunerError, match=r"\['score_mod'\]"):
        backend.forward(q, k, v, layers[1], fb, score_mod=torch.zeros(1))
