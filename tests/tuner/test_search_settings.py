"""`SearchSettings` / `VllmSettings`: bad values stop with one KVTunerError line on construction
(before any model is loaded); good ones come out normalised (parsed budget, loaded preset,
sorted widths, paths, the study's storage beside the output)."""

import dataclasses
from pathlib import Path

import pytest

from kvtuner import KVTunerError
from kvtuner.cli.main import main
from kvtuner.search_spaces import SearchPreset
from kvtuner.tuner.budget import Budget
from kvtuner.tuner.pool import SearchSettings
from kvtuner.tuner.study import StudySettings
from kvtuner.tuner.vllm import VllmGoal, VllmSettings

BAD = [
    (dict(model=""), "--model must name a model"),
    (dict(budget="4"), "cannot read budget"),
    (dict(preset="nonesuch"), "unknown preset"),
    (dict(bits=(7,)), "bits must be among"),
    (dict(bits=()), "bits must be among"),
    (dict(confirm_samples=-1), "confirm_samples must be >= 0, got -1"),
    (dict(confirm_samples=1.5), "confirm_samples must be an integer"),
    (dict(num_samples=0), "--num-samples must be a positive integer, got 0"),
    (dict(seq_len=True), "--seq-len must be a positive integer, got True"),
    (dict(data_seed=-1), "--data-seed must be a non-negative integer"),
    (dict(num_clusters=0), "--num-clusters must be a positive integer"),
    (dict(context_length=0), "--context-length must be a positive integer"),
    (dict(batch_size=0), "--batch-size must be a positive integer, got 0"),
    (dict(device="tpu"), "device must be one of"),
    (dict(dtype="float64"), "dtype must be one of"),
    (dict(study=None), "study must be StudySettings"),
    (dict(sensitivity="missing.json"), "sensitivity file not found: missing.json"),
]


@pytest.mark.parametrize("bad,needle", BAD)
def test_bad_values_are_one_line(bad, needle, tmp_path):
    with pytest.raises(KVTunerError) as err:
        SearchSettings(**{"model": "m", "budget": "4bit", **bad})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_values_are_normalised_once(tmp_path):
    out = tmp_path / "run" / "p.json"
    s = SearchSettings(
        model="m", budget="3.5bits", output=str(out), bits=[4, 2, 4], pareto_dir="", plot="x.png"
    )
    assert s.budget == Budget.parse("3.5bit") and isinstance(s.preset, SearchPreset)
    assert s.bits == (2, 4) and s.output == out and s.pareto_dir is None
    assert s.plot == Path("x.png") and s.context == s.seq_len == 256
    assert s.study.storage == f"sqlite:///{out.with_suffix('.optuna.db')}"
    assert not out.parent.exists()  # settings write nothing
    given = StudySettings(storage="sqlite:///elsewhere.db")
    assert SearchSettings(model="m", budget="4bit", study=given).study == given
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seq_len = 1


def test_vllm_settings(tmp_path):
    goal = VllmGoal("fp8_e4m3", max_skip=2)
    s = VllmSettings(model="m", goal=goal, output=tmp_path / "v.json")
    assert s.study.n_trials == 12 and s.study.storage.endswith("v.optuna.db")
    for bad, needle in [
        (dict(goal="fp8"), "goal must be a VllmGoal"),
        (dict(num_samples=0), "--num-samples must be a positive integer"),
        (dict(confirm_samples=-2), "confirm_samples must be >= 0"),
        (dict(device="tpu"), "device must be one of"),
    ]:
        with pytest.raises(KVTunerError, match=needle):
            VllmSettings(**{"model": "m", "goal": goal, **bad})


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--num-samples", "0"], "--num-samples must be a positive integer"),
        (["--target", "vllm", "--kv-cache-dtype", "fp8", "--max-skip", "1", "--seq-len", "0"],
         "--seq-len must be a positive integer"),
        (["--confirm-seq-len", "-1"], "--confirm-seq-len must be a positive integer"),
        (["--target", "vllm", "--kv-cache-dtype", "fp8", "--confirm-metric", "nll"],
         "--confirm-metric and --confirm-seq-len are for --target pool"),
    ],
)  # fmt: skip
def test_cli_fills_the_settings_and_stops_on_bad_flags(flags, needle, tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["search", "--model", "m", "--budget", "4bit", "--output", str(out), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not tmp_path.joinpath("p.json").exists()
