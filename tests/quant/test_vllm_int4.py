"""vLLM's int4_per_token_head, emulated in torch (kvtuner/quant/vllm_int4.py), core tier.

The golden bytes below were written by vLLM 0.32's own ``reshape_and_cache_int4`` (its RHT and
its Triton store kernel under TRITON_INTERPRET=1) for ``_golden_input()``; the vllm tier
(tests/runtime_loader/vllm/test_formats.py) checks every value against that kernel itself on
random inputs, and vLLM's int4 attention kernel against attention over :meth:`load`.
"""

from __future__ import annotations

import pytest
import torch

from kvtuner.quant import vllm_int4
from kvtuner.quant.vllm_format import VllmKVFormat

INT4 = VllmKVFormat("int4_per_token_head")
VLLM_SIGNS_64 = [1, -1, 1, 1, -1, -1, -1, -1, 1, -1, -1, 1, 1, -1, 1, -1]  # first 16 of 64
GOLDEN_CODES = [  # x from _golden_input(), head 0 and 1: vLLM's packed bytes
    "65bf6394e60d61a4485b6b7587e8ce5b9bc48ab848428f4d8a97b45c977823b9",
    "64b56849a338739955b72829aaf69b09e7d34b4675852c4ba487787da35528a9",
]
GOLDEN_SCALE_BITS = [0x4174CCC8, 0x41A44447]  # fp32 scale bits, zero point in the low nibble


def _golden_input() -> torch.Tensor:
    x = (torch.arange(2 * 64, dtype=torch.float32).reshape(1, 2, 64) % 13 - 6.0) * torch.linspace(
        0.5, 3, 64
    )
    x[0, 1, 5] = 40.0
    return x.to(torch.bfloat16)


def test_store_writes_the_bytes_vllm_writes():
    codes, scales = INT4.store(_golden_input(), "k")
    assert codes.dtype == torch.uint8 and codes.shape == (1, 2, 32)
    assert [bytes(codes[0, h].tolist()).hex() for h in range(2)] == GOLDEN_CODES
    assert scales.view(torch.int32)[0].tolist() == GOLDEN_SCALE_BITS


def test_rotation_signs_blocks_and_inverse():
    assert vllm_int4._rht_signs(64)[:16].int().tolist() == VLLM_SIGNS_64
    assert [vllm_int4.rht_block(d) for d in (64, 96, 80, 128)] == [64, 32, 16, 128]
    for d in (64, 96):  # 96: three 32-blocks, each its own rotation
        x = torch.randn(4, d, generator=torch.Generator().manual_seed(d))
        back = vllm_int4.rht(vllm_int4.rht(x), inverse=True) / vllm_int4.rht_block(d)
        assert torch.allclose(back, x, atol=1e-5)
    x = torch.zeros(1, 96)
    x[0, 40] = 1.0  # a spike in block 1 spreads over block 1 only
    spread = vllm_int4.rht(x)[0]
    assert spread[32:64].abs().eq(1).all() and spread[:32].eq(0).all() and spread[64:].eq(0).all()


def test_codes_zero_point_and_read_error_bound():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=g) * 20
    x[0, 0] = 0.0  # an all-zero row reads back exactly (scale floor 1e-6, zero point 0)
    codes, scales = INT4.store(x, "v")
    rotated = vllm_int4.rht(x)
    step = (scales.view(torch.int32) & -16).view(torch.float32)[..., None]
    err = (vllm_int4.read_rotated(codes, scales) - rotated).abs()
    assert (err <= step / 2 + 1e-4 * rotated.abs().amax(-1, keepdim=True)).all()
    assert torch.equal(INT4.fake_quantize(x, "v")[0, 0], torch.zeros(64))
    back = INT4.fake_quantize(x, "v")  # the model's basis: rotated error / sqrt(b) per element
    assert (back - x).pow(2).sum(-1).sqrt().le(err.pow(2).sum(-1).sqrt() / 8 + 1e-3).all()


def test_page_bytes_and_refusals():
    assert INT4.side_bytes(64, "k") == 32 + 4  # codes, then the fp32 scale (vLLM's customize_spec)
    assert INT4.per_token_head and INT4.storage_dtype == torch.uint8
    with pytest.raises(ValueError, match="even head_dim"):
        INT4.store(torch.zeros(2, 63), "k")
    with pytest.raises(ValueError, match="computes its own scales"):
        VllmKVFormat("int4_per_token_head", k_scale=2.0)
    with pytest.raises(ValueError, match="UE8M0"):
        VllmKVFormat("ultraquant_4bit")
