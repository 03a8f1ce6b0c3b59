"""kvtuner's emulation of vLLM's KV formats is bit-exact against vLLM's own store kernels.

vLLM's Triton store kernels run here under TRITON_INTERPRET=1 (set before triton is imported).
The interpreter's own fp32 -> fp8 cast is not the GPU's (it rounds ties up and drops the carry
of 31.75 to 16), so for the fp8 formats the kernels write into fp32 caches: that checks every
value the kernel computes bit for bit, up to the final cast, which on the GPU is PTX
``cvt.rn.satfinite`` (round to nearest even, saturate), the rule tested on its own below. int8
stores are compared whole. vLLM's CPU fp8 kernel (AVX-512) rounds toward zero instead: tested
against that rule, and skipped (reason shown) on CPUs without AVX-512.
"""

from __future__ import annotations

import contextlib
import importlib
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402
from vllm_triton import real_kernel  # noqa: E402

from kvtuner.quant.vllm_format import VllmKVFormat  # noqa: E402

T, H, D, BLOCKS, BLOCK = 7, 3, 64, 2, 16
SLOTS = torch.tensor([3, 17, 0, 5, 30, 12, 20])


def _states(seed: int, spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [T, H, D] in bf16 (what vLLM's attention layer hands its store kernel), keys
    with outliers past e4m3's ±448."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, H, D, generator=g) * spread
    k[0, 0, :4] = torch.tensor([1e4, -1e4, 0.0, 1e-9])
    v = torch.randn(T, H, D, generator=g)
    return k.to(torch.bfloat16), v.to(torch.bfloat16)


def _caches(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (BLOCKS, BLOCK, H, D)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def _at_slots(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(-1, *cache.shape[2:])[SLOTS]


def _per_tensor_kernel(k, v, k_scale: float, v_scale: float):
    """vLLM's ``reshape_and_cache_kernel_flash`` (fp8 path) launched as its launcher does for
    the NHD layout, into fp32 caches (its launcher asks torch.cuda for the capability)."""
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
        reshape_and_cache_kernel_flash,
    )

    kc, vc = _caches(torch.float32)
    n = H * D
    real_kernel(reshape_and_cache_kernel_flash)[(T, 1)](
        k, v, kc, vc, SLOTS, torch.tensor([k_scale]), torch.tensor([v_scale]),
        key_stride=k.stride(0), value_stride=v.stride(0), block_stride=kc.stride(0),
        head_stride=kc.stride(2), dim_stride_k=0, dim_stride_v=0, page_stride=kc.stride(1),
        num_heads=H, head_size=D, block_size=BLOCK, x=1, USE_HEAD_MAJOR_LAYOUT=False,
        FP8_KV_CACHE=True, TILE_SIZE=1 << (n - 1).bit_length(),  # the launcher's: next pow2
    )  # fmt: skip
    return _at_slots(kc), _at_slots(vc)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.37, 0.0123)])
def test_per_tensor_fp8_matches_vllm_triton_store(scales):
    k, v = _states(0, spread=300.0)
    kc, vc = _per_tensor_kernel(k, v, *scales)
    for dtype in ("fp8_e4m3", "fp8_e5m2"):  # the kernel's values do not depend on the format
        fmt = VllmKVFormat(dtype, *scales)
        (pk, none), (pv, _) = fmt.prepare(k, "k"), fmt.prepare(v, "v")
        assert none is None
        assert torch.equal(_bits(pk), _bits(kc))
        assert torch.equal(_bits(pv), _bits(vc))


def _per_token_head(dtype: str, k, v):
    """vLLM's ``_reshape_cache_per_token_head`` with the launcher's arguments for ``dtype``;
    fp8 into fp32 caches (see the module docstring)."""
    from vllm.v1.attention.ops import triton_reshape_and_cache_flash as ops
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    fmt = VllmKVFormat(dtype)
    kc, vc = _caches(fmt.storage_dtype if fmt.storage_dtype == torch.int8 else torch.float32)
    ks, vs = torch.zeros(BLOCKS, BLOCK, H), torch.zeros(BLOCKS, BLOCK, H)
    kernel = real_kernel(ops._reshape_cache_per_token_head)
    if kc.dtype == torch.int8:  # vLLM's launcher, kernel jitted for real
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ops, "_reshape_cache_per_token_head", kernel)
            mp.setattr(ops, "triton", importlib.import_module("triton"))
            store = ops.triton_reshape_and_cache_flash_per_token_head_quant
            store(k, v, kc, vc, ks, vs, SLOTS, get_kv_quant_mode(dtype))
        return kc, vc, ks, vs
    qmax, qmin = ops._PER_TOKEN_HEAD_QUANT_PARAMS[ops.current_platform.fp8_dtype()]
    strides = {f"stride_{n}": s for n, s in _per_token_head_strides(k, v, kc, vc, ks, vs).items()}
    kernel[(T, H)](
        k, v, kc, vc, ks, vs, SLOTS, **strides, block_size=BLOCK, head_size=D, head_size_v=D,
        HEAD_SIZE_PADDED=D, QUANT_MAX=qmax, QUANT_MIN=qmin, IS_INT_QUANT=False,
    )  # fmt: skip
    return kc, vc, ks, vs


