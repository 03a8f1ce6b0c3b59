"""`--device` / `--dtype` on every command that runs a model: one line and exit 2 when wrong."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

COMMANDS = {
    "calibrate": ["--output", "s.json"],
    "search": ["--model", "smollm2-135m", "--budget", "4bit"],
    "eval": ["--uniform", "kv4"],
    "generate": ["hello", "--uniform", "kv4"],
}


def kvtuner(*args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kvtuner", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def one_line_exit_2(run, message: str) -> None:
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cuda_request_without_cuda(command, tmp_path):
    run = kvtuner(command, *COMMANDS[command], "--device", "cuda", cwd=tmp_path)
    one_line_exit_2(run, f"kvtuner {command}: error: --device cuda: no CUDA device is visible")
    assert not list(tmp_path.iterdir())  # nothing written, nothing loaded


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_device_and_dtype(command, tmp_path):
    run = kvtuner(command, *COMMANDS[command], "--device", "tpu", cwd=tmp_path)
    one_line_exit_2(run, "device must be one of auto, cpu, cuda, cuda:N, got 'tpu'")
    run = kvtuner(command, *COMMANDS[command], "--dtype", "float64", cwd=tmp_path)
    one_line_exit_2(run, "argument --dtype: invalid choice: 'float64'")


@pytest.mark.parametrize("command", ["calibrate", "search"])
def test_bad_batch_size(command, tmp_path):
    run = kvtuner(command, *COMMANDS[command], "--batch-size", "0", cwd=tmp_path)
    one_line_exit_2(run, "--batch-size must be a positive integer, got 0")
