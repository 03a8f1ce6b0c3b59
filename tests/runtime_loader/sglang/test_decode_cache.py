"""Lazy mode's DecodeCache: decode steps dequantize only the new token, every read equals
``read_kv`` of the same slots exactly, reused slots are never served stale, memory is bounded."""

from __future__ import annotations

import pytest
import torch
from test_kv_pair import PAIRED
from test_pool import HEADS, SIZE, SPECS, D, Layer, make_pool
from tiny_profiles import tiny_profile

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

LAYERS = [*SPECS, *PAIRED]  # mixed bits, rotated keys, symmetric, 16-bit, paired layers


def counting_pool(dtype=torch.float16, read_mode="lazy", **kw):
    """The real pool, recording the length of every ``read_kv`` (one dequantization)."""
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    class Counting(KVTunerMHATokenToKVPool):
        def read_kv(self, layer_id, loc):
            self.reads.append(loc.numel())
            return super().read_kv(layer_id, loc)

    profile = tiny_profile(LAYERS, heads=HEADS, head_dim=D)
    pool = make_pool(profile, Counting, dtype, read_mode=read_mode, **kw)
    pool.reads = []
    return pool


def _exact(a, b):
    return a.dtype == b.dtype and torch.equal(a, b)


def _write(pool, slots, g, dtype=torch.float16):
    for layer in range(len(LAYERS)):
        k, v = ((torch.randn(len(slots), HEADS, D, generator=g) * 3).to(dtype) for _ in range(2))
        pool.set_kv_buffer(Layer(layer), slots, k, v)


def _read_all(pool, slots):
    """torch_native's reads of one request: K then V of every layer; checked against read_kv."""
    for layer in range(len(LAYERS)):
        k_view, v_view = pool.get_kv_buffer(layer)
        k, v = k_view[slots.int()], v_view[slots.int()]  # torch_native indexes with int32
        k_ref, v_ref = KVTunerRead.read(pool, layer, slots)
        assert _exact(k, k_ref) and _exact(v, v_ref)


class KVTunerRead:
    @staticmethod
    def read(pool, layer, slots):
        reads = list(pool.reads)
        out = pool.read_kv(layer, slots)
        pool.reads[:] = reads  # reference reads are not counted
        return out


