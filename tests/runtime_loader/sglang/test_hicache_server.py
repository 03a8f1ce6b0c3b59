"""HiCache with ``--kvtuner-profile`` on the real SGLang server on this CPU: the host tier (L2)
serves prefixes evicted from a small device pool, and SGLang's file backend (L3) keeps packed
pages that a restarted server with the same profile loads, and one with another profile does not.
"""

from __future__ import annotations

import re

import pytest
from tiny_profiles import model_profile

from kvtuner.profile import save_profile
from kvtuner.quant import QuantSpec

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

DEVICE_TOKENS = 1024  # a passage + question is ~400 tokens: the device pool holds about two
FLAGS = (
    "--enable-hierarchical-cache",
    "--hicache-ratio",
    "8",
    "--max-total-tokens",
    str(DEVICE_TOKENS),
    "--context-length",
    str(DEVICE_TOKENS),
    "--hicache-storage-backend",
    "file",
    # SGLang's default ("timeout": 1 s + 0.25 s a page) gives up on a storage prefetch that a
    # loaded CPU has not finished, and the request recomputes: a restart then shows no storage hit
    # (CI, 2026-11-25). Waiting for the prefetch makes the hit depend on the pages, not the clock.
    "--hicache-storage-prefetch-policy",
    "wait_complete",
)


def require_host_memory() -> None:
    """SGLang sizes host pools against free RAM minus a 10 GiB reserve (pool_host/base.py):
    on this shared machine other jobs can take that away (skip, naming it)."""
    from sglang.srt.mem_cache.host_memory import available_host_memory_bytes
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    spare = available_host_memory_bytes() - HICACHE_HOST_MEMORY_RESERVE_BYTES
    if spare < 2**30:
        pytest.skip(f"HiCache needs 10 GiB + 1 GiB free host RAM; {spare / 2**30:.1f} GiB spare")


@pytest.fixture(scope="module")
def smollm2_dir():
    from sglang_server import smollm2_hf_dir

    return smollm2_hf_dir()


@pytest.fixture(scope="module")
def profiles(smollm2_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("profiles")
    paths = {}
    for bits in (8, 4):
        paths[bits] = folder / f"kv{bits}.json"
        save_profile(model_profile(smollm2_dir, QuantSpec(bits), QuantSpec(bits)), paths[bits])
    return paths


@pytest.fixture(scope="module")
def storage_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hicache-files")


def serve(smollm2_dir, profile, storage_dir, log):
    from sglang_server import SGLangServer

    require_host_memory()
    srv = SGLangServer(smollm2_dir, *FLAGS, "--kvtuner-profile", str(profile), log_path=log)
    srv.env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = str(storage_dir)
    return srv


@pytest.fixture(scope="module")
def first_server(smollm2_dir, profiles, storage_dir, tmp_path_factory):
    """Two turns over 6 passages on a kvtuner 8-bit server with L2 and L3 (then stopped)."""
    from hicache_workload import documents, two_turns

    docs = documents(6, 300)
    log = tmp_path_factory.mktemp("logs") / "first.log"
    with serve(smollm2_dir, profiles[8], storage_dir, log) as srv:
        turns = two_turns(srv.url, docs, 12)
        text = srv.log_text()
    return docs, turns, text


def test_host_pool_is_packed_and_logged(first_server, profiles):
    _, _, log = first_server
    assert "kvtuner: HiCache host pool KVTunerMHATokenToKVPoolHost" in log
    host = re.search(r"Allocating kv hierarchical KV host pool: (\d+) tokens", log)
    assert host and int(host[1]) >= 8 * DEVICE_TOKENS


def test_evicted_prefix_comes_back_from_host_with_the_same_greedy_output(first_server):
    _, (first, second), _ = first_server
    assert sum(t.prompt_tokens for t in first) > 2 * DEVICE_TOKENS  # cannot all stay on device
    assert second[0].host_hit > 0.9 * second[0].prompt_tokens - 64  # evicted, back from L2
    assert [t.output_ids for t in second] == [t.output_ids for t in first]


def test_pages_in_storage_name_the_profile_hash(first_server, storage_dir, profiles):
    from kvtuner.profile import load_profile

    tag = f"kvtuner-v3-{load_profile(profiles[8]).hash}"  # the packed format, the profile
    pages = [p.name for p in storage_dir.glob("*.bin")]
    assert pages and all(tag in name for name in pages)


def test_restart_loads_packed_pages_from_storage_only_under_the_same_profile(
    first_server, smollm2_dir, profiles, storage_dir, tmp_path
):
    from hicache_workload import QUESTION, generate

    docs, (first, _), _ = first_server
    with serve(smollm2_dir, profiles[8], storage_dir, tmp_path / "same.log") as srv:
        again = generate(srv.url, docs[0] + QUESTION, 12)
    assert again.storage_hit > 0 and again.output_ids == first[0].output_ids
    with serve(smollm2_dir, profiles[4], storage_dir, tmp_path / "other.log") as srv:
        other = generate(srv.url, docs[0] + QUESTION, 12)
    assert other.storage_hit == 0 and other.host_hit == 0  # another profile's pages: a miss
