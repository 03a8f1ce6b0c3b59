"""End to end on this CPU: the real ``python -m sglang.launch_server --kvtuner-profile`` serving
SmolLM2-135M with an 8-bit profile (one server for the module, always shut down)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tiny_profiles import model_profile

from kvtuner.profile import ModelFingerprint, Profile, save_profile
from kvtuner.quant import QuantSpec
from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

HELP_TIMEOUT = 180


@pytest.fixture(scope="module")
def smollm2_dir():
    from sglang_server import smollm2_hf_dir

    return smollm2_hf_dir()


@pytest.fixture(scope="module")
def profile8(smollm2_dir, tmp_path_factory):
    profile = model_profile(smollm2_dir, QuantSpec(8), QuantSpec(8))
    path = tmp_path_factory.mktemp("profiles") / "smollm2-kv8.json"
    save_profile(profile, path)
    return profile, path


@pytest.fixture(scope="module")
def server(smollm2_dir, profile8, tmp_path_factory):
    from sglang_server import SGLangServer

    log = tmp_path_factory.mktemp("logs") / "server.log"
    srv = SGLangServer(smollm2_dir, "--kvtuner-profile", str(profile8[1]), log_path=log)
    with srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def test_greedy_chat_answer_mentions_paris(client):
    reply = client.chat.completions.create(
        model="default",
        temperature=0,
        max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in reply.choices[0].message.content


def test_completion_and_stream(client):
    done = client.completions.create(
        model="default", prompt="The three primary colors are", temperature=0, max_tokens=16
    )
    assert done.choices[0].text.strip() and done.usage.completion_tokens > 0
    chunks = client.chat.completions.create(
        model="default",
        temperature=0,
        max_tokens=16,
        stream=True,
        messages=[{"role": "user", "content": "Count from 1 to 5."}],
    )
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len(pieces) > 3 and "2" in "".join(pieces)


def test_running_pool_is_ours_with_the_predicted_bytes_and_capacity(server, profile8):
    profile = profile8[0]
    log = server.log_text()
    # torch_native attention (the CPU server's backend) reads lazily: the cell is packed bytes only
    cell = cell_size(
        profile, heads=3, start_layer=0, num_layers=30, dtype_bytes=4, read_mode="lazy"
    )
    sizing = re.search(
        r"kvtuner: KV cell size (\d+) B/token \(packed (\d+) \+ read scratch (\d+) \+ pre-RoPE "
        r"positions 0, lazy reads\) instead of SGLang's (\d+) B/token",
        log,
    )
    assert sizing and int(sizing[1]) == cell.total == cell.packed == int(sizing[2])
    assert int(sizing[3]) == 0
    assert int(sizing[4]) == 30 * 3 * 2 * 64 * 4  # the stock fp32 pool's cell
    pool = re.search(
        r"kvtuner pool: profile (\w+), layers 0\.\.29 of 30, #tokens: (\d+), rows: (\d+), "
        r"packed KV bytes: (\d+) .* read mode (\w+), dequant scratch bytes: (\d+)",
        log,
    )
    assert pool and pool[1] == profile.hash
    tokens, rows, packed = int(pool[2]), int(pool[3]), int(pool[4])
    assert packed == rows * cell.packed and (pool[5], pool[6]) == ("lazy", "0")
    served = re.search(r"max_total_num_tokens=(\d+)", log)  # SGLang's own scheduler line
    assert served and int(served[1]) == tokens == 4096


def test_mismatched_profile_stops_startup_with_one_line(smollm2_dir, tmp_path):
    from sglang_server import cpu_env, free_port, server_argv

    wrong = Profile.uniform(
        "other", ModelFingerprint("LlamaForCausalLM", 30, 4, 64), QuantSpec(8), QuantSpec(8)
    )
    save_profile(wrong, tmp_path / "wrong.json")
    for flag, message in (
        (tmp_path / "wrong.json", "num_kv_heads is 4 in the profile but 3"),
        (tmp_path / "missing.json", "profile not found"),
    ):
        argv = server_argv(smollm2_dir, free_port(), "--kvtuner-profile", str(flag))
        run = subprocess.run(
            argv,
            env=cpu_env(),
            capture_output=True,
            text=True,
            timeout=HELP_TIMEOUT,
            start_new_session=True,
        )
        errors = [line for line in run.stderr.splitlines() if line.startswith("kvtuner: error")]
        detail = f"exit {run.returncode}, stderr tail:\n{run.stderr[-3000:]}"
        assert run.returncode == 2 and len(errors) == 1 and message in errors[0], detail
        assert "Traceback" not in run.stderr, detail


@pytest.mark.parametrize(
    "module,plugins_disabled,listed",
    [
        ("sglang.launch_server", False, True),
        ("sglang.launch_server", True, False),
        ("kvtuner.runtime_loader.sglang.launch_server", True, True),  # the fallback launcher
        ("kvtuner.cli.main serve", True, True),  # `kvtuner serve` execs the fallback launcher
    ],
)
def test_help_lists_the_flag_and_the_fallback_launcher_needs_no_plugins(
    module, plugins_disabled, listed
):
    from sglang_server import cpu_env

    # SGLANG_PLUGINS naming another plugin disables ours
    env = cpu_env(SGLANG_PLUGINS="none-such") if plugins_disabled else cpu_env()
    run = subprocess.run(
        [sys.executable, "-m", *module.split(), "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT,
    )
    assert run.returncode == 0
    # SGLang's own parser lists the flag (`kvtuner serve --help` also prints kvtuner's usage)
    assert ("[--kvtuner-profile PATH]" in run.stdout) is listed