def _step(pool, slots, g, dtype):
    """One forward as torch_native runs it: per layer, write the new tokens, then read."""
    for layer in range(len(LAYERS)):
        k, v = ((torch.randn(1, HEADS, D, generator=g) * 3).to(dtype) for _ in range(2))
        pool.set_kv_buffer(Layer(layer), slots[-1:], k, v)
        k_view, v_view = pool.get_kv_buffer(layer)
        k, v = k_view[slots.int()], v_view[slots.int()]  # torch_native indexes with int32
        k_ref, v_ref = KVTunerRead.read(pool, layer, slots)
        assert _exact(k, k_ref) and _exact(v, v_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_decode_steps_dequantize_only_the_new_token_and_equal_read_kv(dtype):
    g = torch.Generator().manual_seed(11)
    pool = counting_pool(dtype)
    slots = torch.randperm(SIZE, generator=g)[:30] + 1
    _write(pool, slots[:20], g, dtype)  # prefill
    pool.prepare_reads(slots[:20])
    _read_all(pool, slots[:20])
    # one dequantization of the request per layer; the last layer's write is still fresh
    assert pool.reads == [20] * (len(LAYERS) - 1)
    for n in range(21, 26):  # decode steps: each new token's values come from its write
        pool.reads.clear()
        pool.prepare_reads(slots[:n])
        _step(pool, slots[:n], g, dtype)
        assert pool.reads == []
    for n in range(26, 31):  # writes of all layers before the reads: the new token is unpacked
        pool.reads.clear()
        _write(pool, slots[n - 1 : n], g, dtype)
        _read_all(pool, slots[:n])
        assert pool.reads == [1] * (len(LAYERS) - 1)  # the last layer's write is still fresh
    assert 0 < pool._parts.reads.cache.cached_bytes() <= pool.decode_cache_bound_bytes()


def test_a_reused_slot_is_never_served_stale():
    g = torch.Generator().manual_seed(12)
    pool = counting_pool()
    slots = torch.randperm(SIZE, generator=g)[:12] + 1
    _write(pool, slots, g)
    _read_all(pool, slots)
    before = pool.get_key_buffer(0)[slots].clone()
    _write(pool, slots[5:6], g)  # a new request's token lands in a slot the cache holds
    _write(pool, slots[8:], g)
    _read_all(pool, slots)
    after = pool.get_key_buffer(0)[slots]
    assert torch.equal(after[:5], before[:5]) and not torch.equal(after[5], before[5])


def test_requests_sharing_a_prefix_keep_their_own_entries():
    g = torch.Generator().manual_seed(13)
    pool = counting_pool()
    slots = torch.randperm(SIZE, generator=g)[:24] + 1
    _write(pool, slots, g)
    a, b = slots[:14], torch.cat([slots[:3], slots[14:]])  # a radix-cache hit: same first slots
    for request in (a, b, a, b, a[:6]):
        _read_all(pool, request)
    # the last layer's write (all 24 slots) is still fresh: its reads take rows of it
    others = len(LAYERS) - 1
    assert pool.reads == [14] * others + [13] * others + [6] * others
    pool.reads.clear()
    _read_all(pool, slots[:15])  # a's next decode step: one new slot
    assert pool.reads == [1] * others


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_one_write_for_several_requests_serves_each_its_new_row(dtype):
    """A decode step of a batch writes every request's new token in one call; each request's
    read takes its own row of that write (no unpacking), and equals read_kv."""
    g = torch.Generator().manual_seed(17)
    pool = counting_pool(dtype)
    slots = (torch.randperm(SIZE, generator=g)[:33] + 1).reshape(3, 11)  # 3 requests
    _write(pool, slots[:, :8].reshape(-1), g, dtype)
    for request in slots[:, :8]:
        _read_all(pool, request)
    for n in (9, 10, 11):
        pool.reads.clear()
        for layer in range(len(LAYERS)):
            k, v = ((torch.randn(3, HEADS, D, generator=g) * 3).to(dtype) for _ in range(2))
            pool.set_kv_buffer(Layer(layer), slots[:, n - 1], k, v)  # request order, as SGLang
            for request in reversed(slots[:, :n]):  # any order: rows are found by slot id
                k_view, v_view = pool.get_kv_buffer(layer)
                got = k_view[request.int()], v_view[request.int()]
                ref = KVTunerRead.read(pool, layer, request)
                assert _exact(got[0], ref[0]) and _exact(got[1], ref[1])
        assert pool.reads == []


def test_the_cache_stays_within_its_bound_and_what_does_not_fit_is_read_directly():
    g = torch.Generator().manual_seed(14)
    pool = counting_pool(decode_cache_tokens=32)  # per layer: one 20-token request (cap 32)
    slots = torch.randperm(SIZE, generator=g)[:40] + 1
    _write(pool, slots, g)
    first, second = slots[:20], slots[20:40]
    _read_all(pool, first)
    cached, keys = pool._parts.reads.cache.cached_bytes(), set(pool._parts.reads.cache._entries)
    for _ in range(2):  # does not fit next to the first: read directly, twice
        _read_all(pool, second)
        assert (
            pool._parts.reads.cache.cached_bytes() == cached
            and set(pool._parts.reads.cache._entries) == keys
        )
    assert cached <= pool.decode_cache_bound_bytes() == 32 * len(LAYERS) * 2 * HEADS * D * 2


def test_idle_entries_are_evicted_and_scratch_mode_has_no_cache():
    from kvtuner.runtime_loader.sglang.pool.lazy_reads.decode_cache import IDLE_STEPS

    g = torch.Generator().manual_seed(15)
    pool = counting_pool()
    slots = torch.randperm(SIZE, generator=g)[:10] + 1
    _write(pool, slots, g)
    _read_all(pool, slots)
    for _ in range(IDLE_STEPS + 1):
        assert pool._parts.reads.cache.cached_bytes() > 0
        pool.prepare_reads(torch.empty(0, dtype=torch.int64))
    assert pool._parts.reads.cache.cached_bytes() == 0
    scratch = make_pool(tiny_profile(LAYERS, heads=HEADS, head_dim=D), read_mode="scratch")
    assert not scratch._parts.reads.cache.enabled and scratch.decode_cache_bound_bytes() == 0


def test_dequantizing_rows_alone_or_in_a_batch_gives_the_same_bits():
    """The premise of appending rows: the keys' un-rotation (Hadamard butterflies) of a row
    does not depend on the rows it is computed with."""
    from kvtuner.quant.reference import times_hadamard

    g = torch.Generator().manual_seed(16)
    for rows in (1, 3, 7, 48, 300, 1353):
        x = torch.randn(rows, D, generator=g) * torch.rand(rows, 1, generator=g) * 10
        full = times_hadamard(x)
        for i in list(range(0, rows, max(1, rows // 7))) + [rows - 1]:
            assert torch.equal(full[i : i + 3], times_hadamard(x[i : i + 3]))
            assert torch.equal(full[i], times_hadamard(x[i]))


def test_the_bound_comes_from_the_environment(monkeypatch):
    from kvtuner.errors import KVTunerError
    from kvtuner.runtime_loader.sglang.hooks.server_flag import CACHE_ENV_VAR, decode_cache_tokens
    from kvtuner.runtime_loader.sglang.pool.lazy_reads.decode_cache import (
        DEFAULT_DECODE_CACHE_TOKENS,
    )

    monkeypatch.delenv(CACHE_ENV_VAR, raising=False)
    assert decode_cache_tokens() == DEFAULT_DECODE_CACHE_TOKENS
    monkeypatch.setenv(CACHE_ENV_VAR, "0")
    assert decode_cache_tokens() == 0
    monkeypatch.setenv(CACHE_ENV_VAR, "-5")
    with pytest.raises(KVTunerError, match=CACHE_ENV_VAR):
        decode_cache_tokens()
