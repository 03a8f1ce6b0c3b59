"""The channel-axis page kernel (``triton_pack_channel_pages``) vs the torch reference, on CPU
tensors under Triton's interpreter: the same bytes for every bit width, symmetric or not,
Hadamard-rotated, poisoned channels, strided input; the launcher's checks in one line."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported in this process

import importlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from fresh_process import pass_in_fresh_process  # noqa: E402

from kvtuner.quant import QuantSpec, quantize  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
PAGES, HEADS = 9, 3
AT = torch.tensor([6, 0, 3])  # the pages written, out of order


def _interpreted():
    kernels = importlib.import_module("kvtuner.quant.triton_kernels")
    if not kernels.interpreted():
        return None  # triton was imported before TRITON_INTERPRET=1
    return importlib.import_module("kvtuner.quant.triton_channel")


TC = _interpreted()


@pytest.fixture(scope="module")
def tc():
    if TC is None:
        pytest.skip("triton was imported before TRITON_INTERPRET=1; see test_in_fresh_process")
    return TC


if TC is None:

    def test_in_fresh_process():
        """Run this module where TRITON_INTERPRET=1 is set before triton is imported."""
        pass_in_fresh_process(__file__)


def _pages(spec: QuantSpec, d: int, dtype=torch.float32) -> torch.Tensor:
    """x [3, G, HEADS, D] with a NaN, an Inf, a constant and an fp16-overflowing channel."""
    g = torch.Generator().manual_seed(spec.bits * 100 + spec.group_size + d)
    x = torch.randn(len(AT), spec.group_size, HEADS, d, generator=g) * 3
    x[0, 1, 0, 2] = float("nan")
    x[1, 0, 2, 5] = float("-inf")
    x[2, :, 1, 7] = 0.25
    x[2, 3, 2, 9] = 7e4
    return x.to(dtype)


def _want(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    blocks = torch.zeros(PAGES, HEADS, spec.block_bytes(x.shape[3]), dtype=torch.uint8)
    blocks[AT] = quantize(x.transpose(1, 2), spec).squeeze(2)
    return blocks


CASES = [
    QuantSpec(b, g, s, axis="channel")
    for b in (2, 3, 4, 5, 6, 8)
    for g, s in ((32, False), (8, True))
] + [
    QuantSpec(4, 32, axis="channel", rotation="hadamard"),
    QuantSpec(3, 16, True, axis="channel", rotation="hadamard"),
    QuantSpec(4, 8, axis="channel", rotation="hadamard"),  # butterflies: any G
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.short())
def test_blocks_are_the_references_bytes(tc, spec):
    x = _pages(spec, 64)
    blocks = torch.zeros(PAGES, HEADS, spec.block_bytes(64), dtype=torch.uint8)
    tc.triton_pack_channel_pages(blocks, AT, x, spec)
    assert torch.equal(blocks, _want(x, spec))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_and_strided_pages(tc, dtype):
    spec = QuantSpec(4, 16, axis="channel")
    stage = _pages(spec, 96, dtype).transpose(0, 1).contiguous().transpose(0, 1)  # strided pages
    assert not stage.is_contiguous()
    blocks = torch.zeros(PAGES, HEADS, spec.block_bytes(96), dtype=torch.uint8)
    tc.triton_pack_channel_pages(blocks, AT.int(), stage, spec)
    assert torch.equal(blocks, _want(stage, spec))


def test_bad_arguments_are_one_line_errors(tc):
    spec = QuantSpec(4, 32, axis="channel")
    blocks = torch.zeros(PAGES, HEADS, spec.block_bytes(64), dtype=torch.uint8)
    x = torch.zeros(len(AT), 32, HEADS, 64)
    bad = [
        (blocks, AT, x, QuantSpec(4, 32), "channel-axis spec"),
        (blocks, AT, x[:, :16], spec, "G=32"),
        (blocks[:, :2], AT, x, spec, "blocks must be"),
        (blocks, AT[:2], x, spec, "pages must be"),
    ]
    for b, p, xx, s, message in bad:
        with pytest.raises(ValueError, match=message) as err:
            tc.triton_pack_channel_pages(b, p, xx, s)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("version,plain", [("3.6.0", 8), ("3.9.0", 1)])
def test_page_programs_take_the_warps_the_triton_building_them_fits(tc, monkeypatch, version,
                                                                     plain):  # fmt: skip
    """Plain pages on one warp under Triton 3.9; Triton 3.6 (the GPU machines') spilled 2.2-2.4
    KB there and builds clean on 8; Hadamard pages 4 warps under both (sm_90a builds)."""
    monkeypatch.setattr(tc.triton, "__version__", version)
    assert tc._warps(rotate=False) == plain
    assert tc._warps(rotate=True) == 4
