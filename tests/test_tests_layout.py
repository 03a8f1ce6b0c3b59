"""The test tree never shadows a package: pytest's default (prepend) import mode puts every folder
that holds test files on ``sys.path``, so a subfolder there named like an installed package (a
``vllm/`` beside ``test_*.py`` files) becomes an importable namespace package of that name, and
code that asks ``importlib.util.find_spec("vllm")`` sees vLLM where none is installed."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGES = {"sglang", "vllm", "torch", "triton", "transformers", "optuna", "datasets", "kvtuner"}


def shadowing_folders(root: Path) -> list[str]:
    """Folders under ``root`` named like a package, whose parent holds test files."""
    return sorted(
        str(d.relative_to(root))
        for d in root.rglob("*")
        if d.is_dir() and d.name in PACKAGES and any(d.parent.glob("test_*.py"))
    )


def test_shadowing_folders_sees_one(tmp_path):
    (tmp_path / "a" / "vllm").mkdir(parents=True)
    (tmp_path / "a" / "test_x.py").write_text("")
    (tmp_path / "b" / "vllm").mkdir(parents=True)  # no test file beside it: never on sys.path
    assert shadowing_folders(tmp_path) == ["a/vllm"]


def test_no_test_folder_shadows_a_package():
    assert shadowing_folders(TESTS) == []
