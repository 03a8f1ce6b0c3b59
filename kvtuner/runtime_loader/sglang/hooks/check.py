"""Proof at start-up that the plugin's hooks took and the SGLang private names it reads exist.

SGLang's ``HookRegistry.apply_hooks`` only logs "Failed to apply hooks to ..." when a target is
missing, and starts the server anyway: a renamed ``_resolve_kv_pool_class`` would serve fp16 while
the cell-size hook sizes the pool at packed bytes. So, once SGLang has applied its plugins and a
profile is requested, every hook target must resolve and carry kvtuner's hook in its wrapper chain
(SGLang's wrappers keep the original in ``__wrapped__`` and the hook in their closure), and every
private name of :data:`PRIVATE_NAMES` must exist; otherwise one line names the first that does not.
"""

from __future__ import annotations

import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ....errors import KVTunerError

__all__ = [
    "PRIVATE_NAMES",
    "check_hooks",
    "check_private_names",
    "hook_took",
    "private_name_exists",
    "prove_hooks",
    "register_hooks",
    "resolve",
]

Hook = tuple[str, Callable, str]  # (dotted target, hook function, HookType name)
_registered: list[Hook] = []  # what this process handed SGLang's HookRegistry
_proven = False

_CONF = "sglang.srt.model_executor.pool_configurator"
# (owner, name): SGLang private attributes kvtuner reads or overrides, outside the hook targets.
# An owner's name counts when the class (or its bases) defines it or assigns ``self.<name>``.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator", "_kvcache"),
    (f"{_CONF}.HybridSWAPoolConfigurator", "_full_layers_num"),
    (f"{_CONF}.HybridSWAPoolConfigurator", "_swa_layers_num"),
    (f"{_CONF}.HybridSWAPoolConfigurator", "_full_per_token"),
    (f"{_CONF}.HybridSWAPoolConfigurator", "_swa_per_token"),
    ("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator", "_page_major_enabled"),
    ("sglang.srt.distributed.parallel_state", "_group_coordinator_device"),
    ("sglang.srt.layers.rotary_embedding.RotaryEmbedding", "_compute_inv_freq"),
    # the pool and the host pool override or call these parent internals
    ("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool", "_create_buffers"),
    ("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool", "_build_kv_buffer_descs"),
    ("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool", "_init_data_ptrs_and_strides"),
    ("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool", "_kv_buffer_descs"),
    ("sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost", "_initialize_transfer_views"),
    ("sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost", "_transfer_device"),
    ("torch._utils", "_element_size"),
)


def resolve(dotted: str) -> Any:
    """The object at ``dotted`` (module, class, function, attribute); one line if it is gone."""
    try:
        return pkgutil.resolve_name(dotted)
    except (ImportError, AttributeError, ValueError) as exc:
        raise KVTunerError(
            f"SGLang has no {dotted} ({type(exc).__name__}): kvtuner cannot serve on this SGLang"
        ) from None


def _wrapper_chain(fn: Any) -> Iterator[Any]:
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        yield fn
        fn = getattr(fn, "__wrapped__", None)


def _closure_holds(fn: Any, hook: Callable) -> bool:
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            if cell.cell_contents is hook:
                return True
        except ValueError:  # an empty cell
            continue
    return False


def hook_took(target: str, hook: Callable) -> bool:
    """Whether ``target`` resolves and ``hook`` is in its wrapper chain."""
    owner_path, name = target.rsplit(".", 1)
    attr = getattr(resolve(owner_path), name, None)
    attr = getattr(attr, "__func__", attr)  # a classmethod, bound
    return any(_closure_holds(fn, hook) for fn in _wrapper_chain(attr))


def check_hooks(hooks: Sequence[tuple[str, Callable, str]]) -> None:
    """One line naming the first hook target that is missing or not wrapped by its hook."""
    for target, hook, _kind in hooks:
        owner_path, name = target.rsplit(".", 1)
        if not hasattr(resolve(owner_path), name):
            raise KVTunerError(f"SGLang has no {target}: the kvtuner hook on it cannot apply")
        if not hook_took(target, hook):
            raise KVTunerError(
                f"the kvtuner hook on {target} did not apply (see SGLang's 'Failed to apply "
                f"hooks' log line): refusing to serve"
            )


def _assigned_in_source(cls: type, name: str) -> bool:
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]*)?=(?!=)")
    for klass in cls.__mro__:
        try:
            if pattern.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):  # builtins, classes without source
            continue
    return False


def private_name_exists(owner_path: str, name: str) -> bool:
    owner = resolve(owner_path)
    if hasattr(owner, name):
        return True
    return isinstance(owner, type) and _assigned_in_source(owner, name)


def check_private_names(names: Sequence[tuple[str, str]] = PRIVATE_NAMES) -> None:
    """One line naming the first private SGLang name kvtuner reads that is gone."""
    for owner_path, name in names:
        if not private_name_exists(owner_path, name):
            raise KVTunerError(
                f"SGLang has no {owner_path}.{name}, which kvtuner reads: refusing to serve"
            )


def register_hooks(hooks: Sequence[Hook]) -> None:
    """Hand ``hooks`` to SGLang's ``HookRegistry`` (applied by its ``load_plugins``) and keep
    them for :func:`prove_hooks`."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in hooks:
        HookRegistry.register(target, hook, HookType[kind])
    _registered.extend(hooks)


def prove_hooks() -> None:
    """Every registered hook took and every private name kvtuner reads exists (once per
    process, after SGLang applied the plugins)."""
    global _proven
    if _proven:
        return
    if not _registered:
        raise KVTunerError("the kvtuner SGLang plugin registered no hooks in this process")
    check_hooks(_registered)
    check_private_names()
    _proven = True
