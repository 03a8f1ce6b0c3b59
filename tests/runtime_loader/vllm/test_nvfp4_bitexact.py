"""kvtuner's nvfp4 / nvfp4_4over6 KV emulation (kvtuner/quant/vllm_nvfp4.py), bit for bit.

- ``nvfp4`` against vLLM 0.32's own torch reference,
  ``vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py``: ``ref_nvfp4_quant``
  (E2M1 values and E4M3 block scales, with global scale ``1 / kv_scale``),
  ``ref_nvfp4_quant_dequant``, and ``break_fp4_bytes`` / ``dequantize_to_dtype`` reading our
  packed bytes (nibble order).
- ``nvfp4_4over6`` against a scalar reference written here from vLLM's CUDA store,
  ``csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu``: ``cvt_warp_fp16_to_fp4_4over6`` with
  ``nvfp4_candidate_scale``, ``nvfp4_reconstruction_error`` (16 elements per thread, the
  CUDA >= 12.9 build) and ``round_to_nearest_e2m1``, packed as ``cvt.rn.satfinite.e2m1x2.f32``
  packs (``nvfp4_utils.cuh``); ``rcp.approx.ftz`` taken as the IEEE reciprocal.
- FlashInfer's writer (vLLM's SM80/SM90/SM120 path) against a scalar reference written from
  FlashInfer's ``include/flashinfer/page.cuh``: ``nvfp4_append_quantize_block`` and
  ``nvfp4_append_quantize_e2m1``.

The CUDA kernels need an NVIDIA GPU (SM100 for vLLM's store); these references follow their
source line by line in IEEE fp32 (numpy float32 scalars).
"""

from __future__ import annotations

import math
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.model_executor.layers.quantization.utils import (  # noqa: E402
    nvfp4_emulation_utils as ref,
)

from kvtuner.quant import vllm_nvfp4 as nvfp4  # noqa: E402

F32 = np.float32
SCALES = [1.0, 0.5, 0.37, 3.0, 2.0**-6, 11.0, 0.0123]  # includes non-powers of two
POW2_SCALES = [1.0, 0.5, 2.0**-6, 4.0]


def _states(seed: int, kv_scale: float, dtype: torch.dtype, rows: int = 64) -> torch.Tensor:
    """K-like rows [rows, 64]: magnitudes from 1e-4 to 1e4 times kv_scale (past 6 * 448 *
    kv_scale, so block scales saturate; tiny ones underflow), a zero block, an outlier row and
    rows of exact E2M1 midpoints under a block scale of 1, and blocks that make 4over6 choose."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.logspace(-4, 4, rows)[:, None] * kv_scale
    x = torch.randn(rows, 64, generator=g) * spread
    x[0, :16] = 0.0
    x[1, :4] = torch.tensor([1e5, -1e5, 3.0, -2.0]) * kv_scale
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 2)
    x[2, :16] = ties * kv_scale
    x[3, :16] = -ties * kv_scale
    x[4, :16] = 4.0 * kv_scale  # a block 4over6 stores at max/4
    x[5, :16] = 6.0 * kv_scale  # max/4 and max/6 both exact: 4over6's tie keeps max/6
    return x.to(dtype)


def _global(kv_scale: float) -> torch.Tensor:
    """The store kernel's global scale: ``1.0f / k_scale`` in fp32."""
    return torch.tensor([1.0]) / torch.tensor([kv_scale], dtype=torch.float32)


