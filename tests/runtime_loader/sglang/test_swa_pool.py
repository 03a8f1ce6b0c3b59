"""SGLang's real SWAKVPool with both sub-pools kvtuner pools (the plugin's hook on its __init__)."""

from __future__ import annotations

import pytest
import torch

from kvtuner.errors import KVTunerError
from kvtuner.profile import LayerSpec, ModelFingerprint, Profile
from kvtuner.quant import QuantSpec, dequantize, quantize

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

from sglang.srt.mem_cache.memory_pool import KVWriteLoc  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402

from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool  # noqa: E402
from kvtuner.runtime_loader.sglang.swa.sub_pools import (  # noqa: E402
    kvtuner_sub_pools,
    sub_pool_cells,
    swa_pool_init,
)

S, F = "sliding_attention", "full_attention"
TYPES = (S, S, F, S, S, F)  # Gemma 3's pattern, shortened
SWA_IDS, FULL_IDS = [0, 1, 3, 4], [2, 5]
SPECS = [  # a different spec per layer, so a wrong layer mapping shows
    (QuantSpec(4, 32), QuantSpec(2, 32)),
    (QuantSpec(8), QuantSpec(4)),
    (QuantSpec(4, rotation="hadamard"), QuantSpec(8, symmetric=True)),
    (QuantSpec(16), QuantSpec(4, 64)),
    (QuantSpec(2, 32), QuantSpec(8, 32)),
    (QuantSpec(8, 32), QuantSpec(16)),
]
SIZE, SIZE_SWA, HEADS, D = 40, 16, 1, 64


class Layer:  # what set_kv_buffer reads from SGLang's RadixAttention
    def __init__(self, layer_id):
        self.layer_id = layer_id


def hybrid_profile(types=TYPES) -> Profile:
    fp = ModelFingerprint("Gemma3ForCausalLM", len(types), HEADS, D, "float32", types, 8)
    return Profile("tiny-swa", fp, tuple(LayerSpec(i, k, v) for i, (k, v) in enumerate(SPECS)))


def swa_pool(profile, read_mode="lazy", **kw) -> SWAKVPool:
    """SWAKVPool built as SGLang's configurator does, through the plugin's AROUND hook."""
    pool = SWAKVPool.__new__(SWAKVPool)
    args = dict(size=SIZE, size_swa=SIZE_SWA, page_size=1, dtype=torch.float32)
    args.update(head_num=HEADS, head_dim=D, device="cpu", enable_memory_saver=False)
    args.update(swa_attention_layer_ids=SWA_IDS, full_attention_layer_ids=FULL_IDS)
    cls = KVTunerMHATokenToKVPool.bound(profile, read_mode, **kw)
    swa_pool_init(SWAKVPool.__init__, pool, **args, token_to_kv_pool_class=cls)
    return pool


@pytest.fixture
def written():
    """Random K/V written to every layer: full slots 1..12 (some window slots)."""
    g = torch.Generator().manual_seed(0)
    pool = swa_pool(hybrid_profile())
    mapping = torch.zeros(SIZE + 2, dtype=torch.int64)
    full_loc = torch.arange(1, 13)
    swa_loc = torch.randperm(SIZE_SWA, generator=g)[:12] + 1
    mapping[full_loc] = swa_loc
    pool.register_mapping(mapping)
    data = {}
    for layer in range(len(TYPES)):
        k, v = (torch.randn(12, HEADS, D, generator=g) * 3 for _ in range(2))
        pool.set_kv_buffer(Layer(layer), KVWriteLoc(full_loc, swa_loc), k, v)
        data[layer] = (k, v)
    return pool, full_loc, data


