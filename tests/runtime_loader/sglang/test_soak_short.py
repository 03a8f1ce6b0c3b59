"""A short soak of the real server with the exported KIVI profile (``--page-size 32``): 8 mixed
client streams (up to 16 new tokens each) for 10 s over a 1024-token pool, then every slot back
in the allocator once idle. The long run is ``benchmarks/sglang_soak.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

KIVI = Path(__file__).resolve().parents[3] / "exported_configs" / "smollm2-135m" / "kivi-4bit.json"
FLAGS = (
    "--kvtuner-profile",
    str(KIVI),
    "--page-size",
    "32",
    "--max-total-tokens",
    "1024",
    "--max-running-requests",
    "8",
    "--disable-radix-cache",
    "--enable-metrics",
)


def test_mixed_load_fails_nothing_and_leaves_no_slot_behind(tmp_path):
    from sglang_server import SGLangServer, smollm2_hf_dir
    from soak_load import idle_used_tokens, run_load

    with SGLangServer(smollm2_hf_dir(), *FLAGS, log_path=tmp_path / "server.log") as server:
        load = run_load(
            server.url, server.proc.pid, streams=8, seconds=10, max_tokens=16, rss_every=2
        )
        idle = idle_used_tokens(server.url)
    assert load.failed == 0, load.errors[:3]
    assert load.served >= 2 and load.rss_mb and all(mb > 0 for _, mb in load.rss_mb)
    assert idle == 0
