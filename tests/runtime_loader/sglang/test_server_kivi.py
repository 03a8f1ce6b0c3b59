"""End to end on this CPU: the real SGLang server serving the exported ``kivi-4bit`` SmolLM2
profile and a uniform KIVI K4V4 profile with keys stored before RoPE (channel-axis keys,
``--page-size 32``), each compared with the HF cache running the same profile; and the one-line
refusals of a KIVI profile without the page size or staging bound."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from teacher_forcing import forced_deficits, generate, prompt_ids

from kvtuner.profile import load_profile
from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size, stage_pages_for, staging_bytes

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

KIVI = Path(__file__).resolve().parents[3] / "exported_configs/smollm2-135m/kivi-4bit.json"
RUNNING = 8
FLAGS = ("--kvtuner-profile", str(KIVI), "--page-size", "32")
PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn leaves.",
]
NEW_TOKENS = 48  # every prompt (37-40 tokens) crosses the page boundary at 64
# Teacher-forced HF, fed the served tokens: its top logit minus its logit of the served token.
# Measured on Intel Xeon: kivi-4bit at most 0.50, 76 of 81 steps 0 (HF's own choice); pre-RoPE
# K4V4 at most 0.27, 101 of 104 (HF keeps the newest value and a just-filled page in fp; the pool
# does not). On AMD EPYC (AVX2) pre-RoPE K4V4 reaches 1.44 at one step: another BLAS sums the
# rotation in another order and moves a 4-bit code, and the two greedy paths part there.
CLOSE_LOGIT = 2.0
SAME_CHOICE = 0.9  # share of steps where the server picks HF's argmax


@pytest.fixture(scope="module")
def smollm2_dir():
    from sglang_server import smollm2_hf_dir

    return smollm2_hf_dir()


@pytest.fixture(scope="module", params=["kivi-4bit", "prerope-k4v4"])
def exported(request, smollm2_dir, tmp_path_factory) -> Path:
    """The exported kivi-4bit, or uniform K4V4 with pre-RoPE KIVI keys (the same 7200 bytes
    per token; 4 bits, where the near-tie comparison below holds: at 3 bits the pool's
    quantized newest value and HF's fp one move logits by more than a near tie)."""
    if request.param == "kivi-4bit":
        return KIVI
    from tiny_profiles import model_profile

    from kvtuner.profile import save_profile
    from kvtuner.quant import QuantSpec

    key = QuantSpec(4, 32, axis="channel", pre_rope=True)
    path = tmp_path_factory.mktemp("profiles") / "kivi-prerope-k4v4.json"
    save_profile(model_profile(smollm2_dir, key, QuantSpec(4, 32)), path)
    return path


@pytest.fixture(scope="module")
def server(smollm2_dir, exported, tmp_path_factory):
    from sglang_server import SGLangServer

    log = tmp_path_factory.mktemp("logs") / "server.log"
    flags = ("--kvtuner-profile", str(exported), *FLAGS[2:])
    with SGLangServer(smollm2_dir, *flags, "--max-running-requests", str(RUNNING),
                      log_path=log) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    return tok, transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)


def test_every_served_token_is_the_hf_caches_choice_up_to_a_near_tie(server, exported, hf_model):
    """The pool stores what the HF cache with ``residual_length=1`` stores (full key pages
    quantized per channel, the filling page in fp), but for two things: HF keeps a page that
    has just filled in fp for one more step, and the newest token's value in fp. And SGLang's
    model is not HF's bit for bit: a 1e-6 difference can move a 4-bit code. So, fed the served
    tokens, HF picks nearly all of them too, and ranks the others close to its top. Pre-RoPE
    keys: both turn the keys back by the same positions (0, 1, ... of each request)."""
    tok, model = hf_model
    profile, deficits = load_profile(exported), []
    for prompt in PROMPTS:
        ids = prompt_ids(tok, prompt)
        served = generate(server, ids, NEW_TOKENS)  # EOS may end it sooner
        deficits += forced_deficits(model, profile, ids, served)
    same = sum(d == 0 for d in deficits)
    assert max(deficits) < CLOSE_LOGIT, sorted(deficits)[-5:]
    assert same >= SAME_CHOICE * len(deficits) and len(deficits) >= 30, (same, len(deficits))


def test_pool_packs_kivi_keys_with_the_profiles_bytes_and_a_bounded_staging(server, exported):
    profile = load_profile(exported)
    log = server.log_text()
    shape = dict(heads=3, start_layer=0, num_layers=30, dtype_bytes=4)
    cell = cell_size(profile, **shape, read_mode="lazy")
    assert cell.packed == profile.kv_bytes(1) == 7200  # 5.0 effective bits, as exported
    positions = 0 if exported == KIVI else 4  # pre-RoPE keys: one int32 position per slot
    sizing = re.search(
        r"kvtuner: KV cell size (\d+) B/token \(packed (\d+) \+ read scratch 0 \+ pre-RoPE "
        r"positions (\d+),",
        log,
    )
    assert sizing and int(sizing[2]) == cell.packed and int(sizing[3]) == positions
    assert int(sizing[1]) == cell.total == cell.packed + positions
    pages = stage_pages_for(RUNNING)
    staged = staging_bytes(profile, **shape, stage_pages=pages)
    assert staged == pages * 30 * 32 * 3 * 64 * 4  # 30 key sides, fp32 pages
    assert f"fp staging of filling channel-axis pages: {staged} bytes ({pages} pages" in log
    pool = re.search(
        r"#tokens: (\d+), rows: (\d+), packed KV bytes: (\d+) .* fp staging: (\d+) filling "
        r"pages per channel-axis side \((\d+) sides, (\d+) bytes\)",
        log,
    )
    assert pool and int(pool[3]) == int(pool[2]) * cell.packed
    assert int(pool[1]) == 4096  # --max-total-tokens
    assert (int(pool[4]), int(pool[5]), int(pool[6])) == (pages, 30, staged)


@pytest.mark.parametrize(
    "extra,message",
    [
        (("--max-running-requests", "8"), "--page-size is 1; start the server with --page-size 32"),
        (FLAGS[2:], "give it (e.g. --max-running-requests 64)"),
    ],
)
def test_kivi_profile_without_pages_or_bound_stops_startup_with_one_line(
    smollm2_dir, extra, message
):
    from sglang_server import cpu_env, free_port, server_argv

    argv = server_argv(smollm2_dir, free_port(), *FLAGS[:2], *extra)
    run = subprocess.run(
        argv, env=cpu_env(), capture_output=True, text=True, timeout=180, start_new_session=True
    )
    errors = [line for line in run.stderr.splitlines() if line.startswith("kvtuner: error")]
    detail = f"exit {run.returncode}, stderr tail:\n{run.stderr[-3000:]}"
    assert run.returncode == 2 and len(errors) == 1 and message in errors[0], detail
    assert "Traceback" not in run.stderr, detail
