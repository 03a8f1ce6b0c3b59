"""vLLM's TurboQuant presets, emulated in torch (kvtuner/quant/vllm_turboquant.py), core tier.

Properties of the numerics; the vllm tier (tests/runtime_loader/vllm/test_turboquant_bitexact.py)
checks the bytes, tables and reads against vLLM's own store, centroids and decode kernels.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvtuner.quant import vllm_turboquant as tq

LLOYD = [("turboquant_4bit_nc", 4), ("turboquant_k3v4_nc", 3)]  # Lloyd-Max key presets, bits
MAX_DISTORTION = {3: 0.03455, 4: 0.009497}  # Max (1960): optimal Gaussian MSE / variance


def _keys(n: int = 256, d: int = 128, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    x[:, :4] *= 10  # outlier channels, as post-RoPE keys have
    return x.to(torch.bfloat16)


def _rel_err(preset: str, which: str, x: torch.Tensor) -> float:
    """Mean squared error of the read, relative to each row's squared norm."""
    err = tq.fake_quantize(x, which, preset).float() - x.float()
    return (err.pow(2).sum(-1) / x.float().pow(2).sum(-1)).mean().item()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("bits", [3, 4])
def test_centroids_sorted_symmetric_and_lloyd_max_optimal(d, bits):
    c = tq.centroids(d, bits)
    assert c.dtype == torch.float32 and c.shape == (1 << bits,)
    assert (c.diff() > 0).all()
    assert torch.equal(c, -c.flip(0))
    mids = tq.midpoints(d, bits)
    assert ((mids > c[:-1]) & (mids < c[1:])).all()
    g = torch.Generator().manual_seed(bits)
    s = torch.randn(100_000, generator=g) / math.sqrt(d)  # N(0, 1/d)
    mse = (c[torch.bucketize(s, mids, right=True)] - s).pow(2).mean().item() * d
    assert mse == pytest.approx(MAX_DISTORTION[bits], rel=0.03)