def expected(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    return dequantize(quantize(x, spec), spec, D)


def test_both_sub_pools_are_kvtuner_pools_over_their_global_layers():
    pool = swa_pool(hybrid_profile())
    subs = kvtuner_sub_pools(pool)
    assert subs == [pool.full_kv_pool, pool.swa_kv_pool]
    assert all(isinstance(p, KVTunerMHATokenToKVPool) for p in subs)
    assert pool.full_kv_pool.layer_ids == pool.full_kv_pool.model_layer_ids == tuple(FULL_IDS)
    assert pool.swa_kv_pool.layer_ids == pool.swa_kv_pool.model_layer_ids == tuple(SWA_IDS)
    for sub, ids in ((pool.full_kv_pool, FULL_IDS), (pool.swa_kv_pool, SWA_IDS)):
        for local, layer in enumerate(ids):
            k, v = SPECS[layer]
            assert sub.k_buffer[local].shape[-1] == k.row_bytes(D)
            assert sub.v_buffer[local].shape[-1] == v.row_bytes(D)


def test_reads_through_full_pool_slots_equal_the_reference_in_both_sub_pools(written):
    """torch_native indexes every layer's buffer with req_to_token (full-pool) slots."""
    pool, full_loc, data = written
    for layer, (k_spec, v_spec) in enumerate(SPECS):
        k_hat = pool.get_key_buffer(layer)[full_loc]
        v_hat = pool.get_value_buffer(layer)[full_loc]
        assert torch.equal(k_hat, expected(data[layer][0], k_spec))
        assert torch.equal(v_hat, expected(data[layer][1], v_spec))


def test_announced_batch_reads_translate_window_slots(written):
    pool, full_loc, data = written
    for sub in kvtuner_sub_pools(pool):
        sub.prepare_reads(full_loc)  # what the plugin's forward hook announces
    for layer in (0, 2):
        k_hat = pool.get_key_buffer(layer)[full_loc]
        assert torch.equal(k_hat, expected(data[layer][0], SPECS[layer][0]))


def test_a_window_slot_freed_and_reused_is_never_read_stale(written):
    """SGLang's allocator maps tokens that left the window to slot 0 and reuses their slots."""
    pool, full_loc, data = written
    mapping = pool.full_to_swa_index_mapping
    assert torch.equal(pool.get_key_buffer(0)[full_loc], expected(data[0][0], SPECS[0][0]))
    reused = mapping[full_loc[:4]].clone()
    mapping[full_loc[:4]] = 0  # left the window
    new_full = torch.arange(20, 24)
    mapping[new_full] = reused
    k, v = torch.randn(4, HEADS, D) * 3, torch.randn(4, HEADS, D)
    pool.set_kv_buffer(Layer(0), KVWriteLoc(new_full, reused), k, v)
    assert torch.equal(pool.get_key_buffer(0)[new_full], expected(k, SPECS[0][0]))
    kept = pool.get_key_buffer(0)[full_loc]
    assert torch.equal(kept[4:], expected(data[0][0], SPECS[0][0])[4:])
    assert torch.equal(kept[:4], pool.swa_kv_pool.read_kv(0, torch.zeros(4, dtype=torch.long))[0])


def test_sub_pool_bytes_equal_the_profile_prediction():
    profile = hybrid_profile()
    pool = swa_pool(profile)
    cells = sub_pool_cells(profile, heads=HEADS, dtype_bytes=4, full_ids=FULL_IDS, swa_ids=SWA_IDS)
    layer_bytes = [s.exact_bytes_per_token(HEADS, D) for s in profile.layers]
    assert cells.full == sum(layer_bytes[i] for i in FULL_IDS)
    assert cells.swa == sum(layer_bytes[i] for i in SWA_IDS)
    assert sum(pool.full_kv_pool.get_kv_size_bytes()) == (SIZE + 1) * cells.full
    assert sum(pool.swa_kv_pool.get_kv_size_bytes()) == (SIZE_SWA + 1) * cells.swa
    assert sum(pool.get_kv_size_bytes()) == (SIZE + 1) * cells.full + (SIZE_SWA + 1) * cells.swa


def test_other_read_modes_are_refused_in_one_line():
    with pytest.raises(KVTunerError, match=r"SWAKVPool\) with scratch reads") as err:
        swa_pool(hybrid_profile(), "scratch")
    assert "\n" not in str(err.value)


def test_a_profile_with_other_window_layers_is_refused():
    with pytest.raises(KVTunerError, match=r"sliding-window layers are \[0, 1, 2, 3, 4\]"):
        swa_pool(hybrid_profile((S, S, S, S, S, F)))


def test_sglang_prices_each_sub_pool_at_its_packed_bytes():
    """The capacity hooks around HybridSWAPoolConfigurator's per-pool cell prices."""
    from sglang.srt.model_executor.pool_configurator import HybridSWAPoolConfigurator

    from kvtuner.runtime_loader.sglang.hooks.capacity import full_cell_hook, swa_cell_hook

    conf = HybridSWAPoolConfigurator.__new__(HybridSWAPoolConfigurator)
    conf._fused_full_entry = conf._fused_swa_entry = None
    conf._full_per_token, conf._swa_per_token = 2048, 2048
    conf._full_layers_num, conf._swa_layers_num = len(FULL_IDS), len(SWA_IDS)
    conf._draft_full_layers_num = conf._draft_swa_layers_num = 0
    full, swa = (
        HybridSWAPoolConfigurator._full_cell_bytes,
        HybridSWAPoolConfigurator._swa_cell_bytes,
    )
    conf._kvtuner_cells = None  # no profile: SGLang's own prices
    assert (full_cell_hook(full, conf), swa_cell_hook(swa, conf)) == (2 * 2048, 4 * 2048)
    cells = sub_pool_cells(
        hybrid_profile(), heads=HEADS, dtype_bytes=4, full_ids=FULL_IDS, swa_ids=SWA_IDS
    )
    conf._kvtuner_cells = cells
    assert (full_cell_hook(full, conf), swa_cell_hook(swa, conf)) == (cells.full, cells.swa)
