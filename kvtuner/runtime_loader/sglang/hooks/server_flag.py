"""``--kvtuner-profile PATH``: the launcher-side hooks on SGLang's server arguments.

- ``ServerArgs.add_cli_args`` (after, :func:`add_flag`): adds the flag.
- ``ServerArgs.from_cli_args`` (after, :func:`take_flag`): makes the path absolute, exports it to
  child processes (``KVTUNER_PROFILE``) and checks the profile against the model's config before
  anything starts; a bad profile prints one line and exits 2.

Both run after SGLang applied the plugins' hooks, so they prove them first (:mod:`.check`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn

from ....errors import KVTunerError
from ....profile import ModelFingerprint
from ..pool.lazy_reads.decode_cache import DEFAULT_DECODE_CACHE_TOKENS
from ..pool.refusals import check_profile_servable, check_staging_bound
from .backend_choice import choose_packed_backend
from .check import prove_hooks
from .profile_env import ENV_VAR, activate, active_profile

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_ENV_VAR",
    "FLAG",
    "add_flag",
    "decode_cache_tokens",
    "die",
    "flag_requested",
    "take_flag",
]

FLAG = "--kvtuner-profile"
CACHE_ENV_VAR = "KVTUNER_DECODE_CACHE_TOKENS"


def die(exc: KVTunerError) -> NoReturn:
    print(f"kvtuner: error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def flag_requested() -> bool:
    """``--kvtuner-profile`` on this process's command line, or a profile in the environment."""
    return bool(os.environ.get(ENV_VAR)) or any(
        a == FLAG or a.startswith(FLAG + "=") for a in sys.argv
    )


def decode_cache_tokens() -> int:
    """Decode-cache bound of the lazy mode (tokens per layer), from the environment."""
    raw = os.environ.get(CACHE_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_DECODE_CACHE_TOKENS
    if not raw.isdigit():
        raise KVTunerError(f"{CACHE_ENV_VAR} must be a whole number of tokens >= 0, got {raw!r}")
    return int(raw)


def add_flag(result: Any, parser: Any) -> None:
    if flag_requested():  # the launcher, after SGLang applied the plugins' hooks
        try:
            prove_hooks()
        except KVTunerError as exc:
            die(exc)
    group = parser.add_argument_group("kvtuner")
    group.add_argument(
        FLAG,
        type=str,
        default=None,
        metavar="PATH",
        help="Serve with the per-layer quantized KV pool of this kvtuner profile "
        "(JSON). Multi-node: the same path on every node.",
    )


def _model_fingerprint(server_args: Any) -> ModelFingerprint | None:
    """The served model's shape facts from its HF config; None if it cannot be read here
    (the scheduler checks again against the config it loads)."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(
            server_args.model_path, trust_remote_code=bool(server_args.trust_remote_code)
        )
    except (OSError, ValueError) as exc:
        logger.warning("kvtuner: model config not readable before start-up (%s)", exc)
        return None
    return ModelFingerprint.from_config(config)


def take_flag(server_args: Any, cls: Any, args: Any) -> None:
    path = getattr(args, "kvtuner_profile", None)
    if path is None:
        return
    try:
        prove_hooks()
        decode_cache_tokens()
        activate(path)
        profile = active_profile()
        check_profile_servable(profile, server_args.page_size)
        check_staging_bound(profile, server_args.max_running_requests)
        fingerprint = _model_fingerprint(server_args)
        if fingerprint is not None:
            profile.check_model(fingerprint)
        choose_packed_backend(server_args)
    except KVTunerError as exc:
        die(exc)
    logger.info(
        "kvtuner: serving with profile %s (hash %s, %.2f nominal bits)",
        os.environ[ENV_VAR],
        profile.hash,
        profile.nominal_bits,
    )
