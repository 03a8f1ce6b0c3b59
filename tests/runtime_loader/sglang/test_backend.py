"""The kvtuner attention backend against SGLang's stock TorchNativeAttnBackend over the
dequantized pool: real ForwardBatch, ReqToTokenPool, RadixAttention and pools on CPU tensors
(the fused kernels under TRITON_INTERPRET)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from tiny_profiles import tiny_profile

from kvtuner.errors import KVTunerError
from kvtuner.quant import KeySmoothing, QuantSpec

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

SIZE, HEADS, D, Q_HEADS = 200, 2, 64, 8  # GQA: 4 query heads per KV head
SPECS = [  # per layer (k, v): several widths, a rotated key, symmetric, 16-bit, mixed
    (QuantSpec(4), QuantSpec(2, symmetric=True)),
    (QuantSpec(8, rotation="hadamard"), QuantSpec(3, group_size=16)),  # smoothed keys (v3)
    (QuantSpec(16), QuantSpec(6)),
]
SMOOTHED = 1
PREFIX = [37, 0, 12, 70]  # stored before the step (request 1 is new)
NEW = [5, 9, 1, 3]  # ragged extend: new tokens per request


@pytest.fixture(scope="module")
def sglang_parts():
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    profile = smoothed(tiny_profile(SPECS, heads=HEADS, head_dim=D), SMOOTHED)
    return _parts(KVTunerMHATokenToKVPool, profile)


def _parts(pool_class, profile):
    """(the kvtuner pool of ``pool_class`` in packed read mode, SGLang's stock pool, a
    ReqToTokenPool)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    common = dict(page_size=1, dtype=torch.float32, head_num=HEADS, head_dim=D,
                  layer_num=len(profile.layers), device="cpu",
                  enable_memory_saver=False)  # fmt: skip
    packed = pool_class(SIZE, profile=profile, read_mode="packed", **common)
    stock = MHATokenToKVPool(SIZE, **common)
    req_to_token = ReqToTokenPool(8, 128, "cpu", False)
    return packed, stock, req_to_token


def smoothed(profile, layer_id):
    """The profile with layer ``layer_id``'s keys smoothed (rows hold k / λ)."""
    g = torch.Generator().manual_seed(5)
    lam = KeySmoothing.from_magnitudes(torch.rand(HEADS, D, generator=g) * 20 + 0.1, 0.5)
    layers = list(profile.layers)
    layers[layer_id] = replace(layers[layer_id], k_smooth=lam)
    return replace(profile, layers=tuple(layers), schema_version=None)


def runner(pool, req_to_token_pool, model=None):
    return SimpleNamespace(device="cpu", token_to_kv_pool=pool,
                           req_to_token_pool=req_to_token_pool, model=model)  # fmt: skip


def radix(layer_id, **kw):
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention(Q_HEADS, D, D**-0.5, HEADS, layer_id, **kw)


