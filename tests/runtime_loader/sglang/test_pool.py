"""KVTunerMHATokenToKVPool with the real SGLang classes on CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_profiles import pool_over, tiny_profile

from kvtuner.errors import KVTunerError
from kvtuner.quant import QuantSpec, dequantize, quantize
from kvtuner.quant.reference import rotate
from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size
from kvtuner.runtime_loader.sglang.pool.lazy_reads.batch_reads import batch_read_slots

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

SIZE, HEADS, D = 48, 2, 64
SPECS = [  # per layer (k, v): mixed bits, a rotated key, a symmetric value, an unquantized layer
    (QuantSpec(8), QuantSpec(4)),
    (QuantSpec(4, rotation="hadamard"), QuantSpec(2, symmetric=True)),
    (QuantSpec(16), QuantSpec(8, group_size=64)),
]


def make_pool(profile, cls=None, dtype=torch.float32, **kw):
    return pool_over(profile, SIZE, cls=cls, dtype=dtype, head_num=HEADS, **kw)


class Layer:  # what set_kv_buffer reads from SGLang's RadixAttention
    def __init__(self, layer_id):
        self.layer_id = layer_id


@pytest.fixture(scope="module")
def profile():
    return tiny_profile(SPECS, heads=HEADS, head_dim=D)


@pytest.fixture
def written(profile):
    """A pool with random K/V written to random slots of every layer."""
    g = torch.Generator().manual_seed(0)
    pool = make_pool(profile)
    loc = torch.randperm(SIZE, generator=g)[:20] + 1  # slot 0 is the padding slot
    data = {}
    for layer in range(len(SPECS)):
        k, v = (torch.randn(20, HEADS, D, generator=g) * 3 for _ in range(2))
        pool.set_kv_buffer(Layer(layer), loc, k, v)
        data[layer] = (k, v)
    return pool, loc, data


def assert_within_half_step(x: torch.Tensor, x_hat: torch.Tensor, spec: QuantSpec) -> None:
    """Every element of x_hat [n, heads, D] within half a grid step of x (rotated specs: in the
    rotated basis, where the grid lives; the fp16-rounded metadata widens the step by < 1%)."""
    if spec.bits == 16:
        return
    x, x_hat = rotate(x, spec), rotate(x_hat, spec)
    groups = x.reshape(*x.shape[:2], -1, spec.group_size)
    span = groups.amax(-1) - groups.amin(-1)
    if spec.symmetric:
        span = 2 * groups.abs().amax(-1)
    step = span / ((1 << spec.bits) - 1 - spec.symmetric)
    err = (x_hat - x).reshape(groups.shape).abs().amax(-1)
    assert (err <= step / 2 * 1.01 + 1e-3).all()


def test_reads_equal_the_reference_quantizer_and_stay_within_its_bound(written):
    pool, loc, data = written
    for layer, (k_spec, v_spec) in enumerate(SPECS):
        k_hat, v_hat = pool.read_kv(layer, loc)
        for x, x_hat, spec in ((data[layer][0], k_hat, k_spec), (data[layer][1], v_hat, v_spec)):
            assert torch.equal(x_hat, dequantize(quantize(x, spec), spec, D))
            assert_within_half_step(x, x_hat, spec)


# format v2's widths (v3: low and high planes); layer 0's K and V share a grid (one pair call)
V2_SPECS = [
    (QuantSpec(3), QuantSpec(3)),
    (QuantSpec(5, symmetric=True), QuantSpec(3, group_size=16)),
    (QuantSpec(3, rotation="hadamard"), QuantSpec(5)),
]


@pytest.mark.parametrize("read_mode", ["lazy", "scratch"])
def test_3_and_5_bit_layers_size_and_round_trip_in_both_read_modes(read_mode):
    profile = tiny_profile(V2_SPECS, heads=HEADS, head_dim=D)
    pool = make_pool(profile, read_mode=read_mode)
    predicted = cell_size(
        profile, heads=HEADS, start_layer=0, num_layers=3, dtype_bytes=4, read_mode=read_mode
    )
    assert sum(pool.get_kv_size_bytes()) == (SIZE + 1) * predicted.packed
    # row bytes at D=64: codes D*bits/8, then 2 B per group for the scale (and the zero)
    # 3b/g32 asym 24+8, 3b/g32 asym 24+8, 5b/g32 sym 40+4, 3b/g16 asym 24+16, 3b 24+8, 5b 40+8
    assert predicted.packed == HEADS * (32 + 32 + 44 + 40 + 32 + 48)
    assert pool.scratch_bytes() == (SIZE + 1) * predicted.scratch
    g = torch.Generator().manual_seed(3)
    loc = torch.randperm(SIZE, generator=g)[:20] + 1
    pool.prepare_reads(loc)
    for layer, (k_spec, v_spec) in enumerate(V2_SPECS):
        k, v = (torch.randn(20, HEADS, D, generator=g) * 3 for _ in range(2))
        pool.set_kv_buffer(Layer(layer), loc, k, v)
        assert torch.equal(pool.k_buffer[layer][loc], quantize(k, k_spec))
        assert torch.equal(pool.v_buffer[layer][loc], quantize(v, v_spec))
        k_buf, v_buf = pool.get_kv_buffer(layer)
        for x, x_hat, spec in ((k, k_buf[loc], k_spec), (v, v_buf[loc], v_spec)):
            assert torch.equal(x_hat, dequantize(quantize(x, spec), spec, D))
            assert_within_half_step(x, x_hat, spec)


def test_untouched_slots_and_padding_slot_stay_zero(written):
    pool, loc, _ = written
    untouched = torch.ones(SIZE + 1, dtype=torch.bool)
    untouched[loc] = False
    assert untouched[0]
    for buf in (*pool.k_buffer, *pool.v_buffer):
        assert not buf[untouched].any()
        assert buf[loc].any(dim=-1).all()


def test_backends_get_the_batch_slots_dequantized_in_a_head_dim_scratch(written):
    pool, loc, data = written
    batch = loc[:7]
    pool.prepare_reads(batch)
    k_buf, v_buf = pool.get_kv_buffer(1)
    assert k_buf.shape == (SIZE + 1, HEADS, D) and k_buf.dtype == torch.float32
    k_hat, v_hat = pool.read_kv(1, batch)
    assert torch.equal(k_buf[batch], k_hat) and torch.equal(v_buf[batch], v_hat)
    others = torch.ones(SIZE + 1, dtype=torch.bool)
    others[batch] = False
    assert not k_buf[others].any()  # only the batch's slots were dequantized


def test_a_write_after_a_read_is_visible_to_the_next_read(written):
    pool, loc, _ = written
    pool.prepare_reads(loc[:3])
    before = pool.get_key_buffer(0)[loc[0]].clone()
    pool.set_kv_buffer(Layer(0), loc[:1], torch.full((1, HEADS, D), 5.0), torch.zeros(1, HEADS, D))
    after = pool.get_key_buffer(0)[loc[0]]
    assert torch.allclose(after, torch.full_like(after, 5.0)) and not torch.equal(before, after)


def test_reads_without_announced_slots_refuse(profile):
    pool = make_pool(profile)
    with pytest.raises(RuntimeError, match="prepare_reads"):
        pool.get_key_buffer(0)


def test_packed_bytes_equal_the_profile_prediction(profile):
    pool = make_pool(profile)
    k, v = pool.get_kv_size_bytes()
    predicted = cell_size(profile, heads=HEADS, start_layer=0, num_layers=3, dtype_bytes=4)
    assert k + v == (SIZE + 1) * predicted.packed
    per_head_layer = sum(s.row_bytes(D) for pair in SPECS for s in pair)
    assert predicted.packed == HEADS * per_head_layer
    assert pool.scratch_bytes() == (SIZE + 1) * predicted.scratch


@pytest.mark.parametrize("bits,ratio", [(8, 256 / 144), (4, 256 / 80)])
def test_capacity_vs_the_stock_pool_at_equal_bytes(bits, ratio):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    prof = tiny_profile([(QuantSpec(bits), QuantSpec(bits))] * 3, heads=HEADS, head_dim=D)
    ours = make_pool(prof, dtype=torch.bfloat16)
    stock = MHATokenToKVPool(
        SIZE,
        page_size=1,
        dtype=torch.bfloat16,
        head_num=HEADS,
        head_dim=D,
        layer_num=3,
        device="cpu",
        enable_memory_saver=False,
    )
    budget = sum(stock.get_kv_size_bytes())
    ours_per_token = sum(ours.get_kv_size_bytes()) / (SIZE + 1)
    assert budget // ours_per_token / (SIZE + 1) == pytest.approx(ratio, rel=0.02)


def test_batch_read_slots_follow_req_to_token_and_the_device_seq_lens():
    req_to_token = torch.arange(40).reshape(4, 10)
    batch = SimpleNamespace(  # seq_lens_cpu one step behind, as under overlap scheduling
        req_pool_indices=torch.tensor([2, 0]),
        seq_lens=torch.tensor([3, 5]),
        seq_lens_cpu=torch.tensor([3, 4]),
    )
    assert batch_read_slots(batch, req_to_token).tolist() == [20, 21, 22, 0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"swa_head_num": 2}, "sliding-window"),
        ({"enable_kv_cache_copy": True}, "speculative"),
        ({"kv_cache_layout": "hnd"}, "kv_cache_layout"),
    ],
)
def test_unsupported_setups_are_refused(profile, kwargs, match):
    with pytest.raises(KVTunerError, match=match):
        make_pool(profile, **kwargs)


def test_channel_axis_on_pages_of_another_size_and_fp8_are_refused(profile):
    kivi = tiny_profile([(QuantSpec(4, axis="channel"), QuantSpec(4))] * 3, heads=HEADS, head_dim=D)
    with pytest.raises(KVTunerError, match="--page-size is 1; start the server with --page-size"):
        make_pool(kivi)
    with pytest.raises(KVTunerError, match="dtype"):
        make_pool(profile, dtype=torch.float8_e4m3fn)