@pytest.mark.parametrize("d", [8, 64, 128])
def test_rotation_is_an_orthonormal_symmetric_sylvester_hadamard(d):
    h = tq.hadamard(d)
    assert torch.allclose(h @ h.T, torch.eye(d), atol=1e-6)
    assert torch.equal(h, h.T)
    assert torch.equal(h.abs(), torch.full((d, d), 1 / math.sqrt(d)))
    assert (h[0] > 0).all() and (h[:, 0] > 0).all()  # no random signs
    assert torch.equal(h[: d // 2, d // 2 :], h[: d // 2, : d // 2])  # [[H, H], [H, -H]]
    assert torch.equal(h[d // 2 :, d // 2 :], -h[: d // 2, : d // 2])


def test_packing_is_little_endian():
    q = torch.arange(8)
    assert tq._pack(q, 3).tolist() == [0x88, 0xC6, 0xFA]  # sum(j << 3j), low byte first
    assert tq._pack(q, 4).tolist() == [0x10, 0x32, 0x54, 0x76]  # element 2i in the low nibble
    g = torch.Generator().manual_seed(0)
    for bits in (3, 4):
        codes = torch.randint(0, 1 << bits, (3, 5, 64), generator=g)
        packed = tq._pack(codes, bits)
        assert packed.dtype == torch.uint8 and packed.shape == (3, 5, 64 * bits // 8)
        assert torch.equal(tq._unpack(packed, bits), codes)


def test_error_shrinks_with_bits():
    x = _keys()
    k8, k4, k3 = (_rel_err(f"turboquant_{p}", "k", x) for p in ("k8v4", "4bit_nc", "k3v4_nc"))
    assert k8 < 0.002 < k4 < 0.012 < k3 < 0.04  # fp8, then Lloyd-Max near Max's distortion
    v4, v3 = _rel_err("turboquant_4bit_nc", "v", x), _rel_err("turboquant_3bit_nc", "v", x)
    assert v4 < v3 / 3
    assert _rel_err("turboquant_3bit_nc", "k", x) == k3  # same 3-bit keys


def test_value_codes_round_half_up_with_fp16_scale_and_zero():
    x = torch.cat([torch.arange(31) * 0.5, torch.zeros(1)])[None]  # 0 .. 15 by halves: scale 1
    codes, scale, zero = tq.store(x, "v", "turboquant_4bit_nc")
    assert scale.dtype == zero.dtype == torch.float16 and (scale.item(), zero.item()) == (1, 0)
    got = tq.read((codes, scale, zero), "v", "turboquant_4bit_nc", torch.float32)[0]
    assert torch.equal(got, (x[0] + 0.5).floor())  # 0.5 -> 1, 1.5 -> 2: ties up, not to even
    g = torch.Generator().manual_seed(1)
    v = torch.randn(64, 128, generator=g) * 3 + 40  # min far from 0: fp16 zero rounding shows
    for preset, bits in (("turboquant_4bit_nc", 4), ("turboquant_3bit_nc", 3)):
        _, scale, zero = tq.store(v, "v", preset)
        span = v.amax(-1) - v.amin(-1)
        bound = span / ((1 << bits) - 1) / 2 + (zero.float() - v.amin(-1)).abs() + 1e-3 * span
        err = (tq.fake_quantize(v, "v", preset) - v).abs().amax(-1)
        assert (err <= bound).all()


@pytest.mark.parametrize(("preset", "bits"), LLOYD)
def test_norm_correction_keeps_each_keys_stored_norm(preset, bits):
    x = _keys(64, 128, seed=bits)
    x[0] = 0.0
    codes, norms = tq.store(x, "k", preset)
    assert codes.shape == (64, 128 * bits // 8) and norms.dtype == torch.float16
    norm = x.float().norm(dim=-1)
    assert ((norms.float() - norm).abs() <= norm * 2**-11).all()  # fp16 round to nearest
    back = tq.read((codes, norms), "k", preset, torch.float32)
    assert torch.allclose(back.norm(dim=-1), norms.float(), rtol=1e-5, atol=0)
    assert torch.equal(back[0], torch.zeros(128))  # a zero key reads back as zero
    rotated = tq.read_rotated((codes, norms), preset)  # the basis the kernel scores in
    assert torch.allclose(rotated @ tq.hadamard(128), back, atol=1e-6)
    plain = tq.TurboQuantPreset("no_nc", bits, 4, norm_correction=False)
    ratio = tq.read((codes, norms), "k", plain, torch.float32)[1:].norm(dim=-1) / norm[1:]
    assert (ratio - 1).abs().max() > 1e-3  # without it the centroid vector's norm shows


def test_head_bytes_and_slot_bytes():
    want = {  # head_dim 128: (K, V, slot) bytes per token-head, as vLLM allocates
        "turboquant_k8v4": (128, 68, 196),
        "turboquant_4bit_nc": (66, 68, 134),
        "turboquant_k3v4_nc": (50, 68, 118),
        "turboquant_3bit_nc": (50, 52, 102),
    }
    for name, p in tq.PRESETS.items():
        got = (tq.head_bytes(p, "k", 128), tq.head_bytes(name, "v", 128), tq.slot_bytes(p, 128))
        assert got == want[name]
        for d in (8, 64, 256):
            k, v = (tq.head_bytes(p, w, d) for w in "kv")
            assert k == (d if p.key_fp8 else d * p.key_bits // 8 + 2)
            assert v == d * p.value_bits // 8 + 4
            assert tq.slot_bytes(p, d) == k + v + (k + v) % 2
    assert tq.slot_bytes("turboquant_k3v4_nc", 8) == 5 + 8 + 1  # odd: one pad byte


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("preset", list(tq.PRESETS))
def test_store_to_slot_and_fake_quantize_shapes(preset, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 5, 64, generator=g).to(dtype)
    for which in "kv":
        out = tq.fake_quantize(x, which, preset)
        assert out.shape == x.shape and out.dtype == dtype
    k, v = tq.store(x, "k", preset), tq.store(x, "v", preset)
    if tq.PRESETS[preset].key_fp8:
        assert [t.dtype for t in k] == [torch.float8_e4m3fn]
    else:
        assert [t.dtype for t in k] == [torch.uint8, torch.float16]
    assert [t.dtype for t in v] == [torch.uint8, torch.float16, torch.float16]
    assert [t.shape[:3] for t in (*k, *v)] == [(2, 3, 5)] * (len(k) + 3)
    cell = tq.to_slot(k, v, preset)
    assert cell.dtype == torch.uint8 and cell.shape == (2, 3, 5, tq.slot_bytes(preset, 64))
    n = tq.head_bytes(preset, "k", 64)
    if not tq.PRESETS[preset].key_fp8:  # the fp16 norm closes the key bytes, low byte first
        assert torch.equal(cell[..., n - 2 : n], k[1][..., None].view(torch.uint8))
    assert torch.equal(cell[..., n : n + v[0].shape[-1]], v[0])  # then the value codes


def test_fp8_keys_saturate_and_round_to_nearest_even():
    x = torch.tensor([34.0, 17.0, 31.75, 1e4, -1e4, 0.0, 1.0, -2.0])
    (codes,) = tq.store(x, "k", "turboquant_k8v4")
    assert codes.float().tolist() == [32.0, 16.0, 32.0, 448.0, -448.0, 0.0, 1.0, -2.0]


def test_boundary_skip_layers():
    want = {0: (), 1: (), 2: (0, 1), 3: (0, 2), 4: (0, 1, 2, 3), 5: (0, 1, 3, 4)}
    for n, layers in want.items():
        assert tq.boundary_skip_layers(n) == layers
    assert tq.boundary_skip_layers(30) == (0, 1, 28, 29)


def test_refusals_are_one_line_value_errors():
    x = torch.zeros(2, 96)
    cases = [
        (lambda: tq.store(x, "k", "turboquant_2bit"), "unknown TurboQuant preset"),
        (lambda: tq.store(x, "k", "turboquant_4bit_nc"), "power-of-two head_dim >= 8"),
        (lambda: tq.head_bytes("turboquant_3bit_nc", "v", 4), "power-of-two head_dim >= 8"),
        (lambda: tq.store(torch.zeros(2, 63), "v", "turboquant_k8v4"), "even head_dim"),
        (lambda: tq.store(x, "q", "turboquant_k8v4"), "which must be"),
        (lambda: tq.TurboQuantPreset("x", 5, 4, True), "key_bits"),
        (lambda: tq.TurboQuantPreset("x", 4, 8, True), "value_bits"),
        (lambda: tq.TurboQuantPreset("x", 8, 4, True), "no centroids"),
        (lambda: tq.read_rotated((x,), "turboquant_k8v4"), "use read"),
        (lambda: tq.to_slot((x,), (x,), "turboquant_k8v4"), "store"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)
    assert tq.fake_quantize(x, "k", "turboquant_k8v4").shape == x.shape  # k8v4 runs at 96
