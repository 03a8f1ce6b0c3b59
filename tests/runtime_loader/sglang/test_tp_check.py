"""Tensor parallel: two ranks (gloo, 2 processes on CPU) compare the profile hash when they build
the pool; the same profile builds on both, different profiles make both refuse."""

from __future__ import annotations

import multiprocessing as mp

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed


def _rank(rank: int, init_file: str, queue) -> None:
    import torch
    import torch.distributed as dist

    from kvtuner.errors import KVTunerError
    from kvtuner.profile import ModelFingerprint, Profile
    from kvtuner.quant import QuantSpec
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    fp = ModelFingerprint("LlamaForCausalLM", 2, 2, 64)
    results = []
    for case in ("same", "different"):
        bits = 8 if case == "same" or rank == 0 else 4
        profile = Profile.uniform("tiny", fp, QuantSpec(bits), QuantSpec(bits))
        try:  # each rank holds its own KV head (2 heads split over 2 ranks)
            KVTunerMHATokenToKVPool(
                16,
                page_size=1,
                dtype=torch.float32,
                head_num=1,
                head_dim=64,
                layer_num=2,
                device="cpu",
                enable_memory_saver=False,
                profile=profile,
                tp_group=dist.group.WORLD,
            )
            results.append("built")
        except KVTunerError as exc:
            results.append(str(exc))
    dist.destroy_process_group()
    queue.put((rank, results))


def test_ranks_agree_on_the_profile_or_all_refuse(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "init"), queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for rank in (0, 1):
        same, different = results[rank]
        assert same == "built"
        assert "differs across ranks" in different
        assert "rank 0:" in different and "rank 1:" in different and "\n" not in different