def place(req_to_token_pool, rows, totals, seed):
    """Each request's slots in req_to_token (random, distinct, never slot 0)."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(SIZE - 1, generator=g) + 1
    used = 0
    for row, n in zip(rows, totals, strict=True):
        req_to_token_pool.req_to_token[row, :n] = free[used : used + n].int()
        used += n


def forward_batch(mode, rows, prefix, new, req_to_token_pool):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    totals = [p + n for p, n in zip(prefix, new, strict=True)]
    table = req_to_token_pool.req_to_token
    out_loc = torch.cat(
        [table[r, p:t] for r, p, t in zip(rows, prefix, totals, strict=True)]
    ).long()
    extend = dict(
        extend_seq_lens=torch.tensor(new), extend_prefix_lens=torch.tensor(prefix),
        extend_seq_lens_cpu=list(new), extend_prefix_lens_cpu=list(prefix),
        extend_num_tokens=sum(new),
    )  # fmt: skip
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE if mode == "decode" else ForwardMode.EXTEND,
        batch_size=len(rows),
        input_ids=torch.zeros(sum(new), dtype=torch.long),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(totals),
        out_cache_loc=out_loc,
        seq_lens_sum=sum(totals),
        seq_lens_cpu=torch.tensor(totals),
        **(extend if mode == "extend" else {}),
    )


def fill_prefix(pool, req_to_token_pool, rows, prefix, g):
    for layer_id in range(pool.layer_num):
        for row, n in zip(rows, prefix, strict=True):
            loc = req_to_token_pool.req_to_token[row, :n].long()
            k, v = (torch.randn(n, HEADS, D, generator=g) * 2 for _ in range(2))
            pool.set_kv_buffer(radix(layer_id), loc, k, v)


def dequantized_copy(packed, stock):
    """The stock pool holds what the packed pool dequantizes to, slot for slot."""
    every = torch.arange(SIZE + 1)
    for layer_id in range(packed.layer_num):
        k, v = packed.read_kv(layer_id, every)
        stock.k_buffer[layer_id][:] = k
        stock.v_buffer[layer_id][:] = v


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_backend_matches_torch_native_over_the_dequantized_pool(sglang_parts, mode):
    matches_torch_native(sglang_parts, mode)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_a_pool_of_planes_attends_as_torch_native_does(mode):
    """Written by the (interpreted) Triton kernels, 72-byte key rows (8-bit g32 at d 64, 2
    heads) are laid out as planes, and the backend reads them so (its ``planes``)."""
    from kvtuner.quant import triton_kernels
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    if not triton_kernels.interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1")

    class TritonPool(KVTunerMHATokenToKVPool):
        scatter = staticmethod(triton_kernels.triton_scatter_quantized)
        scatter_kv = staticmethod(triton_kernels.triton_scatter_kv)
        gather = staticmethod(triton_kernels.triton_gather_dequantized)

    profile = tiny_profile([(QuantSpec(8), QuantSpec(4, 64))], heads=HEADS, head_dim=D)
    parts = _parts(TritonPool, profile)
    assert parts[0].packed_planes(0)
    matches_torch_native(parts, mode)


def matches_torch_native(parts, mode):
    """The backend's decode or extend step, layer by layer, against SGLang's torch_native over
    a stock pool holding what the packed one dequantizes to."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    packed, stock, req_to_token_pool = parts
    g = torch.Generator().manual_seed(1)
    rows = [3, 1, 6, 2]  # req_pool_indices: not in order
    new = [1] * 4 if mode == "decode" else NEW
    prefix = [p if mode == "extend" else p + 1 for p in PREFIX]
    place(req_to_token_pool, rows, [p + n for p, n in zip(prefix, new, strict=True)], seed=2)
    fill_prefix(packed, req_to_token_pool, rows, prefix, g)
    fb = forward_batch(mode, rows, prefix, new, req_to_token_pool)
    ours = KVTunerAttnBackend(runner(packed, req_to_token_pool))
    theirs = TorchNativeAttnBackend(runner(stock, req_to_token_pool))
    ours.init_forward_metadata(fb)
    theirs.init_forward_metadata(fb)
    for layer_id in range(packed.layer_num):
        layer = radix(layer_id)
        q = torch.randn(sum(new), Q_HEADS * D, generator=g)
        k, v = (torch.randn(sum(new), HEADS, D, generator=g) for _ in range(2))
        got = ours.forward(q, k, v, layer, fb)  # stores the new tokens (quantized), attends
        dequantized_copy(packed, stock)  # extend attends the new tokens exact: stock stores them
        want = theirs.forward(q, k, v, layer, fb, save_kv_cache=mode == "extend")
        assert got.shape == want.shape == (sum(new), Q_HEADS * D)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_cuda_graph_metadata_reads_lengths_from_static_buffers(sglang_parts):
    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    packed, _, req_to_token_pool = sglang_parts
    backend = KVTunerAttnBackend(runner(packed, req_to_token_pool))
    backend.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
    rows, prefix = [3, 1, 6], [9, 4, 20]
    place(req_to_token_pool, rows, [p + 1 for p in prefix], seed=3)
    fb = forward_batch("decode", rows, prefix, [1, 1, 1], req_to_token_pool)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    captured = backend.forward_metadata
    assert captured.slot_table.shape == req_to_token_pool.req_to_token.shape  # static width
    backend.init_forward_metadata_in_graph(fb)  # what the graph records and replays
    assert captured.lengths.tolist() == [10, 5, 21] and captured.table_rows.tolist() == rows
    eager = KVTunerAttnBackend(runner(packed, req_to_token_pool))
    eager.init_forward_metadata(fb)
    q = torch.randn(3, Q_HEADS * D)
    for layer_id in range(len(SPECS)):
        layer = radix(layer_id)
        graphed = backend.forward_decode(q, None, None, layer, fb, save_kv_cache=False)
        torch.testing.assert_close(graphed, eager.forward_decode(q, None, None, layer, fb))
    with pytest.raises(KVTunerError, match="decode graphs only"):
        backend.init_forward_metadata_out_graph(
            forward_batch("extend", rows, prefix, [1, 1, 1], req_to_token_pool), in_capture=True
        )


@pytest.mark.parametrize(
    "change,what",
    [
        (dict(logit_cap=30.0, logit_capping_method="clip"), "logit capping method 'clip'"),
        (dict(is_cross_attention=True), "cross attention"),
    ],
)
def test_layers_the_kernels_cannot_serve_are_refused_at_start_with_one_line(
    sglang_parts, change, what
):
    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    packed, _, req_to_token_pool = sglang_parts
    model = torch.nn.ModuleList([radix(0), radix(1, **change)])
    with pytest.raises(KVTunerError, match=what) as info:
        KVTunerAttnBackend(runner(packed, req_to_token_pool, model))
    assert "layer 1" in str(info.value) and "\n" not in str(info.value)


def test_backend_needs_the_kvtuner_pool(sglang_parts):
    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    _, stock, req_to_token_pool = sglang_parts
    with pytest.raises(KVTunerError, match="--kvtuner-profile"):
        KVTunerAttnBackend(runner(stock, req_to_token_pool))


def test_packed_mode_hands_out_the_packed_rows_and_costs_packed_bytes_only(sglang_parts):
    packed = sglang_parts[0]
    k_rows, v_rows = packed.packed_rows(0)
    assert packed.get_key_buffer(0) is k_rows and packed.get_value_buffer(0) is v_rows
    assert k_rows.dtype == torch.uint8 and packed.scratch_bytes() == 0
