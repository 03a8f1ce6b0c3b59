"""Channel-axis (KIVI) sides in KVTunerMHATokenToKVPool, with the real SGLang classes on CPU:
pages packed when full, the fp staging of filling pages, reads in every mode."""

from __future__ import annotations

import pytest
import torch
from test_pool import Layer
from tiny_profiles import pool_over, tiny_profile

from kvtuner.errors import KVTunerError
from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.runtime_loader.hf.stream import PackedStream
from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size, staging_bytes

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

G, HEADS, D, SIZE = 16, 2, 64, 16 * 8
SPECS = [  # KIVI keys with token-axis values; a symmetric 3-bit key; both sides channel-axis
    (QuantSpec(4, G, axis="channel"), QuantSpec(4, 32)),
    (QuantSpec(3, G, symmetric=True, axis="channel"), QuantSpec(8)),
    (QuantSpec(2, G, axis="channel"), QuantSpec(4, G, axis="channel")),
]


def make_pool(page_size=G, dtype=torch.float32, **kw):
    profile = tiny_profile(SPECS, heads=HEADS, head_dim=D)
    return pool_over(profile, SIZE, page_size=page_size, dtype=dtype, **kw)


def expected(x: torch.Tensor, spec: QuantSpec, dtype=torch.float32) -> torch.Tensor:
    """What the pool must read for one request's tokens x [T, heads, D]: the reference's
    channel-axis round trip of every full page, the staged fp values of the filling one."""
    if spec.axis == "token":
        return dequantize(quantize(x, spec), spec, D, dtype)
    full = x.shape[0] // G * G
    head_major = x[:full].to(dtype).transpose(0, 1)  # [heads, full, D]
    packed = dequantize(quantize(head_major, spec), spec, D, dtype).transpose(0, 1)
    return torch.cat([packed, x[full:].to(dtype)])


def request_slots(pages: list[int], tokens: int) -> torch.Tensor:
    return torch.cat([torch.arange(p * G, p * G + G) for p in pages])[:tokens]


def write_request(pool, slots, data, splits):
    """Write each layer's K/V of ``slots`` in chunks of ``splits`` tokens, layer by layer."""
    start = 0
    for n in splits:
        for layer, (k, v) in data.items():
            pool.set_kv_buffer(Layer(layer), slots[start : start + n], k[start : start + n],
                               v[start : start + n])  # fmt: skip
        start += n


def random_kv(tokens, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        layer: tuple(torch.randn(tokens, HEADS, D, generator=g) * 2 for _ in range(2))
        for layer in range(len(SPECS))
    }


def assert_reads(pool, slots, data, tokens):
    for layer, (k_spec, v_spec) in enumerate(SPECS):
        k_hat, v_hat = pool.read_kv(layer, slots[:tokens])
        assert torch.equal(k_hat, expected(data[layer][0][:tokens], k_spec))
        assert torch.equal(v_hat, expected(data[layer][1][:tokens], v_spec))


def test_page_filling_over_many_writes_reads_like_the_reference_at_every_step():
    pool = make_pool()
    slots = request_slots([2, 5, 3], 40)  # pages out of order, as the allocator hands them
    data = random_kv(40, 0)
    write_request(pool, slots, data, [5])
    assert_reads(pool, slots, data, 5)
    for t in range(5, 40):  # decode steps; page 5 fills across 16 writes, page 3 stays filling
        write_request(pool, slots[t:], {k: (v[0][t:], v[1][t:]) for k, v in data.items()}, [1])
        assert_reads(pool, slots, data, t + 1)
    # only page 3 (8 of 16 tokens) still staged
    assert pool._parts.stored.channels[0][0].staged_pages == 1


def test_packed_pages_are_the_hf_caches_channel_blocks_byte_for_byte():
    pool = make_pool()
    slots = request_slots([4, 1, 6], 48)
    data = random_kv(48, 1)
    write_request(pool, slots, data, [20, 1, 1, 9, 17])
    for layer, (k_spec, v_spec) in enumerate(SPECS):
        for x, spec, buffer in ((data[layer][0], k_spec, pool.k_buffer[layer]),
                                (data[layer][1], v_spec, pool.v_buffer[layer])):  # fmt: skip
            if spec.axis != "channel":
                continue
            stream = PackedStream(spec, D, residual_length=0, keep_dequantized=False)
            stream.store(x.transpose(0, 1)[None])  # HF layout [B, heads, T, D]
            assert torch.equal(buffer[[4, 1, 6]], stream.packed[0].transpose(0, 1))


