"""The objects the SGLang pool's parts are built from refuse what cannot be a pool: sizes,
layers, read plans, stored layers of mismatched lengths, channel pages of the wrong page size."""

from __future__ import annotations

import pytest
import torch

from kvtuner.errors import KVTunerError
from kvtuner.profile import LayerSpec
from kvtuner.quant import QuantSpec

pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

from kvtuner.runtime_loader.sglang.pool.channel_pages import ChannelPages
from kvtuner.runtime_loader.sglang.pool.channels import ChannelSides
from kvtuner.runtime_loader.sglang.pool.geometry import PoolGeometry
from kvtuner.runtime_loader.sglang.pool.layers import PoolLayers
from kvtuner.runtime_loader.sglang.pool.lazy_reads.read_plan import ReadPlan
from kvtuner.runtime_loader.sglang.pool.ops import PoolOps
from kvtuner.runtime_loader.sglang.pool.parts import pool_planes
from kvtuner.runtime_loader.sglang.pool.smoothing import LayerLambdas
from kvtuner.runtime_loader.sglang.pool.stored_layers import StoredLayers

pytestmark = pytest.mark.sglang

SIZES = dict(rows=64, page=16, heads=2, head_dim=32, dtype=torch.float32, device="cpu")
SPECS = (LayerSpec(0, QuantSpec(4), QuantSpec(4)), LayerSpec(1, QuantSpec(2), QuantSpec(8)))


def _reads(*_):
    raise AssertionError("not read")


def geometry(**changed) -> PoolGeometry:
    return PoolGeometry(**{**SIZES, "stage_pages": 4, **changed})


@pytest.mark.parametrize("changed", [dict(rows=0), dict(heads=-1), dict(stage_pages=-1)])
def test_geometry_refuses_sizes_no_buffer_can_have(changed):
    with pytest.raises(ValueError, match="invalid pool geometry"):
        geometry(**changed)


def test_geometry_counts_its_pages():
    assert geometry().pages == 4 and geometry(rows=72).pages == 4


@pytest.mark.parametrize("start,heads", [(-1, 2), (0, 0)])
def test_layers_refuse_a_negative_start_or_no_heads(start, heads):
    with pytest.raises(ValueError, match="invalid pool layers"):
        PoolLayers(SPECS, start, heads)


@pytest.mark.parametrize(
    "mode,tokens,views",
    [("dense", 0, {}), ("lazy", -1, {}), ("scratch", 8, {}), ("packed", 0, {0: (None, None)})],
)
def test_read_plan_refuses_what_its_mode_cannot_serve(mode, tokens, views):
    with pytest.raises(ValueError):
        ReadPlan(mode, tokens, _reads, _reads, views=views)


def test_a_lazy_plan_keeps_its_cache_and_views():
    plan = ReadPlan("lazy", 8, _reads, _reads, views={3: ("k", "v")})
    assert (plan.decode_cache_tokens, plan.views) == (8, {3: ("k", "v")})


def test_stored_layers_need_one_of_each_part_per_layer():
    layers = PoolLayers(SPECS, 0, 2)
    k, v, channels = ChannelSides.allocate(SPECS, geometry(), rope=None, packer=None)
    lambdas = LayerLambdas.for_layers(layers, geometry())
    planes = [(False, False)] * 2
    stored = StoredLayers(layers, k, v, [None, None], channels, lambdas, planes)
    assert stored.specs == SPECS and stored.start_layer == 0
    assert [tuple(b.shape) for b in stored.k_buffer] == [(64, 2, 20), (64, 2, 12)]
    with pytest.raises(ValueError, match="2 pool layers stored in parts of sizes"):
        StoredLayers(layers, k[:1], v, [None, None], channels, lambdas, planes)


def test_planes_where_they_align_codes_and_the_kernels_write():
    """At d 128 and 8 KV heads: a layer of one scale a token-head (68-byte rows) or of 8-bit
    g64 keys (136) is laid out as planes, both its sides (K8 V4: V's 80-byte rows too, one
    flag a layer); 80-byte rows alone are not; the CPU torch path never."""
    specs = (
        LayerSpec(0, QuantSpec(4, 128), QuantSpec(4, 128)),
        LayerSpec(1, QuantSpec(8, 64), QuantSpec(4)),
        LayerSpec(2, QuantSpec(4), QuantSpec(4)),
        LayerSpec(3, QuantSpec(16), QuantSpec(4, 128)),  # 16-bit keys stay rows
    )
    layers, big = PoolLayers(specs, 0, 8), geometry(heads=8, head_dim=128)
    kernels = PoolOps(None, None, None, None, torch_cpu=False)
    assert pool_planes(layers, big, kernels) == [(True, True), (True, True), (False, False),
                                                 (False, True)]  # fmt: skip
    torch_cpu = PoolOps(None, None, None, None, torch_cpu=True)
    assert pool_planes(layers, big, torch_cpu) == [(False, False)] * 4


def test_channel_pages_refuse_pages_other_than_their_group():
    spec = QuantSpec(4, group_size=16, axis="channel")
    assert ChannelPages(spec, geometry()).blocks.shape[0] == 4
    with pytest.raises(KVTunerError, match="needs pages of 16 slots"):
        ChannelPages(spec, geometry(page=8))
