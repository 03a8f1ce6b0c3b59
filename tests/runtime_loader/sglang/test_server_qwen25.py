"""End to end on this CPU: the real SGLang server serving Qwen2.5-Coder-0.5B-Instruct (qwen2: a
bias on the K projection, 2 KV heads) with the best servable exported 4-bit and 3-bit profiles,
each compared with the HF cache running the same profile, teacher-forced."""

from __future__ import annotations

from pathlib import Path

import pytest
from teacher_forcing import forced_deficits, generate, prompt_ids

from kvtuner.profile import load_profile

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

EXPORTED = Path(__file__).resolve().parents[3] / "exported_configs/qwen2.5-0.5b"
# The best SGLang-servable profile at each budget (docs/results/qwen25.md), and the
# server flags it needs (channel-axis keys: pages of the group size, a staging bound).
SERVED = {
    "kivi-prerope-g64-0.3125x": ("--page-size", "64", "--max-running-requests", "4"),
    "kivi-prerope-g64-0.25x": ("--page-size", "64", "--max-running-requests", "4"),
}
PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does the SQL keyword JOIN do? Answer in two sentences.",
]
NEW_TOKENS = 40  # the prompts (~35 tokens with the system prompt) cross a 32- and a 64-token page
# Teacher-forced HF, fed the served tokens: its top logit minus its logit of the served token.
CLOSE_LOGIT = 1.5
SAME_CHOICE = 0.85  # share of steps where the server picks HF's argmax


@pytest.fixture(scope="module")
def qwen25_dir():
    from sglang_server import qwen25_hf_dir

    return qwen25_hf_dir()


@pytest.fixture(scope="module")
def hf_model(qwen25_dir):
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(qwen25_dir)
    return tok, transformers.AutoModelForCausalLM.from_pretrained(qwen25_dir, dtype=torch.float32)


@pytest.mark.parametrize("name", list(SERVED))
def test_every_served_token_is_the_hf_caches_choice_up_to_a_near_tie(
    name, qwen25_dir, hf_model, tmp_path
):
    """As test_server_kivi's check: fed the served tokens, HF running the same profile picks
    nearly all of them and ranks the rest close to its top (the pool quantizes the newest value
    and a just-filled page one step before HF does; SGLang's model is not HF's bit for bit)."""
    from sglang_server import SGLangServer

    path = EXPORTED / f"{name}.json"
    tok, model = hf_model
    profile, deficits = load_profile(path, model.config), []
    flags = ("--kvtuner-profile", str(path), *SERVED[name])
    with SGLangServer(qwen25_dir, *flags, log_path=tmp_path / "server.log") as server:
        for prompt in PROMPTS:
            ids = prompt_ids(tok, prompt)
            served = generate(server, ids, NEW_TOKENS)
            deficits += forced_deficits(model, profile, ids, served)
        assert "kvtuner: KV cell size" in server.log_text()
    same = sum(d == 0 for d in deficits)
    assert max(deficits) < CLOSE_LOGIT, sorted(deficits)[-5:]
    assert same >= SAME_CHOICE * len(deficits) and len(deficits) >= 40, (same, len(deficits))
