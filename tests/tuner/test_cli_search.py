"""`kvtuner search` bad input: one line on stderr, exit code 2, before any model is loaded."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--budget", "4"], "cannot read budget"),
        (["--budget", "0.3"], "cannot read budget"),
        (["--budget", "4bit", "--preset", "nonesuch"], "unknown preset"),
        (["--budget", "4bit", "--n-trials", "-3"], "--n-trials"),
        (["--budget", "4bit", "--timeout", "0"], "--timeout"),
        (["--budget", "4bit", "--storage", "kvtuner.db"], "--storage"),
        (["--budget", "4bit", "--n-trials", "many"], "invalid int"),
        (["--budget", "4bit", "--sampler", "grid"], "invalid choice"),
    ],
)
def test_cli_errors_are_one_line_exit_2(tmp_path, args, needle):
    if "--model" not in args:
        args = ["--model", "smollm2-135m", *args]
    proc = subprocess.run(
        [sys.executable, "-m", "kvtuner", "search", *args, "--output", str(tmp_path / "p.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "p.json").exists()
