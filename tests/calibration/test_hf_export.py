"""`kvtuner export-hf`: a GGUF alias becomes the plain HF folder SGLang serves; two processes
exporting the same model at once both succeed (the loser uses the winner's folder)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvtuner.models.converted import ENV_VAR

EXPORT_TIMEOUT = 600


def _export(*args: str) -> subprocess.Popen:
    # each converts the GGUF (no converted copy read): seconds before either renames
    env = {**os.environ, "OMP_NUM_THREADS": "1", ENV_VAR: "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "kvtuner", "export-hf", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_output_that_is_not_a_model_folder_is_one_line(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    done = _export("--model", "smollm2-135m", "--output", str(tmp_path / "out"))
    out, err = done.communicate(timeout=EXPORT_TIMEOUT)
    assert done.returncode == 2, err
    line = f"--output {tmp_path / 'out'} exists and is not an HF model folder"
    assert err.strip() == f"kvtuner export-hf: error: {line}"
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_two_processes_export_the_same_model_at_once(tmp_path):
    """Both load the GGUF for seconds before either renames, so both pass the "already there"
    check and race on the rename: one writes, the other uses its folder, neither fails."""
    pytest.importorskip("gguf")
    out = tmp_path / "smollm2-hf"
    procs = [_export("--model", "smollm2-135m", "--output", str(out)) for _ in range(2)]
    results = [p.communicate(timeout=EXPORT_TIMEOUT) for p in procs]
    for proc, (_, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr[-2000:]
    lines = sorted(stdout.strip() for stdout, _ in results)
    assert lines == [
        f"kvtuner export-hf: using the existing HF folder {out}",
        f"kvtuner export-hf: wrote HF folder {out}",
    ]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert any(out.glob("*.safetensors"))
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-hf"]  # no temp folder left
