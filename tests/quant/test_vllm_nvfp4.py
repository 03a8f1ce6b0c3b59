"""vLLM's nvfp4 / nvfp4_4over6 KV formats in torch (kvtuner/quant/vllm_nvfp4.py), core tier.

Properties of the format that a wrong emulation would break. The vllm tier
(tests/runtime_loader/vllm/test_nvfp4_bitexact.py) checks the bytes against vLLM's own torch
reference and against references written from vLLM's and FlashInfer's CUDA stores.
"""

from __future__ import annotations

import pytest
import torch

from kvtuner.quant import vllm_nvfp4 as nvfp4

GRID = torch.tensor(nvfp4.E2M1_GRID)
TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
TIES_TO = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # the even neighbour


def _states(seed: int, rows: int = 24, d: int = 64, dtype=torch.bfloat16) -> torch.Tensor:
    """K-like rows [rows, d] whose magnitudes span 1e-3 .. 1e3 (row by row)."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.logspace(-3, 3, rows)[:, None]
    return (torch.randn(rows, d, generator=g) * spread).to(dtype)


def _per_block(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [..., D/16, 16] in fp32."""
    return x.float().unflatten(-1, (-1, nvfp4.BLOCK))


def _decoded(codes: torch.Tensor) -> torch.Tensor:
    """Packed codes [..., D/2] -> signed E2M1 values [..., D], element 2i from the low nibble."""
    nibbles = torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten(-2)
    return nvfp4.decode_e2m1(nibbles)


@pytest.mark.parametrize("kv_scale", [1.0, 0.37, 4.0])
def test_reads_are_grid_values_times_block_scale(kv_scale):
    x = _states(0)
    codes, sf = nvfp4.store(x, kv_scale)
    assert codes.dtype == torch.uint8 and codes.shape == (24, 32)
    assert sf.dtype == torch.float8_e4m3fn and sf.shape == (24, 4)
    values = _decoded(codes)
    assert torch.isin(values.abs(), GRID).all()
    expected = (_per_block(values) * sf.float()[..., None]).flatten(-2) * kv_scale
    assert torch.equal(nvfp4.read(codes, sf, kv_scale, torch.float32), expected)
    # the block scale is amax / (6 kv_scale) to e4m3 precision, so each block's largest
    # element lands on ±6 (where that scale is a normal, unsaturated e4m3 value)
    blocks = _per_block(x)
    target = blocks.abs().amax(-1) / (6 * kv_scale)
    normal = (target >= 2**-6) & (target <= 448)
    assert normal.sum() > 40
    rel = (sf.float() - target).abs() / target
    assert (rel[normal] <= 2**-4 + 1e-6).all()
    top = _per_block(values).gather(-1, blocks.abs().argmax(-1, keepdim=True))[..., 0]
    assert (top.abs()[normal] == 6).all()


@pytest.mark.parametrize("writer", ["vllm", "flashinfer"])
@pytest.mark.parametrize("kv_scale", [1.0, 0.25])
def test_ties_round_to_the_even_code(writer, kv_scale):
    # amax 6 makes the block scale exactly 1 (times kv_scale), so x / kv_scale is what rounds
    block = [6.0, *TIES, *(-t for t in TIES), 0.0]
    x = torch.tensor([block]) * kv_scale
    codes, sf = nvfp4.store(x, kv_scale, writer=writer)
    assert sf.float().tolist() == [[1.0]]
    want = [6.0, *TIES_TO, *(-t for t in TIES_TO), 0.0]
    assert nvfp4.read(codes, sf, kv_scale, torch.float32)[0].tolist() == [
        w * kv_scale for w in want
    ]


