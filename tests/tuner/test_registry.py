"""The search targets' registry: pool, vllm and recipe, each a `Target` with every stage; one
driver runs any target's stages in order; `kvtuner.search` dispatches by name and refuses an
unknown one in one line."""

import pytest

import kvtuner
from kvtuner import KVTunerError
from kvtuner.tuner.pool import SearchSettings
from kvtuner.tuner.recipe import RecipeSettings
from kvtuner.tuner.registry import TARGETS, target_named
from kvtuner.tuner.target import STAGES, SearchRun, Target
from kvtuner.tuner.vllm import VllmSettings


def test_the_registry_holds_every_target_with_every_stage():
    assert list(TARGETS) == ["pool", "vllm", "recipe"]
    for name, target in TARGETS.items():
        assert isinstance(target, Target) and target.name == name and target.help
        for stage in STAGES:
            assert callable(getattr(target, stage)), f"{name}: {stage}"
        assert target_named(name) is target


def test_an_unknown_target_is_one_line_naming_the_choices(tmp_path):
    with pytest.raises(KVTunerError) as err:
        kvtuner.search(target="nope", model="m", budget="4bit", output=tmp_path / "p.json")
    message = str(err.value)
    assert "'nope'" in message and "pool, vllm, recipe" in message and "\n" not in message
    assert not (tmp_path / "p.json").exists()


def test_each_settings_stage_builds_its_record_from_keywords(tmp_path):
    out = tmp_path / "p.json"
    pool = TARGETS["pool"].settings(model="m", budget="4bit", output=out, study=None)
    vllm = TARGETS["vllm"].settings(model="m", kv_cache_dtype="fp8_e4m3", budget="0.75x",
                                    n_trials=3, output=out)  # fmt: skip
    recipe = TARGETS["recipe"].settings(model="m", engine="trtllm", budget="6bit", output=out)
    assert isinstance(pool, SearchSettings) and pool.study.n_trials == 40
    assert isinstance(vllm, VllmSettings) and vllm.study.n_trials == 3
    assert vllm.goal.budget.label == "0.75x" and vllm.study.storage.endswith("p.optuna.db")
    assert isinstance(recipe, RecipeSettings) and recipe.goal.engine == "trtllm"
    with pytest.raises(KVTunerError, match="needs kv_cache_dtype"):
        TARGETS["vllm"].settings(model="m", max_skip=1)
    with pytest.raises(KVTunerError, match="needs a budget"):
        TARGETS["recipe"].settings(model="m")


def test_a_target_runs_only_its_own_settings(tmp_path):
    vllm = TARGETS["vllm"].settings(model="m", kv_cache_dtype="fp8_e4m3", max_skip=1)
    with pytest.raises(KVTunerError, match="target pool runs SearchSettings, got VllmSettings"):
        TARGETS["pool"].run(vllm)


def test_the_driver_runs_the_stages_in_order_each_seeing_what_came_before():
    def stage(name):
        return lambda run, *before: (name, before[-1][0] if before else run.settings)

    toy = Target("toy", str, "a target of strings", str,
                 *(stage(name) for name in STAGES[1:]))  # fmt: skip
    outcome = toy.search(object="asked", log=lambda _: None)
    assert outcome == ("export", "profile")
    seen: list[tuple[str, int]] = []

    def record(name):
        def run_stage(run: SearchRun, *before):
            seen.append((name, len(before)))
            return name

        return run_stage

    Target("order", str, "", str, *(record(n) for n in STAGES[1:])).run("s", progress=False)
    assert seen == [("prepare", 0), ("candidates", 1), ("measure", 2), ("choose", 3),
                    ("profile", 3), ("export", 4)]  # fmt: skip


def test_a_target_with_a_missing_stage_is_refused():
    with pytest.raises(KVTunerError, match=r"stages \['export'\] are not callable"):
        Target("broken", str, "", str, *([print] * 5), None)
