"""The start-up hook check against the installed SGLang: every hook target and private name
kvtuner uses resolves, SGLang's own plugin loading wraps every target, and a target SGLang no
longer has stops the real launcher with one line (before any model is loaded)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvtuner.errors import KVTunerError

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

from kvtuner.runtime_loader.sglang.hooks.check import (  # noqa: E402
    PRIVATE_NAMES,
    check_hooks,
    check_private_names,
    hook_took,
    private_name_exists,
    resolve,
)
from kvtuner.runtime_loader.sglang.hooks.table import HOOKS as _HOOKS  # noqa: E402

LAUNCH_TIMEOUT = 240
POOL_CLASS = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"


@pytest.mark.parametrize("target", [t for t, _, _ in _HOOKS])
def test_every_hook_target_resolves(target):
    owner, name = target.rsplit(".", 1)
    assert hasattr(resolve(owner), name), target


@pytest.mark.parametrize(("owner", "name"), PRIVATE_NAMES)
def test_every_private_name_exists(owner, name):
    assert private_name_exists(owner, name), f"{owner}.{name}"


def test_renamed_names_fail_with_one_line():
    renamed = [(f"{POOL_CLASS}._resolve_kv_pool_class_v2", _HOOKS[3][1], "AROUND")]
    with pytest.raises(KVTunerError, match=r"_resolve_kv_pool_class_v2") as info:
        check_hooks(renamed)
    assert "\n" not in str(info.value)
    with pytest.raises(KVTunerError, match=r"MHATokenToKVPool\._create_buffers_v2"):
        check_private_names(
            [("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool", "_create_buffers_v2")]
        )
    with pytest.raises(KVTunerError, match=r"no sglang\.srt\.no_such_module"):
        resolve("sglang.srt.no_such_module.Thing")


def test_an_unapplied_hook_is_seen():
    """In this process nothing applied kvtuner's hooks (SGLang's loader runs in the server)."""
    target, hook, _ = _HOOKS[3]
    assert not hook_took(target, hook)
    with pytest.raises(KVTunerError, match=r"did not apply"):
        check_hooks([_HOOKS[3]])


def _launch(tmp_path, prelude: str) -> subprocess.CompletedProcess:
    """The real ``sglang.launch_server`` main (SGLang's ``load_plugins`` then its argument
    parsing) with ``--kvtuner-profile``, after ``prelude``; it stops in the hook check or at the
    model path, which does not exist, before anything is loaded."""
    from sglang_server import cpu_env

    profile = tmp_path / "p.json"
    profile.write_text("{}")
    code = (
        f"{prelude}\nimport runpy, sys\n"
        f"sys.argv = ['launch_server', '--model-path', {str(tmp_path / 'no-model')!r}, "
        f"'--kvtuner-profile', {str(profile)!r}]\n"
        "runpy.run_module('sglang.launch_server', run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=cpu_env(SGLANG_PLUGINS="kvtuner"),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
    )


def test_hooks_proven_then_the_profile_is_read(tmp_path):
    """All hooks took: the launcher gets past the check to the profile (here an empty one)."""
    done = _launch(tmp_path, "")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, done.stderr[-3000:]
    assert last.startswith("kvtuner: error:") and "did not apply" not in last, last
    assert "SGLang has no" not in last, last


def test_renamed_target_stops_the_launcher_with_one_line(tmp_path):
    """An SGLang that renamed ``_resolve_kv_pool_class``: SGLang only logs "Failed to apply
    hooks"; kvtuner's check exits 2 with one line naming the target."""
    rename = (
        f"import pkgutil\ncls = pkgutil.resolve_name({POOL_CLASS!r})\n"
        "cls._resolve_kv_pool_class_v2 = cls._resolve_kv_pool_class\n"
        "del cls._resolve_kv_pool_class"
    )
    done = _launch(tmp_path, rename)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"kvtuner: error: SGLang has no {POOL_CLASS}._resolve_kv_pool_class: "
        "the kvtuner hook on it cannot apply"
    )
    assert done.stderr.count("kvtuner: error:") == 1  # SGLang's own log keeps its traceback
