"""kvtuner's TurboQuant emulation (kvtuner/quant/vllm_turboquant.py) is vLLM's, bit for bit.

vLLM's own code runs here: its store launcher ``triton_turboquant_store`` (torch norm and
rotation GEMM, then its Triton kernel), its decode launcher and its full-dequant kernel, the
kernels jitted for real under TRITON_INTERPRET=1 (set before triton is imported). The
interpreter's fp32 -> fp8 cast is not the GPU's (it rounds ties up and drops the carry of
31.75 to 16, and does not saturate), so the k8v4 store is compared on keys that fp8 e4m3 holds
exactly (the cast is then the identity under any rounding) and kvtuner's cast rule, the GPU's
``cvt.rn.satfinite``, is tested on its own; reads of fp8 bytes (an exact upcast) use any keys.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402
from vllm_triton import real_kernel  # noqa: E402

from kvtuner.quant import vllm_turboquant as tq  # noqa: E402

T, H, D, BLOCKS, BLOCK = 7, 3, 128, 2, 16
SLOTS = torch.tensor([3, 17, 0, 5, 30, 12, 20])
NAMES = list(tq.PRESETS)


def _tq_config(name: str, head_dim: int = D):
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig

    return TurboQuantConfig.from_cache_dtype(name, head_dim)


@contextlib.contextmanager
def _real(module: str, *kernels: str):
    """vLLM's ``module`` with ``kernels`` jitted for real (and the real ``triton``) while the
    context lasts."""
    ops = importlib.import_module(module)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "triton", importlib.import_module("triton"))
        for name in kernels:
            mp.setattr(ops, name, real_kernel(getattr(ops, name)))
        yield ops


def _fp8_exact(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random finite fp8 e4m3 values (±448 and 0 included) as fp32: keys the interpreter's cast
    stores unchanged."""
    codes = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E  # NaN codes -> ±448
    x = codes.view(torch.float8_e4m3fn).float()
    x.view(-1)[:3] = torch.tensor([448.0, -448.0, 0.0])
    return x