def test_e2m1_rounding_either_side_of_each_midpoint():
    for tie, to in zip(TIES, TIES_TO, strict=True):
        t = torch.tensor(tie)
        below = torch.nextafter(t, torch.tensor(0.0))
        above = torch.nextafter(t, torch.tensor(9.0))
        lo, hi = GRID[GRID.lt(tie)].max(), GRID[GRID.gt(tie)].min()
        got = nvfp4.decode_e2m1(nvfp4.encode_e2m1(torch.stack([below, t, above, -t])))
        assert got.tolist() == [lo.item(), to, hi.item(), -to]
    big = torch.tensor([5.01, 6.0, 7.0, 1e30, -1e30])
    assert nvfp4.decode_e2m1(nvfp4.encode_e2m1(big)).tolist() == [6, 6, 6, 6, -6]


def test_saturation_at_six_times_448_times_the_scale():
    kv_scale = 0.5
    x = torch.zeros(2, 16)
    x[0, :4] = torch.tensor([1e5, -3e4, 2000.0, 1.0])  # amax / (6 kv) far past 448
    x[1, 0] = 6 * 448 * kv_scale  # exactly the largest value a block can hold
    x[1, 1] = -3 * 448 * kv_scale
    codes, sf = nvfp4.store(x, kv_scale)
    assert sf.float()[:, 0].tolist() == [448.0, 448.0]
    out = nvfp4.read(codes, sf, kv_scale, torch.float32)
    top = 6 * 448 * kv_scale
    assert out[0, :4].tolist() == [top, -top, top, 0.0]
    assert out[1, :2].tolist() == [top, -top / 2]
    assert out.abs().max() == top


def test_zero_and_underflowing_blocks_read_zero():
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(3))
    x[0, :16] = 0.0
    x[0, 16:32] = 1e-4  # amax / 6 is below half e4m3's smallest subnormal (2^-10): scale 0
    x[0, 32:48] = -1e-4
    codes, sf = nvfp4.store(x, 1.0)
    assert sf.float()[0, :3].tolist() == [0.0, 0.0, 0.0]
    assert codes[0, :8].eq(0).all() and codes[0, 8:16].eq(0).all()
    assert codes[0, 16:24].eq(0x88).all()  # a negative value rounding to zero keeps its sign
    out = nvfp4.read(codes, sf, 1.0, torch.float32)
    assert out[0, :48].eq(0).all()
    alone = nvfp4.fake_quantize(x[:, 48:], 1.0)  # the other block is unaffected
    assert torch.equal(out[:, 48:], alone)


def test_the_global_scale_is_one_over_kv_scale():
    x = _states(1)
    codes, sf = nvfp4.store(x, 1.0)
    for kv_scale in (0.125, 8.0):  # powers of two: x * kv_scale quantizes exactly alike
        codes_k, sf_k = nvfp4.store(x * kv_scale, kv_scale)
        assert torch.equal(codes_k, codes) and torch.equal(sf_k.float(), sf.float())
        out = nvfp4.read(codes, sf, kv_scale, torch.float32)
        assert torch.equal(out, nvfp4.read(codes, sf, 1.0, torch.float32) * kv_scale)


@pytest.mark.parametrize("kv_scale", [1.0, 0.37])
def test_four_over_six_is_never_worse_than_six_per_block(kv_scale):
    x = _states(2, rows=48, dtype=torch.float32)

    def block_error(four_over_six: bool) -> torch.Tensor:
        codes, sf = nvfp4.store(x, kv_scale, four_over_six=four_over_six)
        return (
            (_per_block(nvfp4.read(codes, sf, kv_scale, torch.float32)) - _per_block(x)) ** 2
        ).sum(-1)

    e6, e46 = block_error(False), block_error(True)
    assert (e46 <= e6 * (1 + 1e-5)).all()
    assert (e46 < e6 * (1 - 1e-3)).float().mean() > 0.2  # it takes max/4 often on Gaussians