def _values(codes: torch.Tensor) -> torch.Tensor:
    return nvfp4.decode_e2m1(torch.stack([codes & 0xF, codes >> 4], -1).flatten(-2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kv_scale", SCALES)
def test_store_matches_ref_nvfp4_quant(dtype, kv_scale):
    x = _states(0, kv_scale, dtype)
    ref_values, ref_scales = ref.ref_nvfp4_quant(x, _global(kv_scale), 16)
    codes, sf = nvfp4.store(x, kv_scale)
    assert torch.equal(sf.float(), ref_scales)
    assert torch.equal(_values(codes), ref_values)
    assert torch.equal(ref.break_fp4_bytes(codes, torch.float32), ref_values)  # vLLM's decoder
    assert (sf.float() == 448).any() and (sf.float() == 0).any()  # saturated and zero blocks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kv_scale", POW2_SCALES)
def test_fake_quantize_matches_ref_nvfp4_quant_dequant(dtype, kv_scale):
    x = _states(1, kv_scale, dtype)
    want = ref.ref_nvfp4_quant_dequant(x, _global(kv_scale), 16)
    assert want.dtype == dtype
    assert torch.equal(nvfp4.fake_quantize(x, kv_scale), want)


@pytest.mark.parametrize("kv_scale", [0.37, 3.0, 0.0123])
def test_read_scales_by_kv_scale_where_the_reference_divides_by_its_inverse(kv_scale):
    """The reference dequantizes with ``block_scale / g`` and ``g = fl(1 / kv_scale)``; the
    attention kernels multiply by ``kv_scale``. They agree to one fp32 ulp."""
    x = _states(2, kv_scale, torch.float32)
    want = ref.ref_nvfp4_quant_dequant(x, _global(kv_scale), 16)
    got = nvfp4.fake_quantize(x, kv_scale)
    ulps = (got.view(torch.int32) - want.view(torch.int32)).abs()
    assert ulps.max() <= 1
    ref_values, ref_scales = ref.ref_nvfp4_quant(x, _global(kv_scale), 16)
    exact = (ref_values.unflatten(-1, (-1, 16)) * ref_scales[..., None]).flatten(-2) * kv_scale
    assert torch.equal(got, exact)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kv_scale", POW2_SCALES)
def test_read_matches_vllm_dequantize_to_dtype(dtype, kv_scale):
    codes, sf = nvfp4.store(_states(3, kv_scale, torch.bfloat16), kv_scale)
    scale = torch.tensor(kv_scale, dtype=torch.float32)
    want = ref.dequantize_to_dtype(codes, sf, scale, dtype, 16, swizzle=False)
    assert torch.equal(nvfp4.read(codes, sf, kv_scale, dtype), want)


def test_vllm_layout_constants():
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, nvfp4_kv_cache_full_dim
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    for d in (64, 128, 256):
        assert nvfp4.head_bytes(d) == nvfp4_kv_cache_full_dim(d)
    assert ref.kE2M1ToFloat_handle.val.tolist() == list(nvfp4.E2M1_GRID)
    assert ref.FLOAT4_E2M1_MAX == 6.0
    for name in nvfp4.KV_CACHE_DTYPES:
        assert STR_DTYPE_TO_TORCH_DTYPE[name] == torch.uint8
        assert get_kv_quant_mode(name).is_nvfp4


@pytest.mark.parametrize(("loaded", "want"), [(None, 1.0), (0.02, 0.02)])
def test_vllm_loads_the_checkpoint_scale_or_one(loaded, want):
    """``BaseKVCacheMethod`` hands an nvfp4 layer the checkpoint's k/v_scale unchanged, else 1.0."""
    from vllm.model_executor.layers.attention.attention import set_default_quant_scales
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    layer = torch.nn.Module()
    layer.kv_cache_dtype = "nvfp4"
    set_default_quant_scales(layer, register_buffer=True)
    method = BaseKVCacheMethod(None)
    method.create_weights(layer)
    if loaded is not None:
        layer.k_scale.data.fill_(loaded)
        layer.v_scale.data.fill_(loaded)
    method.process_weights_after_loading(layer)
    assert layer._k_scale_float == pytest.approx(want, rel=1e-7)
    assert layer._v_scale_float == pytest.approx(want, rel=1e-7)


# --- scalar references written from the CUDA stores --------------------------------------------


def _e4m3(value: F32) -> tuple[int, F32]:
    """``__nv_fp8_e4m3(v)``: round to nearest even, saturating; (byte, value)."""
    q = torch.tensor(min(float(value), 448.0), dtype=torch.float32).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).item(), F32(q.float().item())


def _e2m1_magnitude(mag: float) -> int:
    """The threshold chain both stores use (vLLM's ``round_to_nearest_e2m1``, FlashInfer's
    ``nvfp4_append_quantize_e2m1``; = ``cvt.rn.satfinite``): magnitude code 0..7."""
    if not mag > 0.25:
        return 0
    if mag < 0.75:
        return 1
    if mag <= 1.25:
        return 2
    if mag < 1.75:
        return 3
    if mag <= 2.5:
        return 4
    if mag < 3.5:
        return 5
    if mag <= 5.0:
        return 6
    return 7


def _e2m1(x: F32) -> tuple[int, F32]:
    """One value -> (code with the sign of x in bit 3, signed E2M1 value)."""
    mag = _e2m1_magnitude(abs(float(x)))
    negative = math.copysign(1.0, float(x)) < 0  # copysignf / signbit
    value = F32(nvfp4.E2M1_GRID[mag])
    return mag | (8 if negative else 0), -value if negative else value


def _vllm_candidate(vec_max: F32, g: F32, denominator: float) -> tuple[int, F32]:
    """``nvfp4_candidate_scale``: (block-scale byte, outputScale)."""
    sf_byte, sf = _e4m3(g * (vec_max * (F32(1) / F32(denominator))))
    output_scale = F32(1) / (sf * (F32(1) / g)) if sf != 0 else F32(0)
    return sf_byte, output_scale


def _vllm_error(vals: list[F32], output_scale: F32) -> F32:
    """``nvfp4_reconstruction_error`` for one thread holding all 16 elements."""
    error = F32(0)
    dequant = F32(1) / output_scale if output_scale != 0 else F32(0)
    for i in range(8):
        x, y = vals[2 * i], vals[2 * i + 1]
        if output_scale == 0:
            error += x * x + y * y
        else:
            dx = _e2m1(x * output_scale)[1] * dequant - x
            dy = _e2m1(y * output_scale)[1] * dequant - y
            error += dx * dx + dy * dy
    return error


def _vllm_4over6_block(vals: list[F32], g: F32) -> tuple[list[int], int]:
    """``cvt_warp_fp16_to_fp4_4over6`` on one block: (8 packed bytes, block-scale byte)."""
    vec_max = max(abs(v) for v in vals)
    sf6, out6 = _vllm_candidate(vec_max, g, 6.0)
    sf4, out4 = _vllm_candidate(vec_max, g, 4.0)
    use4 = _vllm_error(vals, out4) < _vllm_error(vals, out6)
    out = out4 if use4 else out6
    codes = [_e2m1(v * out)[0] for v in vals]
    # cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a (element 2i+1) high and b (element 2i) low
    return [codes[2 * i] | codes[2 * i + 1] << 4 for i in range(8)], (sf4 if use4 else sf6)


def _flashinfer_block(vals: list[F32], k: F32) -> tuple[list[int], int]:
    """FlashInfer's ``nvfp4_append_quantize_block`` (default, non-precise rounding)."""
    amax = F32(0)
    for v in vals:
        amax = max(amax, abs(v))
    sf_value = amax / (F32(6) * k) if amax > 0 else F32(0)
    sf_byte, sf = _e4m3(sf_value)
    output_scale = F32(1) / (sf * k) if (amax > 0 and sf > 0) else F32(0)
    codes = [_e2m1(v * output_scale)[0] for v in vals]
    return [codes[2 * i] | codes[2 * i + 1] << 4 for i in range(8)], sf_byte


def _reference_store(x: torch.Tensor, block_fn, scale: F32) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a per-block scalar reference over x [R, D]: (bytes [R, D/2], scale bytes [R, D/16])."""
    rows = x.float().numpy().astype(np.float32)
    data, scales = [], []
    for row in rows:
        blocks = [block_fn([F32(v) for v in row[b : b + 16]], scale) for b in range(0, 64, 16)]
        data.append([byte for packed, _ in blocks for byte in packed])
        scales.append([sf for _, sf in blocks])
    return torch.tensor(data, dtype=torch.uint8), torch.tensor(scales, dtype=torch.uint8)


@pytest.mark.parametrize("kv_scale", [1.0, 0.37, 2.0**-5, 7.0])
def test_four_over_six_matches_the_cuda_store(kv_scale):
    x = _states(4, kv_scale, torch.bfloat16, rows=24)
    g = F32(1) / F32(kv_scale)
    want_codes, want_sf = _reference_store(x, _vllm_4over6_block, g)
    codes, sf = nvfp4.store(x, kv_scale, four_over_six=True)
    assert torch.equal(codes, want_codes)
    assert torch.equal(sf.view(torch.uint8), want_sf)
    sf6 = nvfp4.store(x, kv_scale)[1].view(torch.uint8)
    picked4 = (sf6 != want_sf).float().mean()
    assert 0.1 < picked4 < 0.9  # the search picks each divisor somewhere


def test_reference_e2m1_rounding_is_vllm_cast_to_fp4():
    """The scalar rounding above, vLLM's ``cast_to_fp4`` and ours agree on every midpoint."""
    grid = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0]
    xs = torch.tensor(grid + [-v for v in grid])
    want = ref.cast_to_fp4(xs.clone())
    got = torch.tensor([_e2m1(F32(v))[1] for v in xs.tolist()], dtype=torch.float32)
    assert torch.equal(got, want)
    assert torch.equal(nvfp4.decode_e2m1(nvfp4.encode_e2m1(xs)), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kv_scale", [1.0, 0.37, 2.0**-5, 7.0])
def test_flashinfer_writer_matches_page_cuh(dtype, kv_scale):
    x = _states(5, kv_scale, dtype, rows=24)
    want_codes, want_sf = _reference_store(x, _flashinfer_block, F32(kv_scale))
    codes, sf = nvfp4.store(x, kv_scale, writer="flashinfer")
    assert torch.equal(codes, want_codes)
    assert torch.equal(sf.view(torch.uint8), want_sf)
