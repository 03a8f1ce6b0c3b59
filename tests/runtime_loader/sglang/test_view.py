"""The lazy read mode: get_key_buffer/get_value_buffer hand out DequantizedViews that gather and
dequantize exactly the indexed slots, read by SGLang's real torch_native attention code."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_pool import HEADS, SIZE, SPECS, D, Layer, make_pool

from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size, read_mode
from kvtuner.runtime_loader.sglang.pool.lazy_reads.batch_reads import batch_read_slots

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed


@pytest.fixture
def pools(profile_and_writes):
    """(lazy, scratch) pools holding the same random K/V in the same random slots."""
    profile, loc, writes = profile_and_writes
    out = []
    for mode in ("lazy", "scratch"):
        pool = make_pool(profile, read_mode=mode)
        for layer, (k, v) in writes.items():
            pool.set_kv_buffer(Layer(layer), loc, k, v)
        out.append(pool)
    return (*out, loc)


@pytest.fixture
def profile_and_writes():
    from tiny_profiles import tiny_profile

    g = torch.Generator().manual_seed(1)
    loc = torch.randperm(SIZE, generator=g)[:24] + 1  # slot 0 is the padding slot
    writes = {
        layer: tuple(torch.randn(24, HEADS, D, generator=g) * 2 for _ in range(2))
        for layer in range(len(SPECS))
    }
    return tiny_profile(SPECS, heads=HEADS, head_dim=D), loc, writes


def test_the_view_returns_read_kv_of_exactly_the_indexed_slots(pools):
    lazy, _, loc = pools
    for layer in range(len(SPECS)):
        k_view, v_view = lazy.get_kv_buffer(layer)
        assert k_view.shape == (SIZE + 1, HEADS, D) and k_view.dtype == torch.float32
        assert k_view.device == torch.device("cpu") and len(k_view) == SIZE + 1
        slots = loc[[3, 0, 7, 7, 11]].to(torch.int32)  # what torch_native passes: req_to_token
        k_hat, v_hat = lazy.read_kv(layer, slots)
        assert torch.equal(k_view[slots], k_hat) and torch.equal(v_view[slots], v_hat)
        assert torch.equal(k_view[slots.long()], k_hat)
        grid = slots[:4].reshape(2, 2)
        assert torch.equal(k_view[grid], k_hat[:4].reshape(2, 2, HEADS, D))
        assert torch.equal(v_view[int(slots[2])], v_hat[2])
        assert torch.equal(v_view[slots.tolist()], v_hat)
        assert torch.equal(k_view[2:5], lazy.read_kv(layer, torch.arange(2, 5))[0])


def test_the_view_refuses_what_is_not_slot_ids(pools):
    k_view = pools[0].get_key_buffer(0)
    for bad in (torch.ones(SIZE + 1, dtype=torch.bool), torch.tensor([1.0]), (slice(None), 0)):
        with pytest.raises(TypeError, match="DequantizedView"):
            k_view[bad]


def test_both_read_modes_give_the_same_values_and_lazy_has_no_scratch(pools):
    lazy, scratch, loc = pools
    batch = loc[5:17]
    scratch.prepare_reads(batch)
    for layer in range(len(SPECS)):
        pairs = zip(lazy.get_kv_buffer(layer), scratch.get_kv_buffer(layer), strict=True)
        for ours, theirs in pairs:
            assert torch.equal(ours[batch], theirs[batch])
    assert lazy.scratch_bytes() == 0 and lazy._parts.reads.scratch is None
    assert scratch.scratch_bytes() == 2 * (SIZE + 1) * HEADS * D * 4
    assert lazy.get_kv_size_bytes() == scratch.get_kv_size_bytes()
    assert lazy.get_kv_buffer_shape() == scratch.get_kv_buffer_shape()


def test_lazy_reads_need_no_announcement_and_see_every_write(pools):
    lazy, _, loc = pools
    before = lazy.get_key_buffer(0)[loc[:1]]
    lazy.set_kv_buffer(Layer(0), loc[:1], torch.full((1, HEADS, D), 5.0), torch.zeros(1, HEADS, D))
    after = lazy.get_key_buffer(0)[loc[:1]]
    assert torch.allclose(after, torch.full_like(after, 5.0)) and not torch.equal(before, after)


def _torch_native_batch(loc):
    """Two requests in req_to_token over the written slots: lengths 9 and 14."""
    req_to_token = torch.zeros(3, 16, dtype=torch.int32)
    req_to_token[0, :9], req_to_token[2, :14] = loc[:9], loc[9:23]
    return req_to_token, torch.tensor([0, 2]), torch.tensor([9, 14])


@pytest.mark.parametrize("announced", [True, False])
def test_sglang_torch_native_attention_reads_the_view_like_the_scratch(pools, announced):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    lazy, scratch, loc = pools
    backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)  # its sdpa loops only
    req_to_token, rows, seq_lens = _torch_native_batch(loc)
    batch = SimpleNamespace(req_pool_indices=rows, seq_lens=seq_lens)
    slots = batch_read_slots(batch, req_to_token)
    scratch.prepare_reads(slots)
    if announced:  # as the plugin does before each forward
        lazy.prepare_reads(slots)
    q = torch.randn(2, HEADS, D, generator=torch.Generator().manual_seed(2))
    q_ext = torch.randn(5, HEADS, D, generator=torch.Generator().manual_seed(3))
    ext = dict(extend_prefix_lens=torch.tensor([7, 11]), extend_seq_lens=torch.tensor([2, 3]))
    for layer in range(len(SPECS)):
        outs = []
        for pool in (lazy, scratch):
            k, v = pool.get_kv_buffer(layer)
            dec, extend = torch.empty_like(q), torch.empty_like(q_ext)
            backend._run_sdpa_forward_decode(q, dec, k, v, req_to_token, rows, seq_lens)
            backend._run_sdpa_forward_extend(
                q_ext, extend, k, v, req_to_token, rows, seq_lens, **ext, causal=True
            )
            outs.append((dec, extend))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_cell_size_per_read_mode(profile_and_writes):
    profile = profile_and_writes[0]
    args = dict(heads=HEADS, start_layer=0, num_layers=len(SPECS), dtype_bytes=2)
    lazy = cell_size(profile, **args, read_mode="lazy")
    scratch = cell_size(profile, **args, read_mode="scratch")
    packed = HEADS * sum(s.row_bytes(D) for pair in SPECS for s in pair)
    assert lazy.packed == scratch.packed == packed
    assert (lazy.scratch, lazy.total) == (0, packed)
    assert scratch.total == packed + HEADS * 2 * D * 2
    pool = make_pool(profile, read_mode="lazy", dtype=torch.float16)
    assert sum(pool.get_kv_size_bytes()) == (SIZE + 1) * lazy.total


@pytest.mark.parametrize(
    "backends,mode",
    [
        (dict(attention_backend="torch_native"), "lazy"),
        (dict(attention_backend=None, prefill_attention_backend="torch_native"), "scratch"),
        (
            dict(
                attention_backend="triton",
                prefill_attention_backend="torch_native",
                decode_attention_backend="torch_native",
            ),
            "lazy",
        ),
        (dict(attention_backend="torch_native", decode_attention_backend="triton"), "scratch"),
        (dict(attention_backend="triton"), "scratch"),
        (dict(attention_backend="intel_amx"), "scratch"),
        (dict(attention_backend=None), "scratch"),
        (dict(attention_backend="kvtuner"), "packed"),
        (dict(attention_backend="kvtuner", prefill_attention_backend="triton"), "scratch"),
    ],
)
def test_read_mode_follows_the_attention_backends(backends, mode):
    args = {"prefill_attention_backend": None, "decode_attention_backend": None, **backends}
    assert read_mode(SimpleNamespace(**args)) == mode
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    assert KVTunerMHATokenToKVPool.bound(None, mode).bound_read_mode == mode
