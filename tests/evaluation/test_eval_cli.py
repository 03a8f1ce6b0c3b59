"""`kvtuner eval` / `kvtuner generate` input errors: one line, exit 2, before loading weights."""

from __future__ import annotations

import pytest
from conftest import tiny_model

from kvtuner import ModelFingerprint, Profile, QuantSpec, save_profile
from kvtuner.cli.main import main


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(path)
    return path


def run_err(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    return err


def test_eval_needs_something_to_evaluate(capsys):
    assert "nothing to evaluate" in run_err(["eval", "--model", "x"], capsys)


def test_eval_rejects_unknown_uniform_names(tiny_dir, capsys):
    err = run_err(["eval", "--model", str(tiny_dir), "--uniform", "kv8,kv7"], capsys)
    assert "unknown uniform config 'kv7'" in err


def test_eval_rejects_a_profile_for_another_model(tiny_dir, tmp_path, capsys):
    other = ModelFingerprint("LlamaForCausalLM", 5, 2, 32)
    path = save_profile(
        Profile.uniform("other", other, QuantSpec(4), QuantSpec(4)), tmp_path / "p.json"
    )
    err = run_err(["eval", "--model", str(tiny_dir), "--profile", str(path)], capsys)
    assert "does not fit the model" in err and "num_layers" in err


def test_eval_rejects_a_missing_profile_file(tiny_dir, tmp_path, capsys):
    err = run_err(
        ["eval", "--model", str(tiny_dir), "--profile", str(tmp_path / "no.json")], capsys
    )
    assert "not found" in err


def test_generate_rejects_bad_arguments(tiny_dir, capsys):
    assert "max-new-tokens" in run_err(
        ["generate", "--model", str(tiny_dir), "--uniform", "kv4", "--max-new-tokens", "0", "hi"],
        capsys,
    )
    assert "unknown uniform" in run_err(
        ["generate", "--model", str(tiny_dir), "--uniform", "kv7", "hi"], capsys
    )