def test_prefix_sharing_is_page_granular_and_freed_pages_release_their_staging():
    pool = make_pool()
    shared = request_slots([2, 3], 32)
    a_tail, b_tail = request_slots([5], 7), request_slots([6], 3)
    a, b = random_kv(39, 2), random_kv(3, 3)
    write_request(pool, torch.cat([shared, a_tail]), a, [39])
    write_request(pool, b_tail, b, [1, 2])  # request B: A's two full pages, then its own page
    b_slots = torch.cat([shared, b_tail])
    b_data = {i: tuple(torch.cat([a[i][s][:32], b[i][s]]) for s in (0, 1)) for i in a}
    assert_reads(pool, b_slots, b_data, 35)
    assert_reads(pool, torch.cat([shared, a_tail]), a, 39)  # A's filling page untouched
    assert pool._parts.stored.channels[0][0].staged_pages == 2
    pool.release_pages(torch.tensor([5]))  # A finished: SGLang frees its pages
    assert (
        pool._parts.stored.channels[0][0].staged_pages == 1
        and pool._parts.stored.channels[2][1].staged_pages == 1
    )
    assert_reads(pool, b_slots, b_data, 35)


@pytest.mark.parametrize("read_mode", ["lazy", "scratch"])
def test_attention_reads_in_both_modes_follow_pages_as_they_fill(read_mode):
    pool = make_pool(read_mode=read_mode)
    slots = request_slots([7, 2], 24)
    data = random_kv(24, 4)
    write_request(pool, slots, data, [12])
    for t in range(12, 24):
        pool.prepare_reads(slots[: t + 1])
        write_request(pool, slots[t:], {k: (v[0][t:], v[1][t:]) for k, v in data.items()}, [1])
        for layer, (k_spec, v_spec) in enumerate(SPECS):
            k_buf, v_buf = pool.get_key_buffer(layer), pool.get_value_buffer(layer)
            loc = slots[: t + 1].to(torch.int32)  # torch_native's index dtype
            for buf, x, spec in ((k_buf, data[layer][0], k_spec), (v_buf, data[layer][1], v_spec)):
                assert torch.equal(buf[loc], expected(x[: t + 1], spec))


def test_sizes_match_the_prediction_and_the_staging_is_bounded():
    pool = make_pool(stage_pages=2)
    profile = pool.profile
    cell = cell_size(profile, heads=HEADS, start_layer=0, num_layers=3, dtype_bytes=4)
    assert sum(pool.get_kv_size_bytes()) == (SIZE + G) * cell.packed
    # per token and head: block bytes / G (codes, then D scales and D zeros over 16 tokens):
    # 4-bit 32+16, 3-bit sym 24+8, 2-bit 16+16; the token-axis rows 4b/g32 40 and 8b/g32 72
    assert cell.packed == HEADS * (48 + 40 + 32 + 72 + 32 + 48)
    staged = staging_bytes(
        profile, heads=HEADS, start_layer=0, num_layers=3, dtype_bytes=4, stage_pages=2
    )
    assert pool.staging_bytes() == staged == 2 * 4 * G * HEADS * D * 4
    data = random_kv(1, 5)
    for page in (1, 2):
        write_request(pool, torch.tensor([page * G]), data, [1])
    with pytest.raises(KVTunerError, match=r"fp staging is full \(2 filling pages\)"):
        write_request(pool, torch.tensor([3 * G]), data, [1])


def test_page_size_other_than_the_group_is_refused_in_one_line():
    with pytest.raises(KVTunerError) as err:
        make_pool(page_size=1)
    message = str(err.value)
    assert "groups of 16 tokens" in message and "--page-size is 1" in message
    assert "--page-size 16" in message and "\n" not in message


def test_bf16_pool_stages_and_packs_model_dtype_values():
    pool = make_pool(dtype=torch.bfloat16)
    slots = request_slots([3, 4], 20)
    data = random_kv(20, 6)
    write_request(pool, slots, data, [3, 14, 3])
    for layer, (k_spec, _) in enumerate(SPECS):
        k_hat = pool.read_kv(layer, slots)[0]
        assert k_hat.dtype == torch.bfloat16
        assert torch.equal(k_hat, expected(data[layer][0].bfloat16(), k_spec, torch.bfloat16))


@pytest.mark.parametrize(
    "hicache, backend, refused",
    [
        (True, "torch_native", "--enable-hierarchical-cache"),
        (False, "kvtuner", "kvtuner attention backend"),
        (False, "torch_native", ""),
    ],
)
def test_channel_axis_is_refused_where_its_pages_are_not_read(hicache, backend, refused):
    from types import SimpleNamespace

    from kvtuner.runtime_loader.sglang.hooks.refusals import channel_refusal

    args = SimpleNamespace(enable_hierarchical_cache=hicache, attention_backend=backend)
    channel = tiny_profile(SPECS, heads=HEADS, head_dim=D)
    token = tiny_profile([(QuantSpec(4, 16), QuantSpec(4, 16))] * 2, heads=HEADS, head_dim=D)
    message = channel_refusal(args, channel)
    assert (refused in message) and bool(message) == bool(refused)
    assert channel_refusal(args, token) == ""
    keys_only = tiny_profile(SPECS[:2], heads=HEADS, head_dim=D)  # KIVI keys, token values
    if backend == "kvtuner":  # its kernels read key pages, without decode CUDA graphs
        assert channel_refusal(args, keys_only) == ""
        assert "--cuda-graph-backend-decode disabled" in channel_refusal(
            args, keys_only, decode_graphs="full"
        )