def test_four_over_six_picks_four_where_it_is_better():
    x = torch.zeros(4, 16)
    x[0] = 4.0  # max/6: scale e4m3(2/3) = 0.6875 reads 4.125; max/4: scale 1 reads 4 exactly
    x[1, :3] = torch.tensor([6.0, 1.0, 0.5])  # max/6 exact; max/4 (scale 1.5) reads 1 as 0.75
    x[2] = 6.0  # both exact: a tie keeps max/6 (scale 1, not 1.5)
    codes6, sf6 = nvfp4.store(x, 1.0)
    codes, sf = nvfp4.store(x, 1.0, four_over_six=True)
    assert sf6.float()[:, 0].tolist() == [0.6875, 1.0, 1.0, 0.0]
    assert sf.float()[:, 0].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert torch.equal(nvfp4.read(codes, sf, 1.0, torch.float32), x)
    assert nvfp4.read(codes6, sf6, 1.0, torch.float32)[0, 0] == 4.125


def test_nibble_order_and_code_round_trip():
    x = torch.zeros(1, 16)
    x[0, :2] = torch.tensor([0.5, -3.0])  # codes 0x1 and 0xD
    x[0, 15] = 6.0  # code 0x7, the high nibble of the last byte
    codes, sf = nvfp4.store(x, 1.0)
    assert sf.float().item() == 1.0
    assert codes[0].tolist() == [0xD1, 0, 0, 0, 0, 0, 0, 0x70]
    all_codes = torch.arange(16, dtype=torch.uint8)
    signed = torch.cat([GRID, -GRID])
    assert torch.equal(nvfp4.decode_e2m1(all_codes), signed)
    assert torch.equal(nvfp4.encode_e2m1(nvfp4.decode_e2m1(all_codes)), all_codes)
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(32, 8)  # 32 blocks of 16
    ones = torch.ones(32, 1).to(torch.float8_e4m3fn)
    out = nvfp4.read(every_byte, ones, 1.0, torch.float32)
    assert torch.equal(out[:, 0::2], signed[(every_byte & 0xF).long()])
    assert torch.equal(out[:, 1::2], signed[(every_byte >> 4).long()])


def test_head_bytes_and_head_dims_off_the_block():
    assert [nvfp4.head_bytes(d) for d in (16, 64, 128, 256)] == [9, 36, 72, 144]
    for bad in (0, 8, 40, 72):
        with pytest.raises(ValueError, match="multiple of 16"):
            nvfp4.head_bytes(bad)
    with pytest.raises(ValueError, match="multiple of 16, got 40"):
        nvfp4.store(torch.zeros(2, 40), 1.0)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.fake_quantize(torch.zeros(3, 24), 1.0, four_over_six=True)


def test_bad_scales_writers_and_read_inputs_raise():
    x = torch.ones(2, 32)
    for bad in (0.0, -1.0, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="kv_scale"):
            nvfp4.store(x, bad)
    with pytest.raises(ValueError, match="writer='vllm'"):
        nvfp4.store(x, 1.0, four_over_six=True, writer="flashinfer")
    with pytest.raises(ValueError, match="writer"):
        nvfp4.store(x, 1.0, writer="trtllm")
    codes, sf = nvfp4.store(x, 1.0)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        nvfp4.read(codes, sf.float(), 1.0, torch.float32)
    with pytest.raises(ValueError, match="do not match"):
        nvfp4.read(codes[:, :8], sf, 1.0, torch.float32)


def test_fake_quantize_keeps_shape_and_dtype_and_the_writers_agree():
    x = _states(4).reshape(2, 3, 4, 64)
    for four_over_six in (False, True):
        out = nvfp4.fake_quantize(x, 0.37, four_over_six=four_over_six)
        assert out.dtype == torch.bfloat16 and out.shape == x.shape
    # FlashInfer's writer rounds amax / (6 k) once where vLLM's rounds g * (amax * 1/6):
    # on half-precision inputs the stored bytes come out the same
    for kv_scale in (1.0, 0.37, 3.0):
        a = nvfp4.store(x, kv_scale)
        b = nvfp4.store(x, kv_scale, writer="flashinfer")
        assert torch.equal(a[0], b[0]) and torch.equal(a[1].float(), b[1].float())
    assert nvfp4.KV_CACHE_DTYPES == {"nvfp4": False, "nvfp4_4over6": True}
