"""HiCache tiers over the kvtuner pool with the real SGLang classes on CPU: the host pool (L2)
and SGLang's file storage backend (L3) hold the packed rows byte for byte."""

from __future__ import annotations

import pytest
import torch
from test_pool import Layer
from tiny_profiles import pool_over, tiny_profile

from kvtuner.errors import KVTunerError
from kvtuner.quant import QuantSpec
from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

SIZE, PAGE, HEADS, D = 64, 4, 2, 64
SPECS = [  # per layer (k, v): every layer's rows have their own width
    (QuantSpec(8), QuantSpec(4)),
    (QuantSpec(4, rotation="hadamard"), QuantSpec(2, symmetric=True)),
    (QuantSpec(16), QuantSpec(8, group_size=32)),
]


def device_pool(profile):
    return pool_over(profile, SIZE, page_size=PAGE, read_mode="lazy")


def host_pool(pool, layout, profile_hash=None):
    from kvtuner.runtime_loader.sglang.hicache.host_pool import KVTunerMHATokenToKVPoolHost

    cls = KVTunerMHATokenToKVPoolHost.bound(profile_hash or pool.profile.hash)
    return cls(
        pool.get_device_pool_infos()[0].buffer_info,
        2.0,  # host_to_device_ratio, as SGLang's default
        0,
        PAGE,
        layout,
        device_capacity_tokens=pool.size,
        start_layer=pool.start_layer,
        end_layer=pool.end_layer,
    )


def file_storage(path, host):
    from sglang.srt.managers.cache_controller import storage_model_name
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

    config = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=host.layout == "page_first",
        model_name=storage_model_name("smol", host),
    )
    return HiCacheFile(config, file_path=str(path))


@pytest.fixture(scope="module")
def profile():
    return tiny_profile(SPECS, heads=HEADS, head_dim=D)


@pytest.fixture
def written(profile):
    """A device pool with random K/V in 3 pages of slots."""
    g = torch.Generator().manual_seed(1)
    pool = device_pool(profile)
    loc = torch.arange(PAGE, 4 * PAGE)  # pages 1..3 (page 0 is padding)
    for layer in range(len(SPECS)):
        k, v = (torch.randn(len(loc), HEADS, D, generator=g) * 2 for _ in range(2))
        pool.set_kv_buffer(Layer(layer), loc, k, v)
    return pool, loc


