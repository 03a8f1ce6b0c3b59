"""Layers whose K and V share a grid are quantized/dequantized in one call: same bytes and values
as the reference per tensor."""

from __future__ import annotations

import pytest
import torch
from test_pool import HEADS, SIZE, D, Layer, make_pool
from tiny_profiles import tiny_profile

from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.runtime_loader.sglang.pool.cpu_writes.kv_pair import pair_spec

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

PAIRED = [  # (k, v) sharing a grid: rotated keys, a symmetric pair, 8-bit g64
    (QuantSpec(4, rotation="hadamard"), QuantSpec(4)),
    (QuantSpec(2, symmetric=True, rotation="hadamard"), QuantSpec(2, symmetric=True)),
    (QuantSpec(8, 64), QuantSpec(8, 64, rotation="hadamard")),
]


def test_pair_spec_only_for_a_shared_token_grid():
    assert pair_spec(*PAIRED[0]) == QuantSpec(4)
    assert pair_spec(QuantSpec(4), QuantSpec(2)) is None
    assert pair_spec(QuantSpec(4), QuantSpec(4, 64)) is None
    assert pair_spec(QuantSpec(16), QuantSpec(16)) is None


@pytest.fixture(params=[torch.float32, torch.float16], ids=["fp32", "fp16"])
def written(request):
    dtype = request.param
    g = torch.Generator().manual_seed(4)
    pool = make_pool(tiny_profile(PAIRED, heads=HEADS, head_dim=D), dtype=dtype, read_mode="lazy")
    assert all(p is not None for p in pool._parts.stored.pairs)
    loc = torch.randperm(SIZE, generator=g)[:16] + 1
    data = {}
    for layer in range(len(PAIRED)):
        k, v = ((torch.randn(16, HEADS, D, generator=g) * 4).to(dtype) for _ in range(2))
        k[3, 1, 5] = float("nan")  # a poisoned group stays local in the pair too
        pool.set_kv_buffer(Layer(layer), loc, k, v)
        data[layer] = (k, v)
    return pool, loc, data


def test_paired_writes_store_the_reference_bytes_and_reads_its_values(written):
    pool, loc, data = written
    for layer, (k_spec, v_spec) in enumerate(PAIRED):
        k, v = data[layer]
        assert torch.equal(pool.k_buffer[layer][loc], quantize(k, k_spec))
        assert torch.equal(pool.v_buffer[layer][loc], quantize(v, v_spec))
        k_hat, v_hat = pool.read_kv(layer, loc)
        expected_k = dequantize(quantize(k, k_spec), k_spec, D, pool.dtype)
        expected_v = dequantize(quantize(v, v_spec), v_spec, D, pool.dtype)
        assert torch.allclose(k_hat, expected_k, rtol=0, atol=0, equal_nan=True)
        assert torch.allclose(v_hat, expected_v, rtol=0, atol=0, equal_nan=True)
        assert k_hat.dtype == v_hat.dtype == pool.dtype


@pytest.mark.parametrize("n", [3, 64, 65, 150], ids=lambda n: f"{n}tokens")
def test_small_numpy_and_large_torch_writes_store_the_same_bytes(n):
    """Writes of up to SMALL_WRITE_TOKENS tokens take the numpy writer, larger ones the torch
    reference: the bytes and the decode cache's values are the reference's either way."""
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool
    from kvtuner.runtime_loader.sglang.pool.writes import SMALL_WRITE_TOKENS

    assert SMALL_WRITE_TOKENS == 64  # the parameters straddle it

    specs = [*PAIRED, (QuantSpec(5, rotation="hadamard"), QuantSpec(3))]
    profile = tiny_profile(specs, heads=HEADS, head_dim=D)
    pool = KVTunerMHATokenToKVPool(  # more slots than make_pool's
        200, page_size=1, dtype=torch.float16, head_num=HEADS, head_dim=D,
        layer_num=len(specs), device="cpu", enable_memory_saver=False, profile=profile,
        read_mode="lazy",
    )  # fmt: skip
    g = torch.Generator().manual_seed(n)
    loc = torch.randperm(200, generator=g)[:n] + 1
    for layer, (k_spec, v_spec) in enumerate(specs):
        k, v = ((torch.randn(n, HEADS, D, generator=g) * 4).to(torch.float16) for _ in range(2))
        pool.set_kv_buffer(Layer(layer), loc, k, v)
        assert torch.equal(pool.k_buffer[layer][loc], quantize(k, k_spec))
        assert torch.equal(pool.v_buffer[layer][loc], quantize(v, v_spec))
        fresh = pool._parts.reads.cache._fresh  # what the next read of these slots is served from
        assert torch.equal(fresh[2], dequantize(quantize(k, k_spec), k_spec, D, torch.float16))
        assert torch.equal(fresh[3], dequantize(quantize(v, v_spec), v_spec, D, torch.float16))
