"""Supported SGLang versions are stated; other versions fail with one clear line."""

from __future__ import annotations

import pytest

from kvtuner.errors import KVTunerError
from kvtuner.runtime_loader.sglang import SUPPORTED_SGLANG, check_sglang_version

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed


@pytest.mark.parametrize("version", ["0.5.23", "0.5.23.post1", "0.5.30rc1", "0.5.99"])
def test_supported_versions_pass(version):
    assert check_sglang_version(version) == version


@pytest.mark.parametrize("version", ["0.5.22", "0.5.11", "0.6.0", "1.0", "0.4.99", "nightly"])
def test_other_versions_fail_with_one_line(version):
    with pytest.raises(KVTunerError, match=r"not supported") as info:
        check_sglang_version(version)
    assert "\n" not in str(info.value) and SUPPORTED_SGLANG in str(info.value)


def test_installed_version_is_supported():
    import sglang

    assert check_sglang_version() == sglang.__version__
