"""The pool with the Triton kernels (interpreted on CPU) writes the same bytes (laid out as
planes where they align codes the rows do not) and reads the same values as with the torch
reference path."""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from tiny_profiles import pool_over, tiny_profile

from kvtuner.quant import QuantSpec
from kvtuner.quant.planes import from_planes, plannable

pytestmark = [pytest.mark.sglang, pytest.mark.filterwarnings("ignore::RuntimeWarning")]
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

SIZE, HEADS, D = 12, 2, 64
SPECS = [
    (QuantSpec(4, rotation="hadamard"), QuantSpec(2)),  # 40-byte K rows at d 64: planes
    (QuantSpec(8, symmetric=True), QuantSpec(16)),
    (QuantSpec(3), QuantSpec(5, 16, symmetric=True)),  # 3/5/6 bits: low and high planes
    (QuantSpec(8), QuantSpec(4, 64)),  # 72-byte key rows: planes
]


@pytest.fixture(scope="module")
def kernels():
    """kvtuner.quant.triton_kernels built for Triton's CPU interpreter; TRITON_INTERPRET stays
    set while the module's tests launch kernels, and is restored afterwards."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    module = importlib.import_module("kvtuner.quant.triton_kernels")
    if not module.interpreted():
        module = importlib.reload(module)
    assert module.interpreted()
    yield module
    if old is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = old


def _pool(cls, profile):
    return pool_over(profile, SIZE, cls=cls)


class Layer:
    def __init__(self, layer_id):
        self.layer_id = layer_id


def test_triton_pool_equals_torch_pool(kernels):
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    class TritonPool(KVTunerMHATokenToKVPool):
        scatter = staticmethod(kernels.triton_scatter_quantized)
        scatter_kv = staticmethod(kernels.triton_scatter_kv)
        gather = staticmethod(kernels.triton_gather_dequantized)

    profile = tiny_profile(SPECS, heads=HEADS, head_dim=D)
    torch_pool, triton_pool = _pool(KVTunerMHATokenToKVPool, profile), _pool(TritonPool, profile)
    g = torch.Generator().manual_seed(1)
    loc = torch.tensor([9, 2, 5, 11, 7])
    for layer in range(len(SPECS)):
        k, v = torch.randn(5, HEADS, D, generator=g), torch.randn(5, HEADS, D, generator=g)
        for pool in (torch_pool, triton_pool):
            pool.set_kv_buffer(Layer(layer), loc, k, v)
    assert [triton_pool.packed_planes(i) for i in range(len(SPECS))] == [True, False, False, True]
    assert_same_rows(torch_pool, triton_pool, SPECS, D)
    for pool in (torch_pool, triton_pool):
        pool.prepare_reads(loc[:3])
    for layer in range(len(SPECS)):
        for a, b in zip(
            torch_pool.get_kv_buffer(layer), triton_pool.get_kv_buffer(layer), strict=True
        ):
            assert torch.equal(a, b)


def assert_same_rows(torch_pool, triton_pool, specs, head_dim):
    """The Triton pool holds the torch pool's bytes: as they are, or (a layer of planes: the
    torch path never lays one out so) moved to planes."""
    assert not any(torch_pool.packed_planes(i) for i in range(len(specs)))
    for layer, sides in enumerate(specs):
        planes = triton_pool.packed_planes(layer)
        for side, spec in enumerate(sides[:2]):
            rows = (torch_pool.k_buffer, torch_pool.v_buffer)[side][layer]
            stored = (triton_pool.k_buffer, triton_pool.v_buffer)[side][layer]
            moved = planes and plannable(spec, head_dim)
            assert torch.equal(from_planes(stored, spec, head_dim) if moved else stored, rows)
            assert moved == (not torch.equal(stored, rows))


def test_triton_page_packer_equals_the_torch_one(kernels):
    """KIVI pages (and pre-RoPE ones) packed by the channel kernel: the pool's bytes and reads
    equal the torch path's, page by page as writes fill them."""
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    channel = importlib.import_module("kvtuner.quant.triton_channel")
    if type(channel._pack_kernel).__name__ != "InterpretedFunction":
        channel = importlib.reload(channel)  # imported before TRITON_INTERPRET was set
    packer = channel.triton_pack_channel_pages

    class TritonPages(KVTunerMHATokenToKVPool):
        pack_pages = staticmethod(packer)

    g, freq = 16, 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    specs = [
        (QuantSpec(4, g, axis="channel"), QuantSpec(4, 32)),
        (QuantSpec(3, g, axis="channel", pre_rope=True), QuantSpec(2, 16, axis="channel")),
    ]
    profile = tiny_profile(specs, heads=HEADS, head_dim=D)
    pools = [
        pool_over(profile, 4 * g, cls=cls.bound(profile, "lazy", rope_freq=freq), page_size=g)
        for cls in (KVTunerMHATokenToKVPool, TritonPages)
    ]
    slots = torch.cat([torch.arange(p * g, p * g + g) for p in (3, 1, 4)])[:40]
    x = torch.randn(40, HEADS, D, generator=torch.Generator().manual_seed(2))
    for pool in pools:
        pool._parts.rope.note(slots, torch.arange(40))
        for start, n in ((0, 20), (20, 1), (21, 19)):
            for layer in range(len(specs)):
                part = slots[start : start + n]
                pool.set_kv_buffer(Layer(layer), part, x[start : start + n], -x[start : start + n])
    ours, theirs = pools
    for a, b in zip(ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer, strict=True):
        assert torch.equal(a, b)
    for layer in range(len(specs)):
        for a, b in zip(ours.read_kv(layer, slots), theirs.read_kv(layer, slots), strict=True):
            assert torch.equal(a, b)
