"""`kvtuner search` bad input: one line on stderr, exit code 2, before any model is loaded."""

import subprocess
import sys

import pytest

from kvtuner.cli.main import main

CASES = [
    (["--budget", "4"], "cannot read budget"),
    (["--budget", "0.3"], "cannot read budget"),
    (["--budget", "4bit", "--preset", "nonesuch"], "unknown preset"),
    (["--budget", "4bit", "--n-trials", "-3"], "--n-trials"),
    (["--budget", "4bit", "--timeout", "0"], "--timeout"),
    (["--budget", "4bit", "--storage", "kvtuner.db"], "--storage"),
    (["--budget", "4bit", "--n-trials", "many"], "invalid int"),
    (["--budget", "4bit", "--sampler", "grid"], "invalid choice"),
    (["--budget", "4bit", "--confirm-samples", "-1"], "confirm_samples must be >= 0"),
    (["--budget", "4bit", "--model", "/nonexistent/model/dir"], "error"),
]


def exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return exc.code


@pytest.mark.parametrize("args,needle", CASES)
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, args, needle):
    if "--model" not in args:
        args = ["--model", "smollm2-135m", *args]
    code = exit_code(["search", *args, "--output", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "p.json").exists()


def test_no_traceback_through_the_real_entry_point(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtuner",
            "search",
            "--model",
            "smollm2-135m",
            "--budget",
            "1.5bit",
            "--sensitivity",
            str(tmp_path / "missing.json"),
            "--output",
            str(tmp_path / "p.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
