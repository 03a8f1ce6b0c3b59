"""Key smoothing in the SGLang pool (profile schema v3): rows hold quantize(k / λ), every read
path multiplies back, the Triton writer stores the reference's bytes."""

from __future__ import annotations

import pytest
import torch
from test_pool import HEADS, SIZE, Layer, make_pool
from test_pool_triton import assert_same_rows, kernels  # noqa: F401 (fixture)

from kvtuner.errors import KVTunerError
from kvtuner.profile import LayerSpec, ModelFingerprint, Profile
from kvtuner.quant import KeySmoothing, QuantSpec, dequantize, quantize

pytestmark = pytest.mark.sglang

D = 64
SPECS = [  # (k, v, smoothed keys?)
    (QuantSpec(4), QuantSpec(4), True),  # K and V share a grid: one quantizer call for both
    (QuantSpec(4, rotation="hadamard"), QuantSpec(2, symmetric=True), True),
    (QuantSpec(3, group_size=16), QuantSpec(8), False),
]


def _lam(layer: int, heads: int) -> KeySmoothing:
    g = torch.Generator().manual_seed(10 + layer)
    return KeySmoothing.from_magnitudes(torch.rand(heads, D, generator=g) * 20 + 0.1, 0.5)


def smoothed_profile(heads: int = HEADS) -> Profile:
    fp = ModelFingerprint("LlamaForCausalLM", len(SPECS), heads, D)
    layers = [
        LayerSpec(i, k, v, _lam(i, heads) if s else None) for i, (k, v, s) in enumerate(SPECS)
    ]
    return Profile("tiny", fp, layers)


def _write(pool, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randperm(SIZE, generator=g)[:n] + 1
    data = {}
    for layer in range(len(SPECS)):
        k = torch.randn(n, HEADS, D, generator=g) * 3
        v = torch.randn(n, HEADS, D, generator=g)
        pool.set_kv_buffer(Layer(layer), loc, k.to(pool.dtype), v.to(pool.dtype))
        data[layer] = (k.to(pool.dtype), v.to(pool.dtype))
    return loc, data


@pytest.mark.parametrize("n", [5, 40])  # decode-size writes (numpy writer) and the torch path
def test_rows_hold_the_smoothed_keys_and_reads_multiply_back(n):
    profile = smoothed_profile()
    pool = make_pool(profile)
    loc, data = _write(pool, min(n, SIZE - 1))
    for layer, (k, v) in data.items():
        spec = profile.layers[layer]
        lam = spec.k_smooth.tensor() if spec.k_smooth is not None else torch.ones(HEADS, D)
        rows = pool.k_buffer[layer][loc]
        assert torch.equal(rows, quantize(k / lam, spec.k))
        assert torch.equal(pool.v_buffer[layer][loc], quantize(v, spec.v))
        k_read, v_read = pool.read_kv(layer, loc)
        assert torch.equal(k_read, dequantize(rows, spec.k, D) * lam)
        assert torch.equal(v_read, dequantize(pool.v_buffer[layer][loc], spec.v, D))
        if spec.k_smooth is not None:  # much closer than without smoothing on these keys
            assert (k_read - k).abs().max() < 2 * (k / lam).abs().max() * lam.max()


def test_lazy_reads_through_the_decode_cache_equal_read_kv():
    pool = make_pool(smoothed_profile(), dtype=torch.float16, read_mode="lazy",
                     decode_cache_tokens=32)  # fmt: skip
    loc, _ = _write(pool, 6)
    pool.prepare_reads(loc)
    for layer in range(len(SPECS)):
        k_view, v_view = pool.get_kv_buffer(layer)
        k, v = pool.read_kv(layer, loc)
        assert k.dtype == torch.float16
        assert torch.equal(k_view[loc], k) and torch.equal(v_view[loc], v)


def test_triton_pool_writes_the_reference_bytes(kernels):  # noqa: F811
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    class TritonPool(KVTunerMHATokenToKVPool):
        scatter = staticmethod(kernels.triton_scatter_quantized)
        scatter_kv = staticmethod(kernels.triton_scatter_kv)
        gather = staticmethod(kernels.triton_gather_dequantized)

    profile = smoothed_profile()
    torch_pool, triton_pool = make_pool(profile), make_pool(profile, cls=TritonPool)
    loc_a, _ = _write(torch_pool, 5, seed=3)
    loc_b, _ = _write(triton_pool, 5, seed=3)
    assert torch.equal(loc_a, loc_b)
    assert_same_rows(torch_pool, triton_pool, SPECS, D)
    for layer in range(len(SPECS)):
        pairs = zip(
            torch_pool.read_kv(layer, loc_a), triton_pool.read_kv(layer, loc_a), strict=True
        )
        for a, b in pairs:
            assert torch.equal(a, b)


def test_a_rank_holding_some_kv_heads_refuses_a_smoothed_profile():
    with pytest.raises(KVTunerError, match="key smoothing needs every KV head on one rank"):
        make_pool(smoothed_profile(heads=2 * HEADS))
