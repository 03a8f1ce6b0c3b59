"""Lazy mode with the batch announced (as the plugin does before every forward): one
dequantization of the batch per layer, each request's K/V read served from it, exactly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_kv_pair import PAIRED
from test_pool import HEADS, SIZE, SPECS, D, Layer, make_pool
from tiny_profiles import tiny_profile

from kvtuner.runtime_loader.sglang.pool.lazy_reads.batch_reads import batch_read_slots

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

LAYERS = [*SPECS, *PAIRED]  # unpaired and paired layers


@pytest.fixture
def pool_and_batch():
    g = torch.Generator().manual_seed(7)
    profile = tiny_profile(LAYERS, heads=HEADS, head_dim=D)
    pool = make_pool(profile, read_mode="lazy", decode_cache_tokens=0)  # batch reads alone
    loc = torch.randperm(SIZE, generator=g)[:30] + 1
    for layer in range(len(LAYERS)):
        k, v = (torch.randn(30, HEADS, D, generator=g) for _ in range(2))
        pool.set_kv_buffer(Layer(layer), loc, k, v)
    # three requests; the third shares the first's 3-slot prefix (a radix-cache hit)
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    req_to_token[1, :5], req_to_token[3, :9] = loc[:5], loc[5:14]
    req_to_token[0, :3], req_to_token[0, 3:7] = loc[:3], loc[20:24]
    rows, lens = torch.tensor([1, 3, 0]), torch.tensor([5, 9, 7])
    batch = SimpleNamespace(req_pool_indices=rows, seq_lens=lens)
    pool.prepare_reads(batch_read_slots(batch, req_to_token))
    requests = [req_to_token[r, :n] for r, n in zip(rows.tolist(), lens.tolist(), strict=True)]
    return pool, requests


def _exact(a, b):
    return a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _from_batch(pool, out, which):
    dense = pool._parts.reads.batch._kv[0 if which == "k" else 1]
    return out.untyped_storage().data_ptr() == dense.untyped_storage().data_ptr()


def test_each_request_is_served_from_one_batch_dequantization(pool_and_batch):
    pool, requests = pool_and_batch
    for layer in range(len(LAYERS)):
        k_view, v_view = pool.get_kv_buffer(layer)
        for tokens in requests:  # torch_native's order: K then V, request by request
            k_hat, v_hat = pool.read_kv(layer, tokens)
            k, v = k_view[tokens], v_view[tokens]
            assert _exact(k, k_hat) and _exact(v, v_hat)
            assert _from_batch(pool, k, "k") and _from_batch(pool, v, "v")


def test_a_write_after_the_batch_was_dequantized_is_seen(pool_and_batch):
    pool, requests = pool_and_batch
    k_view = pool.get_key_buffer(2)
    k_view[requests[0]]
    new = torch.full((1, HEADS, D), 7.0)
    pool.set_kv_buffer(Layer(2), requests[1][:1].long(), new, new)
    k = k_view[requests[1]]
    assert torch.equal(k[0], new[0]) and _exact(k, pool.read_kv(2, requests[1])[0])


def test_reads_outside_the_announced_order_are_read_directly(pool_and_batch):
    pool, requests = pool_and_batch
    k_view, v_view = pool.get_kv_buffer(3)
    for tokens in (requests[2], requests[0][1:4], torch.tensor([1, 2, 3])):
        k = k_view[tokens]
        assert _exact(k, pool.read_kv(3, tokens)[0]) and not _from_batch(pool, k, "k")
    pool.prepare_reads(torch.empty(0, dtype=torch.int64))  # an empty batch: direct reads
    assert _exact(v_view[requests[1]], pool.read_kv(3, requests[1])[1])