def rows(pool, loc):
    return [b[loc].clone() for b in (*pool.k_buffer, *pool.v_buffer)]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_host_pool_holds_packed_rows_sized_by_the_profile(written, layout):
    pool, _ = written
    host = host_pool(pool, layout)
    cell = cell_size(
        pool.profile, heads=HEADS, start_layer=0, num_layers=3, dtype_bytes=4, read_mode="lazy"
    )
    assert (
        host.size_per_token
        == cell.packed
        == HEADS * sum(b.shape[-1] for b in (*pool.k_buffer, *pool.v_buffer))
    )
    assert host.kv_buffer.dtype == torch.uint8 and not host.kv_buffer.is_pinned()
    assert host.kv_buffer.numel() == host.size * cell.packed
    assert host.size >= 2 * pool.size  # SGLang sized it: ratio 2, plus a padding page
    assert host.storage_format_tag == f"kvtuner-v3-{pool.profile.hash}"  # rows: the torch pool
    assert pool.storage_layout() == "rows"
    from kvtuner.runtime_loader.sglang.hicache.host_pool import storage_tag

    assert storage_tag(pool.profile.hash, "planes") == f"kvtuner-v3-{pool.profile.hash}-planes"
    stock_bytes = 2 * 3 * HEADS * D * 4  # SGLang's MHA host pool: fp32 K and V per token
    assert host.size_per_token < stock_bytes


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_device_host_file_host_device_round_trip_is_byte_identical(
    written, profile, layout, tmp_path
):
    pool, loc = written
    before = rows(pool, loc)
    host = host_pool(pool, layout)
    slots = host.alloc(len(loc))
    host.backup_from_device_all_layer(pool, slots, loc, "kernel")
    for dev, view in zip(before, (*host.k_data_refs, *host.v_data_refs), strict=True):
        assert torch.equal(view[slots], dev)

    storage = file_storage(tmp_path, host)  # L3: SGLang's file backend, one file per page
    keys = [f"page{i}" for i in range(len(loc) // PAGE)]
    pages = [host.get_data_page(int(slots[i * PAGE])) for i in range(len(keys))]
    assert all(p.numel() == PAGE * host.size_per_token for p in pages)
    assert storage.batch_set(keys, pages)

    target = device_pool(profile)  # another server: its own device and host pools
    fresh_host = host_pool(target, layout)
    back = fresh_host.alloc(len(loc))
    for i, key in enumerate(keys):
        page = storage.get(key, fresh_host.get_dummy_flat_data_page())
        fresh_host.set_from_flat_data_page(int(back[i * PAGE]), page)

    dst = torch.arange(5 * PAGE, 8 * PAGE)
    for layer in range(len(SPECS)):
        fresh_host.load_to_device_per_layer(target, back, dst, layer, "kernel")
    for got, want in zip(rows(target, dst), before, strict=True):
        assert torch.equal(got, want)
    k0, v0 = pool.read_kv(1, loc)
    k1, v1 = target.read_kv(1, dst)
    assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_pages_of_another_profile_are_a_miss(written, tmp_path):
    pool, loc = written
    host = host_pool(pool, "page_first")
    slots = host.alloc(PAGE)
    host.backup_from_device_all_layer(pool, slots, loc[:PAGE], "kernel")
    assert file_storage(tmp_path, host).batch_set(["p"], [host.get_data_page(int(slots[0]))])
    assert file_storage(tmp_path, host).exists("p")
    other = host_pool(pool, "page_first", profile_hash="0" * 16)
    assert not file_storage(tmp_path, other).exists("p")


def test_load_drops_what_the_decode_cache_held_of_the_slots(written, profile):
    pool, loc = written
    old = pool.get_key_buffer(0)[loc]  # lazy read: the decode cache may keep it
    other = device_pool(profile)
    g = torch.Generator().manual_seed(2)
    k, v = (torch.randn(len(loc), HEADS, D, generator=g) for _ in range(2))
    other.set_kv_buffer(Layer(0), loc, k, v)
    host = host_pool(other, "page_first")
    slots = host.alloc(len(loc))
    host.backup_from_device_all_layer(other, slots, loc, "kernel")
    host.device_k_buffers, host.device_v_buffers = pool.k_buffer, pool.v_buffer
    host.load_to_device_per_layer(pool, slots, loc, 0, "kernel")
    new = pool.get_key_buffer(0)[loc]
    assert not torch.equal(new, old)
    assert torch.equal(new, other.get_key_buffer(0)[loc])


def test_other_layouts_are_refused(written):
    pool, _ = written
    with pytest.raises(KVTunerError, match="layer_first or page_first"):
        host_pool(pool, "page_head")


def test_stock_host_pool_on_cpu_round_trips(tmp_path):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from kvtuner.runtime_loader.sglang.hicache.host_transfers import CpuMHATokenToKVPoolHost

    pool = MHATokenToKVPool(SIZE, PAGE, torch.float32, HEADS, D, 2, "cpu", False)
    loc = torch.arange(PAGE, 3 * PAGE)
    for layer in range(2):
        k, v = torch.randn(len(loc), HEADS, D), torch.randn(len(loc), HEADS, D)
        pool.set_kv_buffer(Layer(layer), loc, k, v)
    for layout in ("page_first", "layer_first"):
        host = CpuMHATokenToKVPoolHost(
            pool.get_device_pool_infos()[0].buffer_info,
            2.0,
            0,
            PAGE,
            layout,
            device_capacity_tokens=pool.size,
            start_layer=0,
            end_layer=1,
        )
        assert host.size_per_token == 2 * 2 * HEADS * D * 4
        slots = host.alloc(len(loc))
        host.backup_from_device_all_layer(pool, slots, loc, "kernel")
        dst = loc + 4 * PAGE
        for layer in range(2):
            host.load_to_device_per_layer(pool, slots, dst, layer, "kernel")
            assert torch.equal(pool.k_buffer[layer][dst], pool.k_buffer[layer][loc])
            assert torch.equal(pool.v_buffer[layer][dst], pool.v_buffer[layer][loc])


@pytest.mark.parametrize(
    "layout, backend, refused",
    [
        ("page_first", None, ""),
        ("layer_first", "file", ""),
        ("page_first_direct", None, "--hicache-mem-layout page_first_direct"),
        ("page_head", "file", "--hicache-mem-layout page_head"),
        ("page_first", "mooncake", "--hicache-storage-backend mooncake"),
    ],
)
def test_startup_refuses_hicache_setups_the_host_pool_cannot_hold(layout, backend, refused):
    from types import SimpleNamespace

    from kvtuner.runtime_loader.sglang.hooks.refusals import _hicache_refusal

    args = SimpleNamespace(
        enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_storage_backend=backend
    )
    assert _hicache_refusal(args).startswith(refused) and bool(refused) == bool(
        _hicache_refusal(args)
    )
    args.enable_hierarchical_cache = False
    assert _hicache_refusal(args) == ""