def _per_token_head_strides(k, v, kc, vc, ks, vs) -> dict[str, int]:
    return dict(
        key_tok=k.stride(0), key_head=k.stride(1), val_tok=v.stride(0), val_head=v.stride(1),
        kc_blk=kc.stride(0), kc_slot=kc.stride(1), kc_head=kc.stride(2),
        vc_blk=vc.stride(0), vc_slot=vc.stride(1), vc_head=vc.stride(2),
        ks_blk=ks.stride(0), ks_slot=ks.stride(1), ks_head=ks.stride(2),
        vs_blk=vs.stride(0), vs_slot=vs.stride(1), vs_head=vs.stride(2),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", ["int8_per_token_head", "fp8_per_token_head"])
def test_per_token_head_matches_vllm_triton_store(dtype):
    k, v = _states(1, spread=600.0)
    fmt = VllmKVFormat(dtype)
    kc, vc, ks, vs = _per_token_head(dtype, k, v)
    for x, cache, scales, which in ((k, kc, ks, "k"), (v, vc, vs, "v")):
        ours = fmt.store if cache.dtype == torch.int8 else fmt.prepare
        codes, scale = ours(x, which)
        assert torch.equal(_bits(codes), _bits(_at_slots(cache)))
        assert torch.equal(_bits(scale), _bits(_at_slots(scales)))


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cast_rounds_to_nearest_even_and_saturates(dtype):
    """The GPU's ``cvt.rn.satfinite``: ties to the even code, out-of-range to ±max, no NaN."""
    fmt = VllmKVFormat(dtype)
    fmax = torch.finfo(fmt.storage_dtype).max
    x = torch.tensor([34.0, 31.75, -1e6, 1e6, fmax * 1.01, 0.0])
    got = fmt.store(x, "k")[0].float()
    assert got[0] == 32.0  # a tie between 32 and 36 (e4m3); nearer 32 than 40 (e5m2)
    assert got[1] == 32.0  # rounds up across the exponent boundary
    assert got[2:5].tolist() == [-fmax, fmax, fmax]
    assert got[5] == 0.0


def _toward_zero(x: torch.Tensor, nearest: torch.Tensor) -> torch.Tensor:
    """vLLM's CPU fp8 store rule as measured on its kernel, from the saturated round-to-nearest
    codes of ``x``: round toward zero, an exact -0.0 stored as +0. Codes are sign-magnitude, so
    one code toward zero is code - 1."""
    codes = nearest.view(torch.uint8).clone()
    codes[nearest.float().abs() > x.float().abs()] -= 1
    codes[x == 0] = 0
    return codes


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_cpu_fp8_kernel_rounds_toward_zero_one_code_from_the_gpus(dtype):
    """vLLM's CPU fp8 store (``cpu_attn_reshape_and_cache``, the AVX-512 "vec" kernel) is
    bit-exact against round-toward-zero; kvtuner emulates the GPU's round-to-nearest, which is
    the same code or one further from zero."""
    if not torch.cpu._is_avx512_supported():
        pytest.skip("vLLM's CPU fp8 KV kernel needs AVX-512; this CPU lacks it")
    import vllm._custom_ops as ops

    k, v = _states(2, spread=300.0)  # includes ±1e4: saturated to ±max
    block = 32  # the "vec" kernel's block: a multiple of 32
    kc = torch.zeros(BLOCKS, H, block, D, dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    ops.cpu_attn_reshape_and_cache(k, v, kc, vc, SLOTS, "vec", 1.0, 1.0, dtype)
    # a block holds each head's keys as [D, block] (transposed for the QK dot), values [block, D]
    got_k = kc.view(BLOCKS, H, D, block).permute(0, 3, 1, 2).reshape(-1, H, D)[SLOTS]
    got_v = vc.transpose(1, 2).reshape(-1, H, D)[SLOTS]
    fmt = VllmKVFormat(dtype)
    for x, got, which in ((k, got_k, "k"), (v, got_v, "v")):
        nearest = fmt.store(x, which)[0]  # kvtuner's (the GPU's) saturated round-to-nearest
        assert torch.equal(_toward_zero(x, nearest), got)
        further = (_bits(nearest) & 0x7F).int() - (got & 0x7F).int()
        assert further.min() == 0 and further.max() == 1  # both rules occur in these states


@contextlib.contextmanager
def _int4_ops():
    """vLLM's int4 module, its launchers' kernels jitted for real while the context lasts."""
    from vllm.v1.attention.ops import int4_per_token_head as ops

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "triton", importlib.import_module("triton"))
        for name in ("_reshape_cache_int4_kernel", "_attn_packed"):
            mp.setattr(ops, name, real_kernel(getattr(ops, name)))
        yield ops


def test_int4_rotation_is_vllms():
    from vllm.v1.attention.ops import int4_per_token_head as ops

    from kvtuner.quant import vllm_int4

    for d in (64, 96):  # 96: vLLM rotates three blocks of 32
        x = torch.randn(5, 3, d).to(torch.bfloat16).float()
        assert torch.equal(vllm_int4.rht(x), ops.single_rht(x))
        assert torch.equal(vllm_int4.rht(x, inverse=True), ops.single_rht(x, inverse=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int4_matches_vllm_store(dtype):
    """vLLM's ``reshape_and_cache_int4`` (its RHT, then its Triton kernel): codes and scale bits
    (zero point included) equal kvtuner's, with ±1e4 outliers and an all-zero row."""
    k, v = _states(3, spread=60.0)
    k, v = k.to(dtype), v.to(dtype)
    k[2, 1] = 0.0
    fmt = VllmKVFormat("int4_per_token_head")
    kc = torch.zeros(BLOCKS, BLOCK, H, D // 2, dtype=torch.uint8)
    vc, ks, vs = torch.zeros_like(kc), torch.zeros(BLOCKS, BLOCK, H), torch.zeros(BLOCKS, BLOCK, H)
    with _int4_ops() as ops:
        ops.reshape_and_cache_int4(k, v, kc, vc, SLOTS, k_scale_cache=ks, v_scale_cache=vs)
    for x, cache, scales in ((k, kc, ks), (v, vc, vs)):
        codes, scale = fmt.store(x, "k")
        assert torch.equal(codes, _at_slots(cache))
        assert torch.equal(_bits(scale), _bits(_at_slots(scales)))


def test_int4_attention_sees_kvtuners_read():
    """vLLM's ``unified_attention_int4`` (query rotated, scores in the rotated basis, output
    un-rotated) over its own int4 cache equals causal attention over kvtuner's read of the same
    K and V, to fp32 rounding: far closer than either is to attention over the fp states."""
    t, q_heads = 7, 2 * H
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(t, n, D, generator=g) for n in (q_heads, H, H))
    k = k * 4
    kc = torch.zeros(2, BLOCK, H, D // 2, dtype=torch.uint8)
    vc, ks, vs = torch.zeros_like(kc), torch.zeros(2, BLOCK, H), torch.zeros(2, BLOCK, H)
    out, lens = torch.zeros(t, q_heads, D), torch.tensor([0, t], dtype=torch.int32)
    with _int4_ops() as ops:  # the sequence lives in physical block 1
        ops.reshape_and_cache_int4(k, v, kc, vc, torch.arange(t) + BLOCK, k_scale_cache=ks,
                                   v_scale_cache=vs)  # fmt: skip
        ops.unified_attention_int4(
            q, kc, vc, out, cu_seqlens_q=lens, max_seqlen_q=t, seqused_k=lens[1:],
            max_seqlen_k=t, softmax_scale=D**-0.5, window_size=(-1, -1),
            block_table=torch.tensor([[1, 0]], dtype=torch.int32), softcap=0.0, sinks=None,
            alibi_slopes=None, use_alibi_sqrt=False, qq_bias=None, output_scale=None,
            mm_prefix_range=None, k_scale_cache=ks, v_scale_cache=vs,
        )  # fmt: skip
    fmt = VllmKVFormat("int4_per_token_head")

    def attention(keys, values):  # [t, heads, D], GQA: each KV head serves two query heads
        kk, vv = (x.repeat_interleave(q_heads // H, 1).transpose(0, 1) for x in (keys, values))
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), kk, vv,
                                                             is_causal=True)  # fmt: skip
        return o.transpose(0, 1)

    emulated = attention(fmt.fake_quantize(k, "k"), fmt.fake_quantize(v, "v"))
    assert (out - emulated).abs().max() < 1e-4
    assert (out - attention(k, v)).abs().max() > 0.05


def test_int4_page_bytes_are_vllms():
    """vLLM's Triton backend sizes a token-head of int4 (and int8) as kvtuner counts it."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    for dtype in ("int4_per_token_head", "int8_per_token_head"):
        spec = FullAttentionSpec(block_size=16, num_kv_heads=H, head_size=D, dtype=torch.uint8,
                                 kv_quant_mode=get_kv_quant_mode(dtype))  # fmt: skip
        page = TritonAttentionBackend.customize_spec(spec).page_size_bytes
        assert page == 16 * H * VllmKVFormat(dtype).token_head_bytes(D)
