"""The supported SGLang version is the one run (0.5.23); another fails with one clear line, or
warns and goes on with KVTUNER_SGLANG_UNTESTED=1."""

from __future__ import annotations

import pytest

from kvtuner.errors import KVTunerError
from kvtuner.runtime_loader.sglang import SUPPORTED_SGLANG, check_sglang_version
from kvtuner.runtime_loader.sglang.hooks.version import UNTESTED_ENV_VAR

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

OTHER = [
    "0.5.24",
    "0.5.30rc1",
    "0.5.99",
    "0.5.23rc1",
    "0.5.22",
    "0.5.11",
    "0.6.0",
    "1.0",
    "nightly",
]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.23.post1"])
def test_supported_versions_pass(version, monkeypatch):
    monkeypatch.delenv(UNTESTED_ENV_VAR, raising=False)
    assert check_sglang_version(version) == version


@pytest.mark.parametrize("version", OTHER)
def test_other_versions_fail_with_one_line(version, monkeypatch):
    monkeypatch.delenv(UNTESTED_ENV_VAR, raising=False)
    with pytest.raises(KVTunerError, match=r"not supported") as info:
        check_sglang_version(version)
    assert "\n" not in str(info.value) and SUPPORTED_SGLANG in str(info.value)
    assert UNTESTED_ENV_VAR in str(info.value)


@pytest.mark.parametrize("version", ["0.5.24", "0.6.0"])
def test_untested_versions_warn_and_go_on(version, monkeypatch, caplog):
    monkeypatch.setenv(UNTESTED_ENV_VAR, "1")
    assert check_sglang_version(version) == version
    assert f"sglang {version} is not supported" in caplog.text


def test_installed_version_is_supported():
    import sglang

    assert check_sglang_version() == sglang.__version__
