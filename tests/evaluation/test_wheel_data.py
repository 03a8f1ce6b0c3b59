"""`kvtuner eval` from a built wheel, run outside any checkout: its default data ships inside."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "calibration"))
from calib_helpers import save_tiny  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_embedded_test_split_is_the_shared_file():
    from kvtuner.calibration.corpus import read_corpus
    from kvtuner.evaluation.data import SHARED_TEST_FILE, embedded_test_text

    if not SHARED_TEST_FILE.is_file():
        pytest.skip(f"no {SHARED_TEST_FILE} beside this checkout to compare with")
    assert embedded_test_text() == read_corpus(str(SHARED_TEST_FILE))[0]


def test_eval_runs_from_an_unpacked_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    site = tmp_path / "site"
    with zipfile.ZipFile(next(wheels.glob("kvtuner-*.whl"))) as whl:
        whl.extractall(site)
    assert (site / "kvtuner" / "evaluation" / "data" / "wikitext2_test.txt.gz").is_file()
    model = save_tiny(tmp_path / "tiny")
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = (
        "import kvtuner, sys; from kvtuner.cli.main import main; "
        f"assert kvtuner.__file__.startswith({str(site)!r}), kvtuner.__file__; "
        f"sys.exit(main(['eval', '--model', {str(model)!r}, '--uniform', 'kv4', "
        "'--num-windows', '1', '--seq-len', '64', '--no-decode', '--hf-quanto', 'off', "
        "'--no-progress']))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kv4" in done.stdout
