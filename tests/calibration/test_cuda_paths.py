"""Every offline stage on a real GPU: placement, calibration, the search's trials and its
confirmation, eval and generate, against the same stages on the CPU.

Marked ``cuda``: skipped (with the reason) where torch sees no GPU; run ``pytest -m cuda``."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from calib_helpers import save_tiny

from kvtuner import LayerSpec, QuantSpec, search
from kvtuner.calibration import (
    calibrate,
    fp_reference,
    load_calibration_data,
    load_model,
    measure_kl,
)
from kvtuner.placement import Placement, placement
from kvtuner.tuner.study import StudySettings

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model", num_hidden_layers=3)


def test_auto_is_cuda_bf16():
    where = placement()
    assert where.device == f"cuda:{torch.cuda.current_device()}" and where.dtype == "bfloat16"
    assert placement("cuda", "float32") == Placement(where.device, "float32")
    assert where.describe()["device"].startswith(f"{where.device} (")  # names the GPU


def test_load_model_places_weights(tiny_dir):
    model, _ = load_model(str(tiny_dir))
    weight = next(model.parameters())
    assert weight.is_cuda and weight.dtype == torch.bfloat16
    cpu, _ = load_model(str(tiny_dir), device="cpu")
    assert next(cpu.parameters()).device.type == "cpu"


def test_calibration_and_kl_on_gpu_match_the_cpu(tiny_dir):
    runs = {}
    for device in ("cpu", "cuda"):
        model, tok = load_model(str(tiny_dir), device=device, dtype="float32")
        data = load_calibration_data(tok, num_samples=3, seq_len=64)
        torch.cuda.reset_peak_memory_stats()
        sens = calibrate(model, data, model_id="t", use_cache=False, progress=False, batch_size=2)
        ref = fp_reference(model, data.tokens, batch_size=2)
        specs = [LayerSpec(i, QuantSpec(4, 32), QuantSpec(2, 32)) for i in range(3)]
        runs[device] = (sens, measure_kl(model, data.tokens, specs, ref))
    (cpu_sens, cpu_kl), (gpu_sens, gpu_kl) = runs["cpu"], runs["cuda"]
    assert gpu_sens.data["device"].startswith("cuda:") and gpu_sens.data["dtype"] == "float32"
    # A KL below fp32's rounding of one log-probability (eps · ln V) is noise: the GPU sums
    # logits in another order (an H100 gave 6.22e-7 where the CPU gave 5.88e-7). Above it,
    # the two devices agree to 0.1 %.
    noise = torch.finfo(torch.float32).eps * math.log(model.config.vocab_size)
    assert math.isclose(cpu_kl, gpu_kl, rel_tol=1e-3, abs_tol=noise)
    for layer in range(3):
        for part in "kv":
            a, b = cpu_sens.kl(layer, part, 2), gpu_sens.kl(layer, part, 2)
            assert math.isclose(a, b, rel_tol=1e-3, abs_tol=noise)
    assert torch.cuda.max_memory_allocated() > 0


def test_search_on_gpu_then_resume_on_cpu(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KVTUNER_CACHE_DIR", str(tmp_path / "cache"))
    common = dict(
        model=str(tiny_dir),
        budget="4bit",
        output=tmp_path / "p.json",
        num_samples=2,
        seq_len=64,
        confirm_samples=2,
        study=StudySettings(n_trials=8),
        progress=False,
        log=lambda _: None,
        dtype="float32",
    )
    gpu = search(**common, device="cuda")
    assert gpu.profile.calibration["device"].startswith("cuda:")
    assert "peak GPU memory" in gpu.summary and "GiB" in gpu.summary
    cpu = search(**common, device="cpu")  # same study: resumed, no new trial
    assert cpu.trials == gpu.trials and cpu.profile.calibration["device"] == "cpu"


def test_cli_calibrate_eval_generate_on_gpu(tiny_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    text = tmp_path / "t.txt"
    text.write_text("Some calibration text for a tiny model on a GPU. " * 80)

    def kvtuner(*args):
        res = subprocess.run(
            [sys.executable, "-m", "kvtuner", *args], capture_output=True, text=True, env=env
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    out = kvtuner(
        "calibrate", "--model", str(tiny_dir), "--dataset", str(text), "--device", "cuda",
        "--batch-size", "1", "--num-samples", "2", "--seq-len", "64", "--no-cache",
        "--no-progress", "--output", str(tmp_path / "s.json"),
    )  # fmt: skip
    assert "on cuda:" in out and "in bfloat16" in out and "GiB" in out
    out = kvtuner(
        "eval", "--model", str(tiny_dir), "--dataset", str(text), "--uniform", "kv8",
        "--num-windows", "2", "--seq-len", "64", "--no-decode", "--device", "cuda",
    )  # fmt: skip
    assert "kv8" in out
    out = kvtuner(
        "generate", "hello", "--model", str(tiny_dir), "--uniform", "kv4", "--device", "cuda",
        "--max-new-tokens", "4", "--no-chat-template",
    )  # fmt: skip
    assert "KV cache:" in out