def _states(name: str, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """K and V [T, H, d] in ``dtype``: a zero key, a constant value row (the scale floor), a
    value row of exact half steps (round half up), outliers."""
    g = torch.Generator().manual_seed(seed)
    k = _fp8_exact((T, H, d), g) if tq.PRESETS[name].key_fp8 else torch.randn(T, H, d, generator=g)
    v = torch.randn(T, H, d, generator=g) * 2
    if not tq.PRESETS[name].key_fp8:
        k = k * 3
        k[1, 2] = 0.0
        k[2, 0, 5] = 80.0
    v[0, 0] = 1.25
    v[3, 1] = (torch.arange(d) % 31) * 0.5  # 0 .. 15 by halves: scale 1 at 4 bits
    v[4, 2, 7] = -300.0
    return k.to(dtype), v.to(dtype)


def _vllm_store(name: str, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """vLLM's ``triton_turboquant_store`` with the tables ``TurboQuantAttentionImpl`` builds
    (``_ensure_on_device``), into a zeroed page [BLOCKS, BLOCK, H, slot]; the cells at SLOTS."""
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids
    from vllm.v1.attention.backends.turboquant_attn import _build_hadamard

    d = k.shape[-1]
    cfg = _tq_config(name, d)
    cache = torch.zeros(BLOCKS, BLOCK, H, cfg.slot_size_aligned, dtype=torch.uint8)
    rot = _build_hadamard(d, "cpu") if not cfg.key_fp8 else torch.eye(d)  # unused for fp8
    c, _ = get_centroids(d, cfg.centroid_bits).sort()
    ops = "vllm.v1.attention.ops.triton_turboquant_store"
    with _real(ops, "_tq_fused_store_fp8", "_tq_fused_store_mse") as store_ops:
        store_ops.triton_turboquant_store(
            k, v, cache, SLOTS, rot, (c[:-1] + c[1:]) / 2, mse_bits=cfg.key_mse_bits,
            key_packed_size=cfg.key_packed_size, value_quant_bits=cfg.value_quant_bits,
            key_fp8=cfg.key_fp8,
        )  # fmt: skip
    return cache.view(-1, H, cache.shape[-1])[SLOTS]


def _ours(name: str, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return tq.to_slot(tq.store(k, "k", name), tq.store(v, "v", name), name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", NAMES)
def test_store_writes_vllms_slot_bytes(name, dtype):
    k, v = _states(name, D, dtype, seed=NAMES.index(name))
    assert torch.equal(_ours(name, k, v), _vllm_store(name, k, v))


@pytest.mark.parametrize("d", [64, 96])
def test_store_at_other_head_dims(d):
    """64 for every preset; 96 (not a power of two) for k8v4, the one preset vLLM runs there."""
    for name in NAMES if d == 64 else ["turboquant_k8v4"]:
        k, v = _states(name, d, torch.bfloat16, seed=d)
        assert torch.equal(_ours(name, k, v), _vllm_store(name, k, v))


def test_key_codes_take_the_centroid_above_a_midpoint():
    """vLLM's store kernel on rotated keys set exactly on the midpoints and one ulp below:
    a key on a midpoint takes the upper centroid (``torch.bucketize(right=True)``)."""
    name, bits = "turboquant_4bit_nc", 4
    cfg = _tq_config(name)
    mids = tq.midpoints(D, bits)
    on = mids.repeat(D // len(mids) + 1)[:D]  # [D]
    y = torch.stack([on, torch.nextafter(on, torch.tensor(-1.0)), -on])  # [3, D]
    cache = torch.zeros(1, BLOCK, 1, cfg.slot_size_aligned, dtype=torch.uint8)
    ops = "vllm.v1.attention.ops.triton_turboquant_store"
    with _real(ops, "_tq_fused_store_mse") as store_ops:
        store_ops._tq_fused_store_mse[(3,)](
            y, torch.ones(3), torch.zeros(3, D), mids, cache, torch.arange(3),
            stride_cache_block=cache.stride(0), stride_cache_pos=cache.stride(1),
            stride_cache_head=cache.stride(2), D=D, H=1, BLOCK_SIZE=BLOCK, BLOCK_D=D,
            MSE_BYTES=D // 2, KPS=cfg.key_packed_size, VQB=4, VAL_DATA_BYTES=D // 2,
            BLOCK_VAL=D // 2, MSE_BITS=bits, N_CENTROIDS=16,
        )  # fmt: skip
    idx = torch.bucketize(y, mids, right=True)
    assert torch.equal(cache[0, :3, 0, : D // 2], tq._pack(idx, bits))
    assert idx[0].min() == 1 and torch.equal(idx[0] - 1, idx[1])  # ties up, ulp below down


def test_fp8_keys_round_to_nearest_even_and_saturate():
    """kvtuner's k8v4 key cast is the GPU's ``cvt.rn.satfinite`` (not the interpreter's)."""
    x = torch.tensor([34.0, 17.0, 31.75, 1e4, -1e4, 0.0] + [1.0] * 2)  # head_dim 8
    (codes,) = tq.store(x, "k", "turboquant_k8v4")
    assert codes.float().tolist() == [32.0, 16.0, 32.0, 448.0, -448.0, 0.0, 1.0, 1.0]


def test_tables_are_vllms():
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids
    from vllm.v1.attention.backends.turboquant_attn import _build_hadamard

    for d in (64, 128, 256):
        assert torch.equal(tq.hadamard(d), _build_hadamard(d, "cpu"))
        for bits in (3, 4):
            assert torch.equal(tq.centroids(d, bits), get_centroids(d, bits))


def test_presets_and_page_bytes_are_vllms():
    from vllm.model_executor.layers.quantization.turboquant.config import TQ_PRESETS
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    assert list(tq.PRESETS) == TurboQuantAttentionBackend.supported_kv_cache_dtypes
    for name, p in tq.PRESETS.items():
        want = TQ_PRESETS[name]
        assert (p.key_bits, p.value_bits, p.norm_correction) == (
            want["key_quant_bits"], want["value_quant_bits"], want["norm_correction"]
        )  # fmt: skip
        for d in (8, 64, 128, 256):  # 8: k3v4_nc's slot is padded to even
            cfg = _tq_config(name, d)
            assert tq.head_bytes(p, "k", d) == cfg.key_packed_size
            assert tq.head_bytes(p, "v", d) == cfg.value_packed_size
            mode = get_kv_quant_mode(name)
            spec = FullAttentionSpec(
                block_size=16, num_kv_heads=H, head_size=d, dtype=torch.uint8, kv_quant_mode=mode
            )
            page = TurboQuantAttentionBackend.customize_spec(spec).page_size_bytes
            assert page == 16 * H * tq.slot_bytes(p, d)


def _slot_cache(name: str, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
    """A page [blocks, BLOCK, H, slot] holding kvtuner's cells for tokens [n] at ``slots``."""
    cells = _ours(name, k, v)  # [n, H, slot]
    blocks = int(slots.max()) // BLOCK + 1
    cache = torch.zeros(blocks * BLOCK, H, cells.shape[-1], dtype=torch.uint8)
    cache[slots] = cells
    return cache.view(blocks, BLOCK, H, -1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int]):
    """Each sequence's last query over its keys: q [B, Hq, D], k/v [sum(lens), H, D] fp32."""
    out, start, group = [], 0, q.shape[1] // H
    for b, n in enumerate(lens):
        kk = k[start : start + n].repeat_interleave(group, 1)  # [n, Hq, D]
        vv = v[start : start + n].repeat_interleave(group, 1)
        p = torch.einsum("hd,nhd->hn", q[b], kk).mul(D**-0.5).softmax(-1)
        out.append(torch.einsum("hn,nhd->hd", p, vv))
        start += n
    return torch.stack(out)


@pytest.mark.parametrize("name", NAMES)
def test_decode_kernel_attends_over_kvtuners_read(name):
    """vLLM's ``triton_turboquant_decode_attention`` (stage 1 and 2 under the interpreter) over
    kvtuner's cells equals attention over kvtuner's read of the same K and V, to fp32 rounding,
    far closer than either is to attention over the states themselves."""
    lens, q_heads = [9, 20], 2 * H
    g = torch.Generator().manual_seed(10 + NAMES.index(name))
    n = sum(lens)
    k = (torch.randn(n, H, D, generator=g) * 4).to(torch.bfloat16)
    v = torch.randn(n, H, D, generator=g).to(torch.bfloat16)
    q = torch.randn(len(lens), q_heads, D, generator=g)
    table = torch.tensor([[3, 0], [1, 2]], dtype=torch.int32)  # sequence b's pages
    pos = [torch.arange(m) for m in lens]  # token positions within each sequence
    slots = torch.cat([table[b].long()[i // BLOCK] * BLOCK + i % BLOCK for b, i in enumerate(pos)])
    cache = _slot_cache(name, k, v, slots)
    cfg, p = _tq_config(name), tq.PRESETS[name]
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids

    ops = "vllm.v1.attention.ops.triton_turboquant_decode"
    with _real(ops, "_tq_decode_stage1", "_fwd_kernel_stage2") as dec:
        out = dec.triton_turboquant_decode_attention(
            q, cache, table, torch.tensor(lens, dtype=torch.int32), tq.hadamard(D),
            get_centroids(D, cfg.centroid_bits), D**-0.5, mse_bits=cfg.key_mse_bits,
            key_packed_size=cfg.key_packed_size, value_quant_bits=cfg.value_quant_bits,
            key_fp8=cfg.key_fp8, norm_correction=cfg.norm_correction,
        )  # fmt: skip
    kr = tq.read(tq.store(k, "k", p), "k", p, torch.float32)
    vr = tq.read(tq.store(v, "v", p), "v", p, torch.float32)
    assert (out - _attention(q, kr, vr, lens)).abs().max() < 1e-5
    assert (out - _attention(q, k.float(), v.float(), lens)).abs().max() > 0.1


@pytest.mark.parametrize("name", NAMES)
def test_dequant_kernel_reads_kvtuners_values_and_rotated_keys(name):
    """vLLM's ``_tq_full_dequant_kv`` (its long-continuation prefill path) writes fp16: the
    values kvtuner reads, and the keys kvtuner's ``read_rotated`` (fp8: read) gives."""
    g = torch.Generator().manual_seed(20 + NAMES.index(name))
    k = (torch.randn(BLOCK, H, D, generator=g) * 4).to(torch.bfloat16)
    v = torch.randn(BLOCK, H, D, generator=g).to(torch.bfloat16)
    cache = _slot_cache(name, k, v, torch.arange(BLOCK) + BLOCK)  # page 1
    cfg, p = _tq_config(name), tq.PRESETS[name]
    ko, vo = (
        torch.zeros(1, H, BLOCK, D, dtype=torch.float16),
        torch.zeros(1, H, BLOCK, D, dtype=torch.float16),
    )
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids

    ops = "vllm.v1.attention.ops.triton_turboquant_decode"
    with _real(ops, "_tq_full_dequant_kv") as dec:
        dec._tq_full_dequant_kv[(BLOCK, H)](
            cache, torch.tensor([[1]], dtype=torch.int32), get_centroids(D, cfg.centroid_bits),
            ko, vo, *ko.stride()[:3], *vo.stride()[:3], *cache.stride()[:3], 1, HEAD_DIM=D,
            BLOCK_SIZE=BLOCK, NUM_KV_HEADS=H, MSE_BYTES=-(-D * cfg.key_mse_bits // 8),
            KPS=cfg.key_packed_size, VQB=cfg.value_quant_bits,
            VAL_DATA_BYTES=-(-D * cfg.value_quant_bits // 8), MSE_BITS=cfg.key_mse_bits,
            KEY_FP8=int(cfg.key_fp8), BLOCK_D=D, NORM_CORRECTION=int(cfg.norm_correction),
        )  # fmt: skip
    ks = tq.store(k, "k", p)
    keys = tq.read(ks, "k", p, torch.float16) if p.key_fp8 else tq.read_rotated(ks, p).half()
    assert torch.equal(ko[0].transpose(0, 1), keys)
    assert torch.equal(vo[0].transpose(0, 1), tq.read(tq.store(v, "v", p), "v", p, torch.float16))


@pytest.mark.parametrize("hybrid", [False, True])
def test_boundary_skip_layers_are_vllms(hybrid):
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig

    for n in (*range(0, 9), 30):
        text = SimpleNamespace(num_hidden_layers=n, layer_types=["full_attention"] * 2)
        model = SimpleNamespace(is_hybrid=hybrid, hf_text_config=text, hf_config=text)
        want = TurboQuantConfig.get_boundary_skip_layers(model)
        assert [str(i) for i in (() if hybrid else tq.boundary_skip_layers(n))] == want


def test_engine_adds_the_boundary_layers_to_the_users_skip_list():
    """vLLM's ``create_engine_config`` (SmolLM2, 30 layers): the boundary layers are skipped
    whether or not the user lists any, as a union with the user's."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vllm.engine.arg_utils import EngineArgs
    from vllm_engine import smollm2_hf_dir

    model = str(smollm2_hf_dir())
    for user, want in (([], {0, 1, 28, 29}), (["5", "1"], {0, 1, 5, 28, 29})):
        args = EngineArgs(model=model, kv_cache_dtype="turboquant_k3v4_nc", max_model_len=256,
                          kv_cache_dtype_skip_layers=user)  # fmt: skip
        skipped = args.create_engine_config().cache_config.kv_cache_dtype_skip_layers
        assert {int(s) for s in skipped} == want == {*tq.boundary_skip_layers(30), *map(int, user)}
